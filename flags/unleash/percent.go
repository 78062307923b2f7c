package unleash

import (
	"errors"
	"fmt"
	"sync/atomic"

	unleashsdk "github.com/Unleash/unleash-client-go/v4"

	"github.com/throttlekit/throttlekit/internal/rollout"
)

// percentMode is the state of a source made by NewPercent.
type percentMode struct {
	bucket  rollout.Bucketer
	last    atomic.Int64 // the last percentage read
	ignored atomic.Pointer[string]
}

// NewPercent returns a Rollout that routes by one percentage of keys
// bucketed in group (Unleash's groupId; "" means the feature's name, which
// is Unleash's own default groupId), so that package migration can tell
// which keys a change of the feature moves and send their calls to both
// stores while they settle (docs/migration.md, "Moving keys"); a source
// made by New routes as Unleash says but cannot tell that, so a migration
// over it hands a moved key the new store's state at once. See New for c,
// feature and opts. group never changes while the source lives.
//
// The feature must read as one whole percentage of keys bucketed in group:
//   - disabled, or unknown to the client: 0;
//   - enabled with no strategy, or the "default" strategy without
//     conditions: 100;
//   - one flexibleRollout on userId (or default stickiness), without
//     constraints, segments or variants, whose groupId is group (a rollout
//     of 0 or 100 may have any groupId): its rollout.
//
// Anything else (several strategies, conditions, another groupId, a
// fraction of a percent) cannot be routed by a percentage: the source then
// keeps routing by the last percentage it could read (0 before any) and
// Problem says why, so that a change made in Unleash's UI that the
// migration cannot follow is never applied to half the fleet silently.
func NewPercent(c *unleashsdk.Client, feature, group string, opts *Options) (*Rollout, error) {
	u, err := New(c, feature, opts)
	if err != nil {
		return nil, err
	}
	if group == "" {
		group = feature
	}
	u.pct = &percentMode{bucket: rollout.NewBucketer(group)}
	u.Percent()
	return u, nil
}

// Percent returns the percentage of keys the source routes to the new
// backend. For a source made by NewPercent, that is the feature's
// percentage, or, while its definition is not one percentage of the
// source's group, the last one it was. For a source made by New, it is the
// feature's percentage while its definition reads as one (see NewPercent),
// -1 otherwise.
func (u *Rollout) Percent() int {
	p := u.current()
	ps := u.pct
	if ps == nil {
		return p.pct
	}
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
func (ps *percentMode) ignore(why string) {
	if cur := ps.ignored.Load(); cur == nil || *cur != why {
		ps.ignored.Store(&why)
	}
}

// ErrNotPercent is the Problem of a source made by NewPercent whose feature
// does not read as one percentage of its group.
var ErrNotPercent = errors.New("unleash: the feature is not one percentage; not followed")

// Problem returns why the feature's current definition is not followed, or
// nil while it is; always nil for a source made by New, which follows
// every definition. Alert on it: the routing of a NewPercent source is
// frozen at its last percentage until the feature reads as one percentage
// again.
func (u *Rollout) Problem() error {
	if u.pct == nil {
		return nil
	}
	if why := u.pct.ignored.Load(); why != nil {
		return fmt.Errorf("%w: feature %q: %s; routing stays at %d%%", ErrNotPercent, u.feature, *why, u.pct.last.Load())
	}
	return nil
}

// GroupID returns the group a source made by NewPercent buckets keys in,
// and "" for one made by New: package migration then tracks no moving
// keys.
func (u *Rollout) GroupID() string {
	if u.pct == nil {
		return ""
	}
	return u.pct.bucket.GroupID()
}

// usePercent is UseNew for a source made by NewPercent: key's bucket is at
// most Percent().
func (u *Rollout) usePercent(key string) bool {
	return u.pct.bucket.In(key, u.Percent())
}
