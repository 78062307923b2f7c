package flags

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// namedStore is a backend that names one store, and fails every call as
// that store when err is set.
type namedStore struct {
	throttler.Backend
	name string
	err  error
}

func (s namedStore) Traits() throttler.Traits {
	return throttler.Traits{Store: func(throttler.Op, string, throttler.Policy) string { return s.name }}
}

func (s namedStore) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	if s.err != nil {
		return throttler.Decision{}, s.err
	}
	return s.Backend.Take(ctx, key, p, cost, now)
}

// peekStore names its Peeks' store apart, as a sharded Redis does its
// replicas.
type peekStore struct{ namedStore }

func (s peekStore) Traits() throttler.Traits {
	return throttler.Traits{Store: func(op throttler.Op, key string, p throttler.Policy) string {
		if op == throttler.OpPeek {
			return "replicas"
		}
		return s.name
	}}
}

// flags0 is a rollout that keeps every key on the old backend.
func flags0(t *testing.T) *Percent {
	pct, err := NewPercent(0)
	if err != nil {
		t.Fatal(err)
	}
	return pct
}

// The router names the store of the backend each key is routed to now: its
// own name for it, or the backend's name in the router for one that names
// none.
func TestRouterStoreIsTheRoutedBackends(t *testing.T) {
	pct, err := NewPercent(50)
	if err != nil {
		t.Fatal(err)
	}
	rt := router(t, namedStore{Backend: mem(t), name: "redis shard 0"}, mem(t), pct, &RouterOptions{NewName: "memory"})
	p := throttler.PerMinute(1)
	seen := map[string]int{}
	for i := range 200 {
		key := fmt.Sprint("user-", i)
		want := "redis shard 0"
		if rt.rollout.UseNew(key) {
			want = "memory"
		}
		if got := rt.Traits().Store(throttler.OpTake, key, p); got != want {
			t.Fatalf("%q: Store %q, want %q", key, got, want)
		}
		seen[want]++
	}
	if len(seen) != 2 {
		t.Errorf("stores %v, want both at 50%%", seen)
	}
	if err := pct.Set(100); err != nil {
		t.Fatal(err)
	}
	if got := rt.Traits().Store(throttler.OpTake, "user-0", p); got != "memory" {
		t.Errorf("at 100%%: Store %q, want the new backend's", got)
	}

	// The op is passed on: a backend may name its Peeks' store apart.
	peeks := router(t, peekStore{namedStore{Backend: mem(t), name: "primary"}}, mem(t), flags0(t), nil)
	if got := peeks.Traits().Store(throttler.OpPeek, "k", p); got != "replicas" {
		t.Errorf("Peek: Store %q, want the routed backend's name for Peeks", got)
	}
}

// Through a router, each backend has its own breaker: the old store
// failing never makes the keys already on the new store fail open.
func TestOldStoreDownKeepsTheNewOnesKeysLimited(t *testing.T) {
	pct, err := NewPercent(50)
	if err != nil {
		t.Fatal(err)
	}
	down := namedStore{Backend: mem(t), err: throttler.StoreFailure("", fmt.Errorf("old store: connection refused"))}
	rt := router(t, down, mem(t), pct, nil)
	th, err := throttler.New(rt, &throttler.Options{Clock: func() time.Time { return t0 }, BreakerThreshold: 1})
	if err != nil {
		t.Fatal(err)
	}
	p := throttler.PerMinute(3).Named("api")
	ctx := context.Background()
	for i := range 50 { // half the keys, on old: its breaker opens
		if _, err := th.Allow(ctx, fmt.Sprint("user-", i), p); err != nil {
			t.Fatal(err)
		}
	}
	checked := 0
	for i := range 50 {
		key := fmt.Sprint("user-", i)
		if !rt.rollout.UseNew(key) {
			continue
		}
		checked++
		admitted := 0
		for range 5 {
			d, err := th.Allow(ctx, key, p)
			if err != nil || d.Degraded {
				t.Fatalf("%q on the healthy store: %+v, %v", key, d, err)
			}
			if d.Allowed {
				admitted++
			}
		}
		if admitted != 2 { // one was taken above
			t.Errorf("%q: %d more admitted, want 2", key, admitted)
		}
	}
	if checked == 0 {
		t.Fatal("no key on the new store")
	}
}

// flipping answers old and new in turn, as a rollout does when each of two
// readings falls on another side of a change; it counts its readings.
type flipping struct{ reads atomic.Int64 }

func (f *flipping) UseNew(string) bool { return f.reads.Add(1)%2 == 0 }

// A Throttler over a Router names each call's store (the breaker it
// consults and charges) from the same reading of the rollout that sends
// the call: the rollout is read once per call, and a change between two
// readings can never name one store and send the call to the other.
func TestThrottlerNamesTheStoreTheCallIsSentTo(t *testing.T) {
	r := &flipping{}
	rt := router(t, mem(t), mem(t), r, nil)
	var last throttler.Observation
	th, err := throttler.New(rt, &throttler.Options{Clock: func() time.Time { return t0 },
		Observe: func(o throttler.Observation) { last = o }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, p := context.Background(), throttler.PerMinute(100)
	calls := []struct {
		name string
		call func() error
	}{
		{"Allow", func() error { _, err := th.Allow(ctx, "k", p); return err }},
		{"Peek", func() error { _, err := th.Peek(ctx, "k", p); return err }},
	}
	for i := range 6 {
		c := calls[i%len(calls)]
		before, reads := rt.Stats(), r.reads.Load()
		if err := c.call(); err != nil {
			t.Fatal(err)
		}
		served := "old"
		if rt.Stats().New > before.New {
			served = "new"
		}
		if last.Store != served {
			t.Errorf("call %d (%s): named %q, sent to %q", i, c.name, last.Store, served)
		}
		if n := r.reads.Load() - reads; n != 1 {
			t.Errorf("call %d (%s): the rollout was read %d times", i, c.name, n)
		}
	}
}

// stampedRouter embeds a Router, promoting its Traits, and counts its
// Takes.
type stampedRouter struct {
	*Router
	takes int
}

func (s *stampedRouter) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	s.takes++
	return s.Router.Take(ctx, key, p, cost, now)
}

// A Throttler over a wrapper that embeds a Router calls the wrapper: the
// promoted Route only names the store.
func TestThrottlerCallsAWrapperOfARouter(t *testing.T) {
	w := &stampedRouter{Router: router(t, mem(t), mem(t), percent(t, 50), nil)}
	th, err := throttler.New(w, &throttler.Options{Clock: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := th.Allow(context.Background(), fmt.Sprint("user-", i), throttler.PerMinute(3)); err != nil {
			t.Fatal(err)
		}
	}
	if w.takes != 10 {
		t.Errorf("the wrapper made %d of 10 Takes", w.takes)
	}
}
