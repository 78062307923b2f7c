package migration

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/backend/backendtest"
	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/leasetest"
	"github.com/throttlekit/throttlekit/throttler"
)

var one = throttler.ConcurrencyPolicy{Name: "exports", Limit: 1, TTL: time.Minute}

func TestLeaseConformance(t *testing.T) {
	for _, pct := range []int{0, 50, 100} {
		t.Run(fmt.Sprint(pct), func(t *testing.T) {
			stores := map[string][2]*memory.Backend{}
			var mu sync.Mutex
			backendtest.RunLeases(t, func(t *testing.T) backendtest.LeaseStore {
				mu.Lock()
				defer mu.Unlock()
				s, ok := stores[t.Name()]
				if !ok { // every backend of one case reaches the same stores
					s = [2]*memory.Backend{mem(t), mem(t)}
					stores[t.Name()] = s
				}
				r := percent(t, pct)
				r.SetMirror(true)
				return newMigration(t, s[0], s[1], r, nil)
			})
		})
	}
}

// noLeases is a Backend without leases.
type noLeases struct{ throttler.Backend }

func TestMigrationHoldsLeasesWhenBothStoresDo(t *testing.T) {
	for _, tc := range []struct {
		name     string
		old, new throttler.Backend
		want     bool
	}{
		{"both", mem(t), mem(t), true},
		{"old without", noLeases{mem(t)}, mem(t), false},
		{"new without", mem(t), noLeases{mem(t)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMigration(t, tc.old, tc.new, percent(t, 50), nil)
			th, err := throttler.New(m, nil)
			if err != nil {
				t.Fatal(err)
			}
			if m.Traits().Leases != tc.want || th.SupportsLeases() != tc.want {
				t.Fatalf("Traits().Leases %v, SupportsLeases %v; want %v", m.Traits().Leases, th.SupportsLeases(), tc.want)
			}
			if _, err := m.Acquire(context.Background(), "k", one, 1, t0); tc.want != (err == nil) || !tc.want && !errors.Is(err, throttler.ErrLeasesUnsupported) {
				t.Fatalf("Acquire: %v", err)
			}
		})
	}
}

// A lease granted before a change of percentage is released on the store
// that granted it, and, mirrored, on the other; a rollout that hides its
// percentage has no moving keys, so this is the router's path alone.
func TestLeaseReleasedWhereGranted(t *testing.T) {
	ctx := context.Background()
	for _, mirror := range []bool{true, false} {
		t.Run(fmt.Sprint("mirror=", mirror), func(t *testing.T) {
			old, new := mem(t), mem(t)
			r := percent(t, 0)
			r.SetMirror(mirror)
			m := newMigration(t, old, new, opaque{r}, nil)
			d, err := m.Acquire(ctx, "k", one, 5, t0)
			if err != nil || !d.Allowed {
				t.Fatalf("Acquire = %+v, %v", d, err)
			}
			flushed(t, m)
			wantNew := int64(0)
			if mirror {
				wantNew = 1
			}
			if o, n := leasetest.Holds(t, old, "k", one, t0), leasetest.Holds(t, new, "k", one, t0); o != 1 || n != wantNew {
				t.Fatalf("old holds %d, new %d; want 1, %d", o, n, wantNew)
			}
			_ = r.Set(100)
			held, _, err := m.Release(ctx, "k", one, 5, t0.Add(time.Second))
			if err != nil || !held {
				t.Fatalf("Release = %v, %v; want held", held, err)
			}
			flushed(t, m)
			if o, n := leasetest.Holds(t, old, "k", one, t0.Add(time.Second)), leasetest.Holds(t, new, "k", one, t0.Add(time.Second)); o != 0 || n != 0 {
				t.Fatalf("old holds %d, new %d after the Release; want none", o, n)
			}
			st := m.Stats()
			if l := st.Routed.Leases; l.OldAcquires != 1 || l.OldReleases != 1 || l.NewAcquires+l.NewReleases != 0 || l.Held != 0 {
				t.Errorf("Routed.Leases = %+v", l)
			}
			if st.Routed.Old != 2 || st.Routed.New != 0 {
				t.Errorf("Routed = %+v; want the two lease calls on old", st.Routed)
			}
			if mirror && (st.Forward.Compared != 2 || st.Forward.Mismatched != 0) {
				t.Errorf("Forward = %+v; want both lease calls compared, alike", st.Forward)
			}
		})
	}
}

func flushed(t *testing.T, m *Migration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

// A key a change moves is moving for the lease's TTL plus Settle: its
// Acquire is made on both stores, so a lease the store it moves to never
// saw (the mirror was off, or lagged) still counts; its Release goes to
// both.
func TestMovingKeysLeases(t *testing.T) {
	ctx := context.Background()
	const settle = 5 * time.Second
	clock := &monoClock{}
	old, new := mem(t), mem(t)
	r := percent(t, 0) // mirror off: new never hears of old's leases
	m := clock.migration(t, old, new, r, &Options{Settle: settle})
	key := keyIn(t, 0, 50)

	if d, err := m.Acquire(ctx, key, one, 1, t0); err != nil || !d.Allowed {
		t.Fatalf("Acquire on old = %+v, %v", d, err)
	}
	_ = r.Set(50)
	d, err := m.Acquire(ctx, key, one, 2, t0)
	if err != nil || d.Allowed {
		t.Fatalf("Acquire of the moving key = %+v, %v; want denied: old holds the limit", d, err)
	}
	if n := leasetest.Holds(t, new, key, one, t0); n != 0 {
		t.Fatalf("new holds %d leases; want the one it granted alone released", n)
	}
	if st := m.Stats().Moving; st.Calls != 1 || st.Compensated != 1 {
		t.Fatalf("Moving = %+v", st)
	}
	held, _, err := m.Release(ctx, key, one, 1, t0.Add(time.Second))
	if err != nil || !held {
		t.Fatalf("Release of the moving key = %v, %v", held, err)
	}
	d, err = m.Acquire(ctx, key, one, 3, t0.Add(time.Second))
	if err != nil || !d.Allowed {
		t.Fatalf("Acquire = %+v, %v; want granted on both", d, err)
	}
	if o, n := leasetest.Holds(t, old, key, one, t0.Add(time.Second)), leasetest.Holds(t, new, key, one, t0.Add(time.Second)); o != 1 || n != 1 {
		t.Fatalf("old holds %d, new %d; want the lease on both", o, n)
	}
	// Moving until TTL + Settle after the change. The lease granted on both
	// is not the router's: released on both stores, whenever.
	clock.set(one.TTL + settle - time.Nanosecond)
	if _, moving := m.moves.leaseRoute(key, one.TTL); !moving {
		t.Fatal("not moving before TTL + Settle")
	}
	clock.set(one.TTL + settle)
	if _, moving := m.moves.leaseRoute(key, one.TTL); moving {
		t.Fatal("still moving at TTL + Settle")
	}
	held, _, err = m.Release(ctx, key, one, 3, t0.Add(2*time.Second))
	if err != nil || !held {
		t.Fatalf("Release = %v, %v", held, err)
	}
	if o, n := leasetest.Holds(t, old, key, one, t0.Add(2*time.Second)), leasetest.Holds(t, new, key, one, t0.Add(2*time.Second)); o != 0 || n != 0 {
		t.Fatalf("old holds %d, new %d; want the lease released on both", o, n)
	}
}

// TestLeasesExactUnderARamp: goroutines acquire leases of a few keys and
// hold them, while two of them flip the percentage between 0 and 100 and
// the mirror's one-call queues drop; the moving keys' Acquires keep every
// key within its limit across both stores. With the percentage hidden (no
// moving keys) the same run grants more, which proves the check can fail.
// Run with -race.
func TestLeasesExactUnderARamp(t *testing.T) {
	p := throttler.Concurrent(5, time.Hour)
	flipRace(t, p.Limit, "more leases than its limit", func(m *Migration, key string, n int) (bool, error) {
		d, err := m.Acquire(context.Background(), key, p, throttler.LeaseID(n), t0)
		return d.Allowed, err
	})
}
