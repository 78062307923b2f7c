package unleash

import (
	"errors"
	"fmt"
	"sync/atomic"

	unleashsdk "github.com/Unleash/unleash-client-go/v4"

	"github.com/throttlekit/throttlekit/flags"
)

// PercentSource is a Source read as one percentage (a flags.Percenter), so
// that package migration can tell which keys a change of the feature moves
// and send their calls to both stores while they settle (docs/migration.md,
// "Moving keys"); a plain Source routes as Unleash says but cannot tell
// that, so a migration over it hands a moved key the new store's state at
// once.
//
// The feature must read as one whole percentage of keys bucketed in Group:
//   - disabled, or unknown to the client: 0;
//   - enabled with no strategy, or the "default" strategy without
//     conditions: 100;
//   - one flexibleRollout on userId (or default stickiness), without
//     constraints, segments or variants, whose groupId is Group (a rollout
//     of 0 or 100 may have any groupId): its rollout.
//
// Anything else (several strategies, conditions, another groupId, a
// fraction of a percent) cannot be routed by a percentage: the source then
// keeps routing by the last percentage it could read (0 before any) and
// Problem says why, so that a change made in Unleash's UI that the
// migration cannot follow is never applied to half the fleet silently.
type PercentSource struct {
	s       *Source
	bucket  flags.Bucketer
	last    atomic.Int64 // the last percentage read
	ignored atomic.Pointer[string]
}

var (
	_ flags.Percenter = (*PercentSource)(nil)
	_ flags.Mirrorer  = (*PercentSource)(nil)
)

// PercentOptions configure a PercentSource.
type PercentOptions struct {
	Options
	// Group is the bucketing group the feature's flexibleRollout must use,
	// Unleash's groupId. It never changes while the source lives (moving
	// keys are computed in it). default: the feature's name, which is
	// Unleash's own default groupId
	Group string
}

// NewPercent returns a PercentSource over feature (see New for c, feature
// and the options they share).
func NewPercent(c *unleashsdk.Client, feature string, opts *PercentOptions) (*PercentSource, error) {
	var o PercentOptions
	if opts != nil {
		o = *opts
	}
	s, err := New(c, feature, &o.Options)
	if err != nil {
		return nil, err
	}
	if o.Group == "" {
		o.Group = feature
	}
	ps := &PercentSource{s: s, bucket: flags.NewBucketer(o.Group)}
	ps.Percent()
	return ps, nil
}

// Percent returns the feature's percentage, or, while its definition is not
// one percentage of Group, the last one it was.
func (ps *PercentSource) Percent() int {
	p := ps.s.current()
	switch {
	case p.pct < 0:
		ps.ignore("it is not one percentage of keys (several strategies, conditions, or a fraction of a percent)")
	case p.pct > 0 && p.pct < 100 && p.group != ps.bucket.GroupID():
		ps.ignore(fmt.Sprintf("its flexibleRollout's groupId is %q, not %q", p.group, ps.bucket.GroupID()))
	default:
		if ps.last.Load() != int64(p.pct) {
			ps.last.Store(int64(p.pct))
		}
		if ps.ignored.Load() != nil {
			ps.ignored.Store(nil)
		}
		return p.pct
	}
	return int(ps.last.Load())
}

// ignore records why the current definition is not followed.
func (ps *PercentSource) ignore(why string) {
	if cur := ps.ignored.Load(); cur == nil || *cur != why {
		ps.ignored.Store(&why)
	}
}

// ErrNotPercent is the Problem of a PercentSource whose feature does not read
// as one percentage of its group.
var ErrNotPercent = errors.New("unleash: the feature is not one percentage; not followed")

// Problem returns why the feature's current definition is not followed, or
// nil while it is. Alert on it: the routing is frozen at its last
// percentage until the feature reads as one percentage again.
func (ps *PercentSource) Problem() error {
	if why := ps.ignored.Load(); why != nil {
		return fmt.Errorf("%w: feature %q: %s; routing stays at %d%%", ErrNotPercent, ps.s.feature, *why, ps.last.Load())
	}
	return nil
}

// GroupID returns the bucketing group, PercentOptions.Group.
func (ps *PercentSource) GroupID() string { return ps.bucket.GroupID() }

// UseNew reports whether key's bucket is at most Percent().
func (ps *PercentSource) UseNew(key string) bool {
	switch pct := ps.Percent(); pct {
	case 0:
		return false
	case 100:
		return true
	default:
		return ps.bucket.Bucket(key) <= pct
	}
}

// Mirroring reports the mirror feature's state, as Source.Mirroring does.
func (ps *PercentSource) Mirroring() bool { return ps.s.Mirroring() }
