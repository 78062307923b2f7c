package migration

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/throttler"
)

// A Migration's methods are its own: nothing of the router it is built on
// is promoted. A promoted AcquireOn granted a lease on the new store for a
// key the rollout put on the old one.
func TestMigrationMethods(t *testing.T) {
	want := []string{
		"Acquire", "Close", "Flush", "Peek", "Refund", "Release", "Stats", "Take", "Traits",
	}
	typ := reflect.TypeFor[*Migration]()
	var got []string
	for i := range typ.NumMethod() {
		got = append(got, typ.Method(i).Name)
	}
	if !slices.Equal(got, want) {
		t.Errorf("methods %v, want %v", got, want)
	}
}

// countingPercent counts how often a call reads the rollout.
type countingPercent struct {
	pct   *flags.Percent
	reads atomic.Int64
}

func (c *countingPercent) UseNew(key string) bool { c.reads.Add(1); return c.pct.UseNew(key) }
func (c *countingPercent) Percent() int           { c.reads.Add(1); return c.pct.Percent() }
func (c *countingPercent) GroupID() string        { return c.pct.GroupID() }

// A call reads the rollout once, whether or not its key is moving, and
// through a Throttler too.
func TestRolloutReadOncePerCall(t *testing.T) {
	ctx := context.Background()
	r := &countingPercent{pct: percent(t, 0)}
	var clk monoClock
	m := clk.migration(t, mem(t), mem(t), r, nil)
	p := throttler.PerMinute(3).Named("api")
	lease := throttler.ConcurrencyPolicy{Name: "exports", Limit: 1, TTL: time.Minute}
	th, err := throttler.New(m, &throttler.Options{Clock: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	calls := []struct {
		name string
		call func(key string) error
	}{
		{"Take", func(key string) error { _, err := m.Take(ctx, key, p, 1, t0); return err }},
		// A Throttler names the store and sends the call from one reading.
		{"Allow through a Throttler", func(key string) error { _, err := th.Allow(ctx, key, p); return err }},
		{"Peek", func(key string) error { _, err := m.Peek(ctx, key, p, t0); return err }},
		{"Acquire", func(key string) error { _, err := m.Acquire(ctx, key, lease, 1, t0); return err }},
	}
	for _, stage := range []string{"steady", "moving"} {
		if stage == "moving" {
			_ = r.pct.Set(100)
		}
		for _, c := range calls {
			before := r.reads.Load()
			if err := c.call(keyIn(t, 0, 100)); err != nil {
				t.Fatal(err)
			}
			if n := r.reads.Load() - before; n != 1 {
				t.Errorf("%s, %s: the rollout was read %d times", stage, c.name, n)
			}
		}
	}
	if m.Stats().Moving.Calls == 0 {
		t.Error("no call was a moving key's")
	}
}

// stamped embeds a Migration, promoting its Traits, and counts its Takes.
type stamped struct {
	*Migration
	takes atomic.Int64
}

func (s *stamped) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	s.takes.Add(1)
	return s.Migration.Take(ctx, key, p, cost, now)
}

// A Throttler over a wrapper that embeds a Migration calls the wrapper:
// the router's Route, promoted with Traits, only names the store.
func TestThrottlerCallsAWrapperOfAMigration(t *testing.T) {
	var clk monoClock
	w := &stamped{Migration: clk.migration(t, mem(t), mem(t), percent(t, 50), nil)}
	th, err := throttler.New(w, &throttler.Options{Clock: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := th.Allow(context.Background(), fmt.Sprint("user-", i), throttler.PerMinute(3)); err != nil {
			t.Fatal(err)
		}
	}
	if n := w.takes.Load(); n != 10 {
		t.Errorf("the wrapper made %d of 10 Takes", n)
	}
}
