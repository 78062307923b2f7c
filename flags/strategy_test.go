package flags

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/internal/leasetest"
	"github.com/throttlekit/throttlekit/throttler"
)

// fixedRoute is a strategy that answers the same for every key, and counts
// how often it was asked.
type fixedRoute struct {
	toNew  bool
	moving bool
	both   *bothBackend // a nil one is no backend
	asked  atomic.Int64
}

func (s *fixedRoute) Route(string, throttler.Policy) (bool, bool) {
	s.asked.Add(1)
	return s.toNew, s.both != nil
}

func (s *fixedRoute) Both(bool) throttler.Backend {
	if s.both == nil {
		return nil
	}
	return s.both
}

func (s *fixedRoute) RouteLease(string, throttler.ConcurrencyPolicy) (bool, bool, throttler.LeaseBackend) {
	s.asked.Add(1)
	if s.both == nil {
		return s.toNew, s.moving, nil
	}
	return s.toNew, s.moving, s.both
}

// bothBackend stands for a strategy's backend over both stores: it answers
// from b, failing with err when set, and counts its calls.
type bothBackend struct {
	b     throttler.Backend
	err   error
	calls atomic.Int64
}

func (s *bothBackend) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	s.calls.Add(1)
	if s.err != nil {
		return throttler.Decision{}, s.err
	}
	return s.b.Take(ctx, key, p, cost, now)
}

func (s *bothBackend) Peek(ctx context.Context, key string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	s.calls.Add(1)
	return s.b.Peek(ctx, key, p, now)
}

func (s *bothBackend) Refund(ctx context.Context, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
	s.calls.Add(1)
	return s.b.Refund(ctx, key, p, cost, receipt, now)
}

func (s *bothBackend) Acquire(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (throttler.Decision, error) {
	s.calls.Add(1)
	if s.err != nil {
		return throttler.Decision{}, s.err
	}
	return s.b.(throttler.LeaseBackend).Acquire(ctx, key, p, id, now)
}

func (s *bothBackend) Release(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (bool, throttler.Decision, error) {
	s.calls.Add(1)
	return s.b.(throttler.LeaseBackend).Release(ctx, key, p, id, now)
}

// countingRollout counts its UseNew calls.
type countingRollout struct {
	Rollout
	calls atomic.Int64
}

func (c *countingRollout) UseNew(key string) bool {
	c.calls.Add(1)
	return c.Rollout.UseNew(key)
}

// strategic is a rollout that is also a strategy, as a migration's is.
type strategic struct {
	Rollout
	strategy
}

func strategyRouter(t *testing.T, old, new throttler.Backend, r Rollout, s strategy) *Router {
	t.Helper()
	rt, err := NewRouter(old, new, strategic{r, s}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// A strategy routes every call in the rollout's place, once per call: a
// call it sends to both goes to its backend, counted and named in errors
// as the serving backend's, as any other call.
func TestRouterStrategyRoutesRateCalls(t *testing.T) {
	ctx := context.Background()
	pol := throttler.PerSecond(5).Named("api")
	errDown := errors.New("connection refused")
	tests := []struct {
		name      string
		toNew     bool
		both      *bothBackend
		cost      int64
		wantErr   string // "" for none
		wantCalls Stats
		wantOn    string // "old", "new" or "both"
	}{
		{"to new against the rollout", true, nil, 1, "", Stats{New: 1}, "new"},
		{"to old", false, nil, 1, "", Stats{Old: 1}, "old"},
		{"both, new serving", true, &bothBackend{b: mem(t)}, 1, "", Stats{New: 1}, "both"},
		{"both, old serving", false, &bothBackend{b: mem(t)}, 1, "", Stats{Old: 1}, "both"},
		{"both fails", true, &bothBackend{b: mem(t), err: errDown}, 1, "new backend: connection refused", Stats{New: 1}, "both"},
		{"both, bad input", false, &bothBackend{b: mem(t)}, 0, "throttler: invalid cost: must be at least 1, got 0", Stats{Old: 1}, "both"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			old, new := mem(t), mem(t)
			rollout := &countingRollout{Rollout: percent(t, 0)}
			s := &fixedRoute{toNew: tt.toNew, both: tt.both}
			r := strategyRouter(t, old, new, rollout, s)
			_, err := r.Take(ctx, "k", pol, tt.cost, t0)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatal(err)
			case tt.wantErr != "" && (err == nil || err.Error() != tt.wantErr):
				t.Fatalf("error = %v, want %q", err, tt.wantErr)
			}
			if got := r.Stats(); got != tt.wantCalls {
				t.Errorf("Stats() = %+v, want %+v", got, tt.wantCalls)
			}
			if s.asked.Load() != 1 || rollout.calls.Load() != 0 {
				t.Errorf("strategy asked %d times, rollout %d; want once, never", s.asked.Load(), rollout.calls.Load())
			}
			usedOld, _ := old.Peek(ctx, "k", pol, t0)
			usedNew, _ := new.Peek(ctx, "k", pol, t0)
			on := map[bool]string{true: "new", false: "old"}[usedNew.Used > 0]
			if usedOld.Used == 0 && usedNew.Used == 0 {
				on = "both"
			}
			if tt.wantErr == "" && on != tt.wantOn || tt.both != nil && tt.both.calls.Load() != 1 {
				t.Errorf("the call reached %s, want %s", on, tt.wantOn)
			}
		})
	}
}

// For leases, the strategy chooses where a lease the router does not hold
// is acquired; a retry is renewed where the lease is held whatever it says;
// a moving key's Acquire goes to both and is not remembered; and the
// Release of a lease the router does not know goes to both when the
// strategy has one, counted as the serving backend's call.
func TestRouterStrategyRoutesLeases(t *testing.T) {
	ctx := context.Background()
	old, new := mem(t), mem(t)
	rollout := &countingRollout{Rollout: percent(t, 0)}
	s := &fixedRoute{toNew: true}
	r := strategyRouter(t, old, new, rollout, s)
	if d, err := r.Acquire(ctx, "k", exports, 4, t0); err != nil || !d.Allowed {
		t.Fatalf("Acquire = %+v, %v", d, err)
	}
	if leasetest.Holds(t, new, "k", exports, t0) == 0 || leasetest.Holds(t, old, "k", exports, t0) > 0 {
		t.Fatal("the strategy's route to new was not taken")
	}
	// A retry renews where the lease is held, whatever the strategy says.
	s.toNew = false
	if d, err := r.Acquire(ctx, "k", exports, 4, t0.Add(time.Second)); err != nil || !d.Allowed || !d.ResetAt.Equal(t0.Add(time.Second+time.Minute)) {
		t.Fatalf("retried Acquire = %+v, %v", d, err)
	}
	if leasetest.Holds(t, old, "k", exports, t0) > 0 {
		t.Fatal("the retry went to old")
	}
	if held, _, err := r.Release(ctx, "k", exports, 4, t0.Add(2*time.Second)); err != nil || !held {
		t.Fatalf("Release = %v, %v", held, err)
	}
	if leasetest.Holds(t, new, "k", exports, t0.Add(2*time.Second)) > 0 {
		t.Fatal("the lease is still held on new")
	}

	// Moving: the Acquire goes to both, and its Release (a lease the router
	// does not remember) too.
	both := &bothBackend{b: old}
	s.toNew, s.moving, s.both = true, true, both
	if d, err := r.Acquire(ctx, "m", exports, 5, t0); err != nil || !d.Allowed {
		t.Fatalf("moving Acquire = %+v, %v", d, err)
	}
	if both.calls.Load() != 1 || leasetest.Holds(t, new, "m", exports, t0) > 0 || r.Stats().Leases.Held != 0 {
		t.Fatalf("moving Acquire: %d calls to both, Leases %+v; want one, not remembered", both.calls.Load(), r.Stats().Leases)
	}
	s.moving = false
	if held, _, err := r.Release(ctx, "m", exports, 5, t0.Add(time.Second)); err != nil || !held || both.calls.Load() != 2 {
		t.Fatalf("Release of an unknown lease = %v, %v after %d calls to both; want held, through both", held, err, both.calls.Load())
	}
	st := r.Stats()
	// Both of the moving key's calls count as new's, and among no lease
	// counter: they went to both.
	var want Stats
	want.Leases.NewAcquires, want.Leases.NewReleases = 2, 1
	if st.Leases != want.Leases || st.New != 5 || st.Old != 0 {
		t.Errorf("Stats() = %+v; want leases %+v, every call on new", st, want.Leases)
	}
	if rollout.calls.Load() != 0 {
		t.Errorf("the rollout was asked %d times; want never", rollout.calls.Load())
	}

	// A strategy without a backend for both leaves the unknown lease to the
	// router: released to both backends, counted Unknown.
	s.both = nil
	if held, _, err := r.Release(ctx, "gone", exports, 6, t0); err != nil || held {
		t.Fatalf("Release = %v, %v", held, err)
	}
	if st := r.Stats(); st.Leases.Unknown != 1 || st.Leases.OldReleases != 1 || st.Leases.NewReleases != 2 {
		t.Errorf("Leases = %+v; want the unknown lease released on both", st.Leases)
	}
}

// routedRollout is a rollout and its own strategy.
type routedRollout struct{ fixedRoute }

func (*routedRollout) UseNew(string) bool { return false }

// A nil rollout that would route as a strategy is refused like any nil
// rollout, at construction.
func TestNewRouterRejectsANilStrategy(t *testing.T) {
	var s *routedRollout
	_, err := NewRouter(mem(t), mem(t), s, nil)
	if err == nil || err.Error() != "flags: rollout is a nil *flags.routedRollout" {
		t.Fatalf("err = %v", err)
	}
}
