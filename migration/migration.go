// Package migration is the one piece of code that moves a live system from
// an old rate-limit store to a new one, as docs/migration.md's playbook runs it:
//
//	m, err := migration.New(memcachedBackend, redisBackend, rollout, nil)
//	if err != nil {
//		return err
//	}
//	defer m.Close()
//	t, err := throttler.New(m, nil)
//
// The rollout (a flags source: flags.Percent, flags.File or an
// unleash.Rollout from package flags/unleash) decides per key
// which store serves it, and whether mirroring is on. A key served by the
// old store is mirrored to the new one (the forward shadow), and a key
// served by the new store is mirrored back to the old one (the reverse
// shadow), so whichever way the percentage moves, keys land on a store whose
// counts are current. The mirror may lag or drop calls, and processes see a
// change at different moments, so a key a change moves is served by both
// stores for a while (see Options.Settle and docs/migration.md, "Moving
// keys"): nobody gets a fresh window, without a Flush at any change. The
// stages are all settings of the rollout:
//
//	shadow:   0%, mirror on     old serves everyone, new is compared
//	ramp:     10%, 50%, mirror on
//	rollback: 0%, mirror on     back on old, which the reverse mirror kept warm
//	finish:   100%, mirror on for a while, then mirror off; remove the old store
//
// It is its own package because it is where routing (flags) meets
// comparison (shadow), and each of those must not own the other.
package migration

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/internal/nilness"
	"github.com/throttlekit/throttlekit/shadow"
	"github.com/throttlekit/throttlekit/throttler"
)

// Options configure a Migration. The zero value (or nil) means defaults.
type Options struct {
	// Forward configures the shadow in which the old store serves and the
	// new one is compared. Its Enabled, if set, is combined with the
	// rollout's mirror setting: both must say yes. default: shadow defaults
	Forward *shadow.Options
	// Reverse configures the shadow in which the new store serves and the
	// old one is compared. default: shadow defaults
	Reverse *shadow.Options
	// Router configures the router. default: old is named "old", new "new"
	Router *flags.RouterOptions
	// Mirror, if set, says whether to mirror, instead of the rollout's own
	// setting, its Mirroring method (see flags.Rollout). Called on every
	// call: keep it cheap. default: the rollout's setting; off for a
	// rollout without one
	Mirror func() bool
	// Settle is how long, on top of its policy's horizon (two windows, a
	// bucket's refill from empty), a key a change of percentage moves is
	// served by both stores after this process sees the change (see
	// "Moving keys" in docs/migration.md). It must cover how much later
	// than the first process the last one sees a change, how long a call
	// mirrored before it can wait in a shadow's queue, and the spread of
	// the processes' clocks, and LateAfter. Only a rollout that tells its
	// percentage (its Percent and GroupID methods, see flags.Rollout) has
	// moving keys. Negative is an error.
	// default: 30s
	Settle time.Duration
	// LateAfter is the share of Settle a call's lateness may take: a call
	// that one store serves alone, during which this process sees a change
	// that moves its key, and that is answered more than LateAfter after
	// the process saw the change, is late (see "Late calls" in
	// docs/migration.md): counted in Stats().Moving.Late and passed to
	// OnLate. Moving keys are exact on every key without a late call as
	// long as the last process sees a change within Settle − LateAfter of
	// the first, less the spread of their clocks. Negative, or more than
	// Settle, is an error. Only a rollout that tells its percentage has
	// late calls. default: Settle/2
	LateAfter time.Duration
	// OnLate, if set, is called with each late call's key, policy and how
	// long after this process saw the change it was answered, on the
	// caller's goroutine before the call returns: keep it quick. default:
	// none
	OnLate func(key string, p throttler.Policy, late time.Duration)
}

// defaultSettle covers Unleash clients polling every 15s (their default)
// twice over.
const defaultSettle = 30 * time.Second

// Migration is a throttler.Backend: a flags.Router over Shadow(old→new)
// and Shadow(new→old), whose strategy sends the keys a change of
// percentage is moving to both stores at once. Take, Peek and Refund go to
// the store that serves the key now, through its shadow; a moving key's go
// to both stores (see Options.Settle). When both stores hold leases, so
// does a Migration (Traits; see Acquire); when both take composites
// (throttler.All), so does it, a moving key's all or nothing across both
// stores ("Moving keys" in docs/migration.md). The rollout's UseNew says which
// store serves a key. Traits say whether both stores' calls never block
// and the store a call reaches: the serving store's own name for it (a
// shard, a server), or "old" or "new" (Options.Router's names) for a store
// that names none, so that a Throttler's breaker for one store never stops
// calls to the other. It is safe for concurrent use. Create it with New;
// Close stops the shadows' workers.
type Migration struct {
	router           *flags.Router // every call goes through it
	forward, reverse *shadow.Backend
	// stores are the stores themselves, old then new, for moving keys;
	// leases are their leases (nil unless both hold them). Apart: a store
	// is passed by value on every moving key's call.
	stores           [2]store
	leases           [2]throttler.LeaseBackend
	oldName, newName string
	composites       bool // both stores take composites
	// moves is nil for a rollout that cannot tell its percentage.
	moves *mover
	// lateAfter and onLate are Options.LateAfter and OnLate.
	lateAfter time.Duration
	onLate    func(key string, p throttler.Policy, late time.Duration)
	// A moving key's call bumps these: apart from the fields it reads.
	_      [64]byte
	moving movingCounters
}

var _ throttler.Backend = (*Migration)(nil)

// New returns a Migration from oldB to newB, ramped by r. The stores and r
// are required: to keep every key on oldB, pass flags.NewPercent(0). Nil
// options mean defaults; an option the shadows or the router refuse is an
// error naming it. New starts the shadows' workers; call Close to stop
// them.
func New(oldB, newB throttler.Backend, r flags.Rollout, opts *Options) (*Migration, error) {
	return newWith(oldB, newB, r, opts, nil)
}

// newWith is New with mono as the moving keys' monotonic clock; nil is the
// process's. Tests move theirs by hand.
func newWith(oldB, newB throttler.Backend, r flags.Rollout, opts *Options, mono func() time.Duration) (*Migration, error) {
	if err := nilness.Check("migration: old backend", oldB); err != nil {
		return nil, err
	}
	if err := nilness.Check("migration: new backend", newB); err != nil {
		return nil, err
	}
	if r == nil {
		return nil, errors.New("migration: rollout is nil; pass flags.NewPercent(0) to keep every key on old")
	}
	if err := nilness.Check("migration: rollout", r); err != nil {
		return nil, err
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	switch {
	case o.Settle < 0:
		return nil, fmt.Errorf("migration: Options.Settle is %v; want 0 (default %v) or more", o.Settle, defaultSettle)
	case o.Settle == 0:
		o.Settle = defaultSettle
	}
	switch {
	case o.LateAfter < 0 || o.LateAfter > o.Settle:
		return nil, fmt.Errorf("migration: Options.LateAfter is %v; want 0 (default Settle/2) to Settle (%v)", o.LateAfter, o.Settle)
	case o.LateAfter == 0:
		o.LateAfter = o.Settle / 2
	}
	mirror := o.Mirror
	if mirror == nil {
		mirror = func() bool { return false }
		if m, ok := r.(interface{ Mirroring() bool }); ok {
			mirror = m.Mirroring
		}
	}
	fwd, err := shadow.New(oldB, newB, shadowOptions(o.Forward, mirror))
	if err != nil {
		return nil, optionsError("Forward", err)
	}
	rev, err := shadow.New(newB, oldB, shadowOptions(o.Reverse, mirror))
	if err != nil {
		_ = fwd.Close()
		return nil, optionsError("Reverse", err)
	}
	m := &Migration{
		forward: fwd, reverse: rev,
		stores: [2]store{
			{b: oldB, local: throttler.TraitsOf(oldB).InProcess},
			{b: newB, local: throttler.TraitsOf(newB).InProcess, isNew: true},
		},
		oldName: "old", newName: "new",
		lateAfter: o.LateAfter, onLate: o.OnLate,
	}
	if o.Router != nil && o.Router.OldName != "" {
		m.oldName = o.Router.OldName
	}
	if o.Router != nil && o.Router.NewName != "" {
		m.newName = o.Router.NewName
	}
	// The router routes by the strategy, which is r made to send the keys
	// a change is moving to both stores; it is complete before the router
	// asks it for the pairs of stores.
	routes := &strategy{rollout: r}
	routes.init(m, o.Settle, mono)
	// With moving keys, the calls one store serves alone are watched for
	// lateness (see late.go).
	var oldSide, newSide throttler.Backend = fwd, rev
	if routes.tracked {
		oldSide, newSide = &watched{b: fwd, mv: &routes.mover, m: m}, &watched{b: rev, mv: &routes.mover, m: m, isNew: true}
	}
	rt, err := flags.NewRouter(oldSide, newSide, routes, o.Router)
	if err != nil {
		// Everything it checks was checked above, but for Options.Router.
		// The mover has no ticker yet: it starts at the first change.
		_ = errors.Join(fwd.Close(), rev.Close())
		return nil, err
	}
	m.router = rt
	m.composites = rt.Traits().Composites
	if rt.Traits().Leases {
		m.leases[0], m.leases[1] = oldB.(throttler.LeaseBackend), newB.(throttler.LeaseBackend)
	}
	return m, nil
}

// Take takes cost units from key's budget under p: see throttler.Backend.
// The Migration does not validate: the stores do.
func (m *Migration) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	if p.Composite() && !m.composites {
		return throttler.Decision{}, errComposite
	}
	return m.router.Take(ctx, key, p, cost, now)
}

// Peek reports key's budget under p without taking from it.
func (m *Migration) Peek(ctx context.Context, key string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	if p.Composite() && !m.composites {
		return throttler.Decision{}, errComposite
	}
	return m.router.Peek(ctx, key, p, now)
}

// Refund gives back cost units a Take took, receipt being that Take's
// Decision.ResetAt.
func (m *Migration) Refund(ctx context.Context, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
	return m.router.Refund(ctx, key, p, cost, receipt, now)
}

// Traits are its router's: in process when both stores are, taking
// composites when both stores do (see composite.go), each call's store
// named as Migration says, and a Throttler's call over m named and sent
// from one reading of the rollout.
func (m *Migration) Traits() throttler.Traits {
	t := m.router.Traits()
	route := t.Route
	t.Route = func(b throttler.Backend, op throttler.Op, key string, p throttler.Policy) (string, throttler.Backend) {
		if b != throttler.Backend(m) {
			b = nil // a wrapper of m: the router only names the store
		} else {
			b = m.router
		}
		return route(b, op, key, p)
	}
	return t
}

// optionsError renames a shadow's refusal of its options: the backends are
// checked before, so shadow.New can only fail as "shadow: Options.<field>
// …", which names the field as the caller of New wrote it:
// "migration: Options.Forward.<field> …".
func optionsError(field string, err error) error {
	if inner := errors.Unwrap(err); inner != nil {
		return fmt.Errorf("migration: Options.%s.%w", field, inner)
	}
	return err
}

// shadowOptions copies o, making its Enabled require mirror too.
func shadowOptions(o *shadow.Options, mirror func() bool) *shadow.Options {
	var out shadow.Options
	if o != nil {
		out = *o
	}
	if own := out.Enabled; own != nil {
		out.Enabled = func() bool { return mirror() && own() }
	} else {
		out.Enabled = mirror
	}
	return &out
}

// Stats is what an operator watches during a migration.
type Stats struct {
	// Forward compares the new store against the old one, for the keys the
	// old one serves: its mismatch rate is the go/no-go signal.
	Forward shadow.Stats
	// Reverse compares the old store against the new one, for the keys the
	// new one serves: it shows that a rollback would land on warm counts.
	Reverse shadow.Stats
	// Routed is the router's count of the calls served by each store, lease
	// calls included: a moving key's call counts for the store that serves
	// it now. Its Leases counts the lease calls made through a shadow; those
	// made on both stores directly (a moving key's, the Release of a lease
	// the router did not remember) count in Old and New only.
	Routed flags.Stats
	// Moving counts the calls for moving keys (see Options.Settle), made on
	// both stores.
	Moving struct {
		// Tracked reports whether the rollout tells its percentage (see
		// Options.Settle): without it no key is ever moving, and a key the
		// rollout moves is served by its new store alone at once.
		Tracked bool
		// Changes counts the changes of percentage this process has seen.
		Changes uint64
		// Calls counts the calls for moving keys, each made on both stores.
		Calls uint64
		// Compensated counts the Takes that one store admitted and the
		// other denied (or failed): the admitting store was refunded the
		// cost; and the Acquires one store granted and the other did not:
		// the lease was released there.
		Compensated uint64
		// RefundFailed counts the compensating Refunds (and Releases) that
		// failed: their store keeps units nobody was given (it is
		// stricter, never laxer). Healthy: near 0.
		RefundFailed uint64
		// OneStore counts the moving keys' calls answered by the serving
		// store alone because the other failed: each could admit what the
		// failed store's count would have denied. Healthy: 0.
		OneStore uint64
		// Leveled counts the token buckets the serving store held fuller
		// than the other, emptied down to it.
		Leveled uint64
		// Late counts the late calls (see Options.LateAfter): each may have
		// let the store its key moves to admit what the call was not
		// counted for. Healthy: 0.
		Late uint64
	}
}

// Stats returns a snapshot of both shadows, the routing and the moving
// keys.
func (m *Migration) Stats() Stats {
	s := Stats{Forward: m.forward.Stats(), Reverse: m.reverse.Stats(), Routed: m.router.Stats()}
	m.movingStats(&s)
	return s
}

// Flush waits until every call mirrored so far, in both directions, has
// been compared, or ctx is done. Call it before reading Stats at a stage
// boundary; see also the note on switching in docs/migration.md.
func (m *Migration) Flush(ctx context.Context) error {
	return errors.Join(m.forward.Flush(ctx), m.reverse.Flush(ctx))
}

// Close stops both shadows' workers (see shadow.Backend.Close) and the
// moving keys' clock. It does not close the stores.
func (m *Migration) Close() error {
	if m.moves != nil {
		m.moves.close()
	}
	return errors.Join(m.forward.Close(), m.reverse.Close())
}
