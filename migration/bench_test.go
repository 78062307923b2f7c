package migration

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/internal/cputime"
	"github.com/throttlekit/throttlekit/throttler"
)

// nop answers at once, so that a figure is the wrapper's own cost.
type nop struct{ _ int }

func (*nop) Take(_ context.Context, _ string, p throttler.Policy, _ int64, now time.Time) (throttler.Decision, error) {
	return throttler.Decision{Allowed: true, Limit: p.Limit, ResetAt: now}, nil
}
func (*nop) Peek(_ context.Context, _ string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	return throttler.Decision{Allowed: true, Limit: p.Limit, ResetAt: now}, nil
}
func (*nop) Refund(_ context.Context, _ string, p throttler.Policy, _ int64, _, now time.Time) (throttler.Decision, error) {
	return throttler.Decision{Allowed: true, Limit: p.Limit, ResetAt: now}, nil
}

// nopLocal is nop saying its calls never block, as the memory backend
// does: a moving key's two calls are then made one after the other.
type nopLocal struct{ nop }

func (*nopLocal) Traits() throttler.Traits { return throttler.Traits{InProcess: true} }

// BenchmarkTake: the cost of a call through a Migration whose stores answer
// at once, mirroring off. "router" is what a Migration was before moving
// keys (flags.Router over the shadows), measured in the same run: compare
// the others with it. "steady": no change seen yet (the shadow stage).
// "changed": a change was seen (3h ago), so a call also reads the
// monotonic clock (the ticker's copy) and the history; no key is moving. "moving": every key moving
// (0% → 100% just now), calls on both stores, one after the other
// (in-process stores) or at once (stores that may block: a goroutine each).
func BenchmarkTake(b *testing.B) {
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "user-" + strconv.Itoa(i*7919)
	}
	fixed := throttler.PerHour(5000).Named("api")
	bucket := throttler.PerSecond(100).WithBurst(5000).Named("rate")
	now := time.Unix(1e9, 0)
	run := func(name string, be throttler.Backend, p throttler.Policy) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			start := cputime.Thread()
			for i := 0; b.Loop(); i++ {
				_, _ = be.Take(ctx, keys[i&1023], p, 1, now)
			}
			b.ReportMetric(float64(cputime.Thread()-start)/float64(b.N), "cpu-ns/op")
		})
		b.Run(name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			b.RunParallel(func(pb *testing.PB) {
				for i := 0; pb.Next(); i++ {
					_, _ = be.Take(ctx, keys[i&1023], p, 1, now)
				}
			})
		})
	}
	build := func(old, nw throttler.Backend, r flags.Rollout, o *Options) *Migration {
		m, err := New(old, nw, r, o)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = m.Close() })
		return m
	}

	pct := percent(b, 50)
	steady := build(&nop{}, &nop{}, pct, nil)
	plain, err := flags.NewRouter(steady.forward, steady.reverse, pct, nil)
	if err != nil {
		b.Fatal(err)
	}
	run("router", plain, fixed)
	run("steady", steady, fixed)

	// A change seen 3h ago: the history holds a mark, so every call reads
	// the (ticker's) monotonic clock, and finds the mark too old.
	r := percent(b, 40)
	changed := build(&nop{}, &nop{}, r, nil)
	_ = r.Set(50)
	_, _ = changed.Take(context.Background(), keys[0], fixed, 1, now) // sees the change
	h := changed.moves.hist.Load()
	changed.moves.hist.Store(&history{cur: h.cur, marks: []mark{{lo: 40, hi: 40, until: h.marks[0].until - 3*time.Hour}}})
	run("changed", changed, fixed)

	for _, local := range []bool{true, false} {
		r := percent(b, 0)
		var old, nw throttler.Backend = &nop{}, &nop{}
		name := "moving/blocking"
		if local {
			old, nw, name = &nopLocal{}, &nopLocal{}, "moving/in-process"
		}
		m := build(old, nw, r, nil)
		_ = r.Set(100)
		run(name+"/fixed", m, fixed)
		run(name+"/bucket", m, bucket)
	}
}

// BenchmarkTakeComposite: a composite of a fixed window and a bucket beside
// its fixed window alone, through a Migration over two memory stores,
// mirroring off: "still", the key on one store; "moving", every key moving
// (0% → 100% just now), the composite taken on old, then its members on
// new at their own instants (the fixed window's at its window's start).
func BenchmarkTakeComposite(b *testing.B) {
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "user-" + strconv.Itoa(i*7919)
	}
	fixed := throttler.PerHour(1 << 40).Named("api")
	c := throttler.All(fixed, throttler.PerSecond(1<<20).WithBurst(1<<30).Named("rate"))
	now := time.Unix(1e9, 0)
	for _, moving := range []bool{false, true} {
		r := percent(b, 0)
		m, err := New(mem(b), mem(b), r, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = m.Close() })
		name := "still"
		if moving {
			name = "moving"
			_ = r.Set(100)
		}
		for _, p := range []throttler.Policy{fixed, c} {
			kind := "fixed"
			if p.Composite() {
				kind = "composite"
			}
			b.Run(name+"/"+kind, func(b *testing.B) {
				b.ReportAllocs()
				ctx := context.Background()
				for i := 0; b.Loop(); i++ {
					if _, err := m.Take(ctx, keys[i&1023], p, 1, now); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
