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
// unleash.Source from package flags/unleash) decides per key
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
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/flags"
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
	// setting (see flags.Mirrorer). Called on every call: keep it cheap.
	// default: the rollout's setting; off for a rollout without one
	Mirror func() bool
	// Settle is how long, on top of its policy's horizon (two windows, a
	// bucket's refill from empty), a key a change of percentage moves is
	// served by both stores after this process sees the change (see
	// "Moving keys" in docs/migration.md). It must cover how much later
	// than the first process the last one sees a change, how long a call
	// mirrored before it can wait in a shadow's queue, and the spread of
	// the processes' clocks. Only a rollout that tells its percentage
	// (flags.AsPercenter) has moving keys. Negative is an error.
	// default: 30s
	Settle time.Duration

	// monotonic replaces the process's monotonic clock in tests.
	monotonic func() time.Duration
}

// defaultSettle covers Unleash clients polling every 15s (their default)
// twice over.
const defaultSettle = 30 * time.Second

// router is flags.Router under a name that is not exported, so that
// embedding it gives Migration the router's Take, Peek, Refund, UseNew and
// InProcess without a field anyone outside could reassign.
type router = flags.Router

// opFunc is backend.OpFunc under a name that is not exported (see router).
type opFunc = backend.OpFunc

// Migration is a throttler.Backend: Router(Shadow(old→new), Shadow(new→old)),
// plus both stores at once for the keys a change of percentage is moving.
// Its Take, Peek and Refund go to the store that serves the key now, through
// its shadow; a moving key's go to both stores (see Options.Settle). When
// both stores hold leases, so does a Migration: see Acquire (the router's
// AcquireOn and ReleaseKnown, promoted, skip the moving keys). UseNew
// reports which store serves a key, InProcess whether both stores' calls
// never block, and Store (backend.Stores) the store a call reaches: the
// serving store's own name for it (a shard, a server), or "old" or "new"
// (Options.Router's names) for a store that names none, so that a
// Throttler's breaker for one store never stops calls to the other. It is
// safe for concurrent use. Create it with New; Close stops the shadows'
// workers.
type Migration struct {
	*router
	opFunc           // m.do(): Take, Peek and Refund
	forward, reverse *shadow.Backend
	rollout          flags.Rollout
	// stores are the stores themselves, old then new, for moving keys.
	stores           [2]store
	oldName, newName string
	// moves is nil for a rollout that cannot tell its percentage.
	moves *mover

	// The counters sit on separate cache lines: every call bumps one.
	oldCalls atomic.Uint64
	_        [56]byte
	newCalls atomic.Uint64
	_        [56]byte
	moving   movingCounters
}

var (
	_ throttler.Backend = (*Migration)(nil)
	_ backend.InProcess = (*Migration)(nil)
	_ backend.Stores    = (*Migration)(nil)
)

// New returns a Migration from old to new, ramped by r. The stores and r
// are required: to keep every key on old, pass flags.NewPercent(0). Nil
// options mean defaults; an option the shadows or the router refuse is an
// error naming it. New starts the shadows' workers; call Close to stop
// them.
func New(old, new throttler.Backend, r flags.Rollout, opts *Options) (*Migration, error) {
	if err := backend.Required("migration: old backend", old); err != nil {
		return nil, err
	}
	if err := backend.Required("migration: new backend", new); err != nil {
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
	mirror := o.Mirror
	if mirror == nil {
		mirror = func() bool { return false }
		if m, ok := r.(flags.Mirrorer); ok {
			mirror = m.Mirroring
		}
	}
	fwd, err := shadow.New(old, new, shadowOptions(o.Forward, mirror))
	if err != nil {
		return nil, optionsError("Forward", err)
	}
	rev, err := shadow.New(new, old, shadowOptions(o.Reverse, mirror))
	if err != nil {
		_ = fwd.Close()
		return nil, optionsError("Reverse", err)
	}
	rt, err := flags.NewRouter(fwd, rev, r, o.Router)
	if err != nil {
		// Only r can be wrong here; the error names it ("flags: rollout
		// is nil; …").
		_ = errors.Join(fwd.Close(), rev.Close())
		return nil, err
	}
	m := &Migration{
		router: rt, forward: fwd, reverse: rev, rollout: r,
		stores:  [2]store{{b: old, local: backend.IsInProcess(old)}, {b: new, local: backend.IsInProcess(new), isNew: true}},
		oldName: "old", newName: "new",
	}
	if o.Router != nil && o.Router.OldName != "" {
		m.oldName = o.Router.OldName
	}
	if o.Router != nil && o.Router.NewName != "" {
		m.newName = o.Router.NewName
	}
	if pc, ok := flags.AsPercenter(r); ok {
		m.moves = newMover(pc, o.Settle, o.monotonic)
	}
	m.opFunc = m.do()
	return m, nil
}

// do returns the function behind Take, Peek and Refund: it sends the call
// to the serving store's shadow, or, for a moving key, to both stores
// (both). Like the router it replaces, it does not validate (the stores
// do) and is a closure that switches on op itself, to spare a frame.
func (m *Migration) do() backend.OpFunc {
	return func(ctx context.Context, op throttler.Op, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
		var toNew bool
		if mv := m.moves; mv == nil {
			toNew = m.rollout.UseNew(key)
		} else {
			pct := min(max(mv.pct.Percent(), 0), 100)
			if h := mv.hist.Load(); pct == h.cur && len(h.marks) == 0 {
				toNew = pct == 100 || pct > 0 && mv.bucket.Bucket(key) <= pct
			} else {
				var moving bool
				if toNew, moving = mv.route(h, pct, key, p); moving {
					return m.both(ctx, op, key, p, cost, receipt, now, toNew)
				}
			}
		}
		b := m.forward
		if toNew {
			b = m.reverse
			m.newCalls.Add(1)
		} else {
			m.oldCalls.Add(1)
		}
		var d throttler.Decision
		var err error
		switch op {
		case throttler.OpTake:
			d, err = b.Take(ctx, key, p, cost, now)
		case throttler.OpPeek:
			d, err = b.Peek(ctx, key, p, now)
		case throttler.OpRefund:
			d, err = b.Refund(ctx, key, p, cost, receipt, now)
		default:
			return backend.Do(ctx, b, op, key, p, cost, receipt, now) // ErrUnknownOp
		}
		if err != nil {
			return d, m.wrap(err, toNew)
		}
		return d, nil
	}
}

// wrap names the store that failed, as flags.Router does; errors.Is still
// finds the cause. An input error is the caller's and is returned as it is.
// It stays out of line, off every call's frame.
//
//go:noinline
func (m *Migration) wrap(err error, isNew bool) error {
	if throttler.IsInputError(err) {
		return err
	}
	return fmt.Errorf("%s backend: %w", m.name(isNew), err)
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
	// Routed counts the calls served by each store: a moving key's call
	// counts for the store that serves it now.
	Routed flags.Stats // lease calls included, and counted in its Leases
	// Moving counts the calls for moving keys, made on both stores.
	Moving MovingStats
}

// Stats returns a snapshot of both shadows, the routing and the moving
// keys.
func (m *Migration) Stats() Stats {
	return Stats{
		Forward: m.forward.Stats(),
		Reverse: m.reverse.Stats(),
		Routed:  m.routed(),
		Moving:  m.movingStats(),
	}
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
