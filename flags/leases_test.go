package flags

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/backend/backendtest"
	"github.com/throttlekit/throttlekit/internal/leasetest"
	"github.com/throttlekit/throttlekit/throttler"
)

var exports = throttler.ConcurrencyPolicy{Name: "exports", Limit: 1, TTL: time.Minute}

func TestRouterLeaseConformance(t *testing.T) {
	for _, p := range []int{0, 50, 100} {
		t.Run(strconv.Itoa(p), func(t *testing.T) {
			// Every backend of one case reaches the same two stores.
			stores := map[string][2]throttler.Backend{}
			var mu sync.Mutex
			backendtest.RunLeases(t, func(t *testing.T) backendtest.LeaseStore {
				mu.Lock()
				defer mu.Unlock()
				s, ok := stores[t.Name()]
				if !ok {
					s = [2]throttler.Backend{mem(t), mem(t)}
					stores[t.Name()] = s
				}
				return router(t, s[0], s[1], percent(t, p), nil)
			})
		})
	}
}

// A Router claims leases only when both its backends hold them: over one
// that does not, a Throttler knows it when it is built.
func TestRouterHoldsLeasesOnlyWhenBothBackendsDo(t *testing.T) {
	tests := []struct {
		name     string
		old, new throttler.Backend
		want     bool
	}{
		{"both", mem(t), mem(t), true},
		{"old without", failing{}, mem(t), false},
		{"new without", mem(t), failing{}, false},
		{"a router over routers", router(t, mem(t), mem(t), percent(t, 50), nil), mem(t), true},
		{"a router over a router without", router(t, mem(t), failing{}, percent(t, 50), nil), mem(t), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := router(t, tc.old, tc.new, percent(t, 50), nil)
			if r.Traits().Leases != tc.want {
				t.Fatalf("Traits().Leases = %v, want %v", r.Traits().Leases, tc.want)
			}
			th, err := throttler.New(r, nil)
			if err != nil {
				t.Fatal(err)
			}
			if th.SupportsLeases() != tc.want {
				t.Fatalf("SupportsLeases = %v, want %v", th.SupportsLeases(), tc.want)
			}
			_, err = r.Acquire(context.Background(), "k", exports, 1, t0)
			if tc.want != (err == nil) || !tc.want && !errors.Is(err, throttler.ErrLeasesUnsupported) {
				t.Fatalf("Acquire: %v", err)
			}
			_, _, err = r.Release(context.Background(), "k", exports, 1, t0)
			if tc.want != (err == nil) || !tc.want && !errors.Is(err, throttler.ErrLeasesUnsupported) {
				t.Fatalf("Release: %v", err)
			}
		})
	}
}

// A Release reaches the backend that granted the lease, whichever way the
// rollout has moved the key since; a retried Acquire renews it there.
func TestRouterReleasesWhereTheLeaseWasGranted(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct{ from, to int }{{0, 100}, {100, 0}} {
		t.Run(strconv.Itoa(tc.from)+"to"+strconv.Itoa(tc.to), func(t *testing.T) {
			old, new := mem(t), mem(t)
			pct := percent(t, tc.from)
			r := router(t, old, new, pct, nil)
			granter, other := throttler.LeaseBackend(old), throttler.LeaseBackend(new)
			if tc.from == 100 {
				granter, other = new, old
			}
			d, err := r.Acquire(ctx, "k", exports, 7, t0)
			if err != nil || !d.Allowed {
				t.Fatalf("Acquire = %+v, %v", d, err)
			}
			if err := pct.Set(tc.to); err != nil {
				t.Fatal(err)
			}
			// Retried after the move: renewed where it is held.
			d, err = r.Acquire(ctx, "k", exports, 7, t0.Add(time.Second))
			if err != nil || !d.Allowed || !d.ResetAt.Equal(t0.Add(time.Second+time.Minute)) {
				t.Fatalf("retried Acquire = %+v, %v; want it renewed", d, err)
			}
			if leasetest.Holds(t, other, "k", exports, t0.Add(time.Second)) > 0 {
				t.Fatal("the retried Acquire went to the backend the key moved to")
			}
			ok, d, err := r.Release(ctx, "k", exports, 7, t0.Add(2*time.Second))
			if err != nil || !ok {
				t.Fatalf("Release = %v, %+v, %v; want held", ok, d, err)
			}
			if leasetest.Holds(t, granter, "k", exports, t0.Add(2*time.Second)) > 0 {
				t.Fatal("the granting backend still holds the lease")
			}
			s := r.Stats()
			var want Stats
			if tc.from == 100 {
				want.Leases.NewAcquires, want.Leases.NewReleases = 2, 1
			} else {
				want.Leases.OldAcquires, want.Leases.OldReleases = 2, 1
			}
			if s.Leases != want.Leases {
				t.Fatalf("Stats.Leases = %+v, want %+v", s.Leases, want.Leases)
			}
			if s.Old+s.New != 3 {
				t.Fatalf("Stats = %+v: lease calls count as calls", s)
			}
			// Released again: unknown now, so sent to both, harmlessly.
			ok, _, err = r.Release(ctx, "k", exports, 7, t0.Add(3*time.Second))
			if err != nil || ok {
				t.Fatalf("second Release = %v, %v; want not held", ok, err)
			}
			if s := r.Stats().Leases; s.Unknown != 1 || s.OldReleases+s.NewReleases != 3 {
				t.Fatalf("Stats.Leases = %+v: want the second Release sent to both", s)
			}
		})
	}
}

// The table is bounded: a lease granted while it is full is released to
// both backends, and reaches the one that holds it; expired entries are
// swept.
func TestRouterLeaseTableIsBounded(t *testing.T) {
	ctx := context.Background()
	old, new := mem(t), mem(t)
	pct := percent(t, 0)
	r := router(t, old, new, pct, &RouterOptions{MaxLeases: leaseShards}) // one entry per shard
	p := throttler.Concurrent(10, time.Second)
	// IDs 16 and 32 fall in shard 0.
	for _, id := range []throttler.LeaseID{16, 32} {
		if d, err := r.Acquire(ctx, "k", p, id, t0); err != nil || !d.Allowed {
			t.Fatalf("Acquire %d = %+v, %v", id, d, err)
		}
	}
	if s := r.Stats().Leases; s.Untracked != 1 || s.Held != 1 {
		t.Fatalf("Stats.Leases = %+v; want one held, one untracked", s)
	}
	if err := pct.Set(100); err != nil {
		t.Fatal(err)
	}
	ok, d, err := r.Release(ctx, "k", p, 32, t0)
	if err != nil || !ok || d.Used != 1 {
		t.Fatalf("Release of the untracked lease = %v, %+v, %v; want held by old, one left", ok, d, err)
	}
	if s := r.Stats().Leases; s.Unknown != 1 || s.OldReleases != 1 || s.NewReleases != 1 {
		t.Fatalf("Stats.Leases = %+v; want the untracked lease released to both", s)
	}

	// Lease 16 expires at t0+1s, unreleased; at t0+1s an Acquire in its
	// shard sweeps it away and takes its place.
	if err := pct.Set(0); err != nil {
		t.Fatal(err)
	}
	if d, err := r.Acquire(ctx, "k", p, 48, t0.Add(time.Second)); err != nil || !d.Allowed {
		t.Fatalf("Acquire 48 = %+v, %v", d, err)
	}
	if s := r.Stats().Leases; s.Held != 1 || s.Untracked != 1 {
		t.Fatalf("Stats.Leases = %+v; want the expired entry swept, 48 held", s)
	}
}

// Entries of expired leases go within sweepEvery even when the table is not
// full.
func TestRouterForgetsExpiredLeases(t *testing.T) {
	ctx := context.Background()
	r := router(t, mem(t), mem(t), percent(t, 50), nil)
	p := throttler.Concurrent(100, time.Second)
	for id := range throttler.LeaseID(leaseShards) {
		if _, err := r.Acquire(ctx, "k", p, id+1, t0); err != nil {
			t.Fatal(err)
		}
	}
	if s := r.Stats().Leases; s.Held != leaseShards {
		t.Fatalf("Held = %d, want %d", s.Held, leaseShards)
	}
	later := t0.Add(time.Second + time.Duration(sweepEvery)*time.Millisecond)
	for id := range throttler.LeaseID(leaseShards) {
		if _, err := r.Acquire(ctx, "other", p, id+100, later); err != nil {
			t.Fatal(err)
		}
	}
	if s := r.Stats().Leases; s.Held != leaseShards {
		t.Fatalf("Held = %d, want %d: the expired leases' entries swept, the new ones kept", s.Held, leaseShards)
	}
}

// An unknown lease's Release reports the backend that held it, or a
// failure of the other when neither answered that it did.
func TestRouterUnknownReleaseErrors(t *testing.T) {
	ctx := context.Background()
	down := errors.New("connection refused")
	r := router(t, mem(t), failingLeases{failing{down}}, percent(t, 0), nil)
	ok, _, err := r.Release(ctx, "k", exports, 9, t0)
	if ok || !errors.Is(err, down) {
		t.Fatalf("Release = %v, %v; want the new backend's failure", ok, err)
	}
	if _, err := r.Acquire(ctx, "k", exports, 0, t0); !errors.Is(err, throttler.ErrInvalidLease) || err.Error() != "throttler: invalid lease: lease ID 0" {
		t.Fatalf("Acquire of lease 0 = %v; want the backend's input error as it is", err)
	}
}

// failingLeases fails every lease call.
type failingLeases struct{ failing }

func (f failingLeases) Acquire(context.Context, string, throttler.ConcurrencyPolicy, throttler.LeaseID, time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, f.err
}

func (f failingLeases) Release(context.Context, string, throttler.ConcurrencyPolicy, throttler.LeaseID, time.Time) (bool, throttler.Decision, error) {
	return false, throttler.Decision{}, f.err
}

// Through a Throttler, while the rollout ramps back and forth: every lease
// goes back to where it was granted, and the table ends empty.
func TestRouterLeasesUnderARamp(t *testing.T) {
	old, new := mem(t), mem(t)
	pct := percent(t, 0)
	r := router(t, old, new, pct, nil)
	th, err := throttler.New(r, &throttler.Options{Clock: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	p := throttler.Concurrent(1000, time.Minute)
	stop := make(chan struct{})
	var ramp sync.WaitGroup
	ramp.Add(1)
	go func() {
		defer ramp.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := pct.Set(i % 101); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				key := "k" + strconv.Itoa((g*200+i)%17)
				l, d, err := th.Acquire(context.Background(), key, p)
				if err != nil || !d.Allowed || d.Degraded {
					t.Errorf("Acquire = %+v, %v", d, err)
					return
				}
				if ok, _, err := l.Release(context.Background()); err != nil || !ok {
					t.Errorf("Release = %v, %v; want held", ok, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	ramp.Wait()
	s := r.Stats().Leases
	if s.Held != 0 || s.Unknown != 0 || s.OldAcquires+s.NewAcquires != 1600 || s.OldReleases+s.NewReleases != 1600 {
		t.Fatalf("Stats.Leases = %+v", s)
	}
	for k := range 17 {
		for _, b := range []throttler.LeaseBackend{old, new} {
			d, err := b.Acquire(context.Background(), "k"+strconv.Itoa(k), p, 1<<60, t0)
			if err != nil || d.Used != 1 {
				t.Fatalf("key k%d: %+v, %v; want no lease left behind", k, d, err)
			}
		}
	}
}

func TestNewRouterRejectsNegativeMaxLeases(t *testing.T) {
	_, err := NewRouter(mem(t), mem(t), percent(t, 0), &RouterOptions{MaxLeases: -1})
	if err == nil || err.Error() != "flags: RouterOptions.MaxLeases is -1; want 0 (default 65536) or more" {
		t.Fatalf("err = %v", err)
	}
}

// Through a Throttler, a Router's lease calls have a breaker per backend:
// the old store failing opens its own, and keys on the new store keep their
// limit.
func TestOldStoreDownKeepsTheNewOnesLeasesLimited(t *testing.T) {
	down := failingLeases{failing{throttler.StoreFailure("", errors.New("old store: connection refused"))}}
	rt := router(t, down, mem(t), percent(t, 50), nil)
	var obs []throttler.Observation
	th, err := throttler.New(rt, &throttler.Options{Clock: func() time.Time { return t0 }, BreakerThreshold: 1,
		Observe: func(o throttler.Observation) { obs = append(obs, o) }})
	if err != nil {
		t.Fatal(err)
	}
	p := throttler.ConcurrencyPolicy{Name: "exports", Limit: 2, TTL: time.Minute}
	ctx := context.Background()
	var onNew []string
	for i := range 50 {
		key := "user-" + strconv.Itoa(i)
		if rt.rollout.UseNew(key) {
			onNew = append(onNew, key)
			continue
		}
		_, d, err := th.Acquire(ctx, key, p)
		if err != nil || !d.Degraded {
			t.Fatalf("%q on the failing store: %+v, %v; want failed open", key, d, err)
		}
		if o := obs[len(obs)-1]; o.Store != "old" || o.Source != throttler.SourceFailureMode {
			t.Fatalf("observed %+v; want old's failure", o)
		}
	}
	if len(onNew) == 0 {
		t.Fatal("no key on the new store")
	}
	for _, key := range onNew {
		granted := 0
		for range 3 {
			_, d, err := th.Acquire(ctx, key, p)
			if err != nil || d.Degraded {
				t.Fatalf("%q on the healthy store: %+v, %v", key, d, err)
			}
			if d.Allowed {
				granted++
			}
		}
		if granted != 2 {
			t.Errorf("%q: %d granted, want 2", key, granted)
		}
		if o := obs[len(obs)-1]; o.Store != "new" {
			t.Fatalf("observed store %q, want new", o.Store)
		}
	}
}
