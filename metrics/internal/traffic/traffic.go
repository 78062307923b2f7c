// Package traffic drives known traffic through Throttlers, a router, shadows
// and a migration, for the metrics adapters' tests: each adapter's test
// checks that what it exports equals what this package's comments say
// happened.
package traffic

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/migration"
	"github.com/throttlekit/throttlekit/shadow"
	"github.com/throttlekit/throttlekit/throttler"
)

// T is what this package needs of a test (*testing.T and *testing.B have
// it): taking it rather than testing.TB keeps package testing out of
// non-test code.
type T interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// T0 is the instant every call is made at.
var T0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// Login is the named policy of the calls.
var Login = throttler.Policy{Name: "login", Limit: 2, Window: time.Minute}

// down is a store that fails every call (or, hang, waits for the call's
// context to end, like a paused server), and names itself store.
type down struct {
	backend.OpFunc
	store string
}

func newDown(store string, hang bool) *down {
	d := &down{store: store}
	d.OpFunc = func(ctx context.Context, _ throttler.Op, _ string, _ throttler.Policy, _ int64, _, _ time.Time) (throttler.Decision, error) {
		if hang {
			<-ctx.Done()
			return throttler.Decision{}, fmt.Errorf("down: %w", ctx.Err())
		}
		return throttler.Decision{}, throttler.StoreFailure(d.store, errors.New("down: connection refused"))
	}
	return d
}

// Traits names d's one store, so that observations and breakers carry it.
func (d *down) Traits() throttler.Traits {
	return throttler.Traits{Store: func(throttler.Op, string, throttler.Policy) string { return d.store }}
}

// Memory returns a memory backend.
func Memory(t T) *memory.Backend {
	t.Helper()
	m, err := memory.New(nil)
	noError(t, err)
	return m
}

func newThrottler(t T, b throttler.Backend, o throttler.Options) *throttler.Throttler {
	t.Helper()
	o.Clock = func() time.Time { return T0 }
	th, err := throttler.New(b, &o)
	noError(t, err)
	return th
}

// Calls makes these calls, each observed by observe:
//
//	store default (memory): login take ×3 on one key: 2 allowed, 1 denied;
//	                        login take with an empty key: source none, result error;
//	                        unnamed PerMinute(5) take ×1: allowed
//	store redis-1 (fails, memory fallback): login take: fallback, allowed; 1 error
//	store redis-2 (hangs past the 1ms Timeout, fails closed, breaker after 1):
//	                        login take ×2: failure_mode, denied; 1 timeout, then
//	                        1 error (skipped by the open breaker)
//	store redis-3 (fails, fails open): login peek: failure_mode, allowed; 1 error
//
// It returns the redis-2 Throttler, whose breaker is open, and the memory one.
func Calls(t T, observe func(throttler.Observation)) (open, healthy *throttler.Throttler) {
	t.Helper()
	ctx := context.Background()
	healthy = newThrottler(t, Memory(t), throttler.Options{Observe: observe})
	for range 3 {
		_, err := healthy.Allow(ctx, "alice", Login)
		noError(t, err)
	}
	_, err := healthy.Allow(ctx, "", Login)
	errorIs(t, err, throttler.ErrInvalidKey)
	_, err = healthy.Allow(ctx, "alice", throttler.PerMinute(5))
	noError(t, err)

	fallback := newThrottler(t, newDown("redis-1", false), throttler.Options{Observe: observe, Fallback: Memory(t)})
	d, err := fallback.Allow(ctx, "alice", Login)
	noError(t, err)
	isTrue(t, d.Allowed && d.Degraded, "allowed and degraded")

	open = newThrottler(t, newDown("redis-2", true), throttler.Options{
		Observe: observe, Timeout: time.Millisecond, FailClosed: true,
		BreakerThreshold: 1, BreakerCooldown: time.Hour,
	})
	for range 2 {
		_, err = open.Allow(ctx, "alice", Login)
		errorIs(t, err, throttler.ErrUnavailable)
	}

	failOpen := newThrottler(t, newDown("redis-3", false), throttler.Options{Observe: observe})
	d, err = failOpen.Peek(ctx, "alice", Login)
	noError(t, err)
	isTrue(t, d.Allowed && d.Degraded, "allowed and degraded")
	return open, healthy
}

// Sources are a router, shadows and a migration after Drive.
type Sources struct {
	Router *flags.Router
	// Mismatch compared one pair that differs in allowed, used and
	// reset_at; Failing had one candidate error; Closed dropped one call.
	Mismatch, Failing, Closed *shadow.Backend
	// Migration routed 3 calls to old, each mirrored to new and compared
	// (all matching), then saw one change of percentage and routed 1 call
	// to new for a key that change moved: made on both stores, not
	// mirrored.
	Migration *migration.Migration
}

// Adapter is what each metrics adapter has for pulled sources.
type Adapter interface {
	Watch(name string, source any) error
}

// AddTo adds every source to m under the names the adapters' tests expect:
// router "r", shadows "mismatch", "failing" and "closed", migration
// "sessions".
func (s Sources) AddTo(t T, m Adapter) {
	t.Helper()
	noError(t, m.Watch("r", s.Router))
	noError(t, m.Watch("mismatch", s.Mismatch))
	noError(t, m.Watch("failing", s.Failing))
	noError(t, m.Watch("closed", s.Closed))
	noError(t, m.Watch("sessions", s.Migration))
}

// Drive builds the sources and makes these calls:
//
//	Router: 3 takes to old at 0%, then 2 to new at 100%.
//	Mismatch, Failing, Closed: one take each (Closed after Close).
//	Migration: 3 takes at 0% (forward shadow), 1 at 100% (a moving key), mirror on.
func Drive(t T) Sources {
	t.Helper()
	ctx := context.Background()
	var s Sources
	pct, err := flags.NewPercent(0)
	noError(t, err)
	s.Router, err = flags.NewRouter(Memory(t), Memory(t), pct, nil)
	noError(t, err)
	for i := range 3 {
		_, err := s.Router.Take(ctx, fmt.Sprint("k", i), Login, 1, T0)
		noError(t, err)
	}
	noError(t, pct.Set(100))
	for i := range 2 {
		_, err := s.Router.Take(ctx, fmt.Sprint("k", i), Login, 1, T0)
		noError(t, err)
	}

	control := Memory(t)
	_, err = control.Take(ctx, "alice", Login, 2, T0) // only the control saw these
	noError(t, err)
	s.Mismatch = newShadow(t, control, Memory(t))
	s.Failing = newShadow(t, Memory(t), newDown("redis-9", false))
	s.Closed = newShadow(t, Memory(t), Memory(t))
	noError(t, s.Closed.Close())
	for _, sh := range []*shadow.Backend{s.Mismatch, s.Failing, s.Closed} {
		_, err = sh.Take(ctx, "alice", Login, 1, T0.Add(time.Second))
		noError(t, err)
		if sh != s.Closed {
			noError(t, sh.Flush(ctx))
		}
	}

	mpct, err := flags.NewPercent(0)
	noError(t, err)
	mpct.SetMirror(true)
	s.Migration, err = migration.New(Memory(t), Memory(t), mpct, nil)
	noError(t, err)
	t.Cleanup(func() { _ = s.Migration.Close() })
	for i := range 3 {
		_, err := s.Migration.Take(ctx, fmt.Sprint("m", i), Login, 1, T0)
		noError(t, err)
	}
	noError(t, mpct.Set(100))
	_, err = s.Migration.Take(ctx, "m-new", Login, 1, T0)
	noError(t, err)
	noError(t, s.Migration.Flush(ctx))
	return s
}

func newShadow(t T, control, candidate throttler.Backend) *shadow.Backend {
	t.Helper()
	s, err := shadow.New(control, candidate, nil)
	noError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// FullMemory returns a memory backend of one state (one shard) after
// Takes of keys a, b, then a: b evicted a to the second tier, and a came
// back from it, evicting b. Its Stats: Keys 1, Evictions 2, SecondTierHits
// 1. Closed when the test ends.
func FullMemory(t T) *memory.Backend {
	t.Helper()
	m, err := memory.New(&memory.Options{Shards: 1, MaxKeys: 1})
	noError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	for _, k := range []string{"a", "b", "a"} {
		_, err := m.Take(context.Background(), k, Login, 1, T0)
		noError(t, err)
	}
	return m
}

// noError, errorIs and isTrue stop the test that drives the traffic: this
// package is not a _test file, so it leaves assertion libraries to the
// tests.
func noError(t T, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("traffic: unexpected error: %v", err)
	}
}

func errorIs(t T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("traffic: error %v, want one that is %v", err, target)
	}
}

func isTrue(t T, ok bool, what string) {
	t.Helper()
	if !ok {
		t.Fatalf("traffic: want %s", what)
	}
}

// DryRun makes, at T0, through one Throttler over a memory store that
// observe watches:
//   - 4 Takes of Login in dry run on key "a": 2 would-be denials;
//   - 4 Takes of "export" (1 a minute) in dry run on "a": 3;
//   - 2 Takes of an unnamed 1 a minute in dry run on "a": 1;
//   - a Peek of Login in dry run on "a", which would deny: no Take;
//   - 3 Takes of Login enforced on "b": 1 denial, not a would-be one.
func DryRun(t T, observe func(throttler.Observation)) {
	t.Helper()
	m, err := memory.New(nil)
	if err != nil {
		t.Fatalf("%v", err)
	}
	th, err := throttler.New(m, &throttler.Options{Clock: func() time.Time { return T0 }, Observe: observe})
	if err != nil {
		t.Fatalf("%v", err)
	}
	ctx := context.Background()
	calls := []struct {
		p   throttler.Policy
		key string
		n   int
	}{
		{Login.DryRun(), "a", 4},
		{throttler.PerMinute(1).Named("export").DryRun(), "a", 4},
		{throttler.PerMinute(1).DryRun(), "a", 2},
		{Login, "b", 3},
		// A composite whose "search" member is in dry run: it would deny the
		// last two; a composite in dry run as a whole, whose "burst" member
		// would deny the last one.
		{throttler.All(throttler.PerMinute(5).Named("page"), throttler.PerMinute(1).Named("search").DryRun()), "c", 3},
		{throttler.All(throttler.PerMinute(2).Named("burst"), throttler.PerMinute(9).Named("export")).DryRun(), "d", 3},
	}
	for _, c := range calls {
		for range c.n {
			if _, err := th.Allow(ctx, c.key, c.p); err != nil {
				t.Fatalf("%v", err)
			}
		}
	}
	if d, err := th.Peek(ctx, "a", Login.DryRun()); err != nil || !d.WouldDeny {
		t.Fatalf("the Peek: %+v, %v; want a would-be denial", d, err)
	}
}
