package flags

import "github.com/throttlekit/throttlekit/throttler"

// Enforcement returns r as a policy's enforcement (throttler.Policy.EnforcedBy):
// the keys r puts on its new side are enforced, the others run the policy in
// dry run. Any of this package's sources, or flags/unleash's, will do, with
// their sticky bucketing: at 0% the policy is a pure dry run, at 100%
// enforced for every key; raising the percentage only adds keys, so no
// enforced key is ever released, and lowering it takes effect on the next
// call. Give the rollout a group of its own (NewPercentFor, the Unleash
// feature's name), so that which keys a limit is enforced for does not
// follow which keys a migration moved.
//
// A nil rollout, or a nil pointer in one, is an error.
func Enforcement(r Rollout) (throttler.Enforcer, error) {
	if err := requiredRollout("flags: Enforcement's rollout", r); err != nil {
		return nil, err
	}
	return enforcement{r}, nil
}

type enforcement struct{ r Rollout }

func (e enforcement) Enforced(key string) bool { return e.r.UseNew(key) }
