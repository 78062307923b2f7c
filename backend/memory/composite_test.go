package memory_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/cputime"
	"github.com/throttlekit/throttlekit/throttler"
)

// compositeBench is what the composite benchmarks take: one policy, the
// composite of it and another (an hour and a day), and 100k keys.
func compositeBench() (one, two throttler.Policy, keys []string) {
	one = throttler.Policy{Name: "bench", Limit: 1 << 40, Window: time.Hour}
	two = throttler.All(one, throttler.Policy{Name: "bench-day", Limit: 1 << 40, Window: 24 * time.Hour})
	keys = make([]string, 100_000)
	for i := range keys {
		keys[i] = fmt.Sprint("client-", i)
	}
	return one, two, keys
}

// BenchmarkComposite is BenchmarkTake's admitted Take on a hot key and on
// 100k keys, of one policy and of a composite of two (a per-hour and a
// per-day window), side by side: on stored state a composite's Take costs
// its members' Takes, each on a slot copy and then on the slot, and the
// Decisions built and combined.
func BenchmarkComposite(b *testing.B) {
	ctx := context.Background()
	one, two, keys := compositeBench()
	for _, n := range []int{1, len(keys)} {
		for _, bc := range []struct {
			name string
			p    throttler.Policy
		}{{"One", one}, {"Two", two}} {
			b.Run(fmt.Sprintf("%s/%dKeys", bc.name, n), func(b *testing.B) {
				m := newBackend(b, nil)
				for _, k := range keys[:n] {
					_, _ = m.Take(ctx, k, bc.p, 1, t0)
				}
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					if d, err := m.Take(ctx, keys[i%n], bc.p, 1, t0); err != nil || !d.Allowed {
						b.Fatal(d, err)
					}
				}
			})
		}
	}
}

// BenchmarkCompositeInterleaved times BenchmarkComposite's Takes as
// BenchmarkAlgorithmsInterleaved times the algorithms: one policy and the
// composite of two in turns of 1,000 calls, by the thread's CPU time, on a
// hot key and on 100k keys; it reports the medians and the median ratio.
func BenchmarkCompositeInterleaved(b *testing.B) {
	if !cputime.Supported {
		b.Skip("no thread CPU clock here")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ctx := context.Background()
	one, two, keys := compositeBench()
	type contender struct {
		name string
		m    *memory.Backend
		p    throttler.Policy
		keys []string
	}
	var cs []contender
	for _, n := range []int{1, len(keys)} {
		for _, c := range []struct {
			name string
			p    throttler.Policy
		}{{"one", one}, {"two", two}} {
			m := newBackend(b, nil)
			for _, k := range keys[:n] {
				_, _ = m.Take(ctx, k, c.p, 1, t0)
			}
			cs = append(cs, contender{fmt.Sprintf("%s-%dkeys", c.name, n), m, c.p, keys[:n]})
		}
	}
	const turn = 1000
	costs := make([][]float64, len(cs))
	i := 0
	for b.Loop() {
		for c := range cs {
			ct := &cs[c]
			start := cputime.Thread()
			for j := i; j < i+turn; j++ {
				if d, err := ct.m.Take(ctx, ct.keys[j%len(ct.keys)], ct.p, 1, t0); err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
			}
			costs[c] = append(costs[c], float64(cputime.Thread()-start)/turn)
		}
		i += turn
	}
	for c := range cs {
		b.ReportMetric(median(costs[c]), cs[c].name+"-cpu-ns/op")
		if c%2 == 1 {
			ratios := make([]float64, len(costs[c]))
			for r := range ratios {
				ratios[r] = costs[c][r] / costs[c-1][r]
			}
			b.ReportMetric(median(ratios), cs[c].name+"/one")
		}
	}
	b.ReportMetric(0, "ns/op")
}

// Several composites over one shard answer each by its own members: the
// shard's memo of the last composite never answers for another.
func TestCompositeMemoPerComposite(t *testing.T) {
	m := newBackend(t, nil)
	ctx := context.Background()
	a := throttler.All(throttler.PerMinute(3).Named("memo-a"), throttler.PerHour(9).Named("memo-h"))
	z := throttler.All(throttler.PerMinute(1).Named("memo-z"), throttler.PerHour(9).Named("memo-h"))
	for i, tt := range []struct {
		p       throttler.Policy
		allowed bool
		used    int64
	}{
		{a, true, 1}, {z, true, 1}, {a, true, 2}, {z, false, 1}, {a, true, 3}, {a, false, 3},
	} {
		d, err := m.Take(ctx, "k", tt.p, 1, t0)
		require.NoError(t, err)
		assert.Equal(t, tt.allowed, d.Allowed, "call %d", i)
		var used []int64
		for _, md := range d.Members() {
			used = append(used, md.Used)
		}
		assert.Equal(t, tt.used, used[0], "call %d: the first member's count", i)
	}
	h, err := m.Peek(ctx, "k", throttler.PerHour(9).Named("memo-h"), t0)
	require.NoError(t, err)
	assert.Equal(t, int64(4), h.Used, "the shared member counted the four admitted composites")
}

// TestCompositeUndoesWhatEvictionDenied: in a full shard, making room for
// one member's new state can move another member's into the second tier,
// into a cell shared with a stricter state, after the Peeks admitted the
// composite. The member then denies its Take, and what the earlier members
// took is refunded: the composite is denied and counts nothing.
func TestCompositeUndoesWhatEvictionDenied(t *testing.T) {
	m := newBackend(t, &memory.Options{Shards: 1, MaxKeys: 1})
	ctx := context.Background()
	b, other := throttler.PerHour(2).Named("undo-b"), throttler.PerHour(10).Named("undo-x")
	// x's state shares b's cell, and a's has one of its own, so a's count
	// stays exact while it is evicted.
	cell := memory.TierCell(m, "k", b)
	x, a := "", throttler.Policy{}
	for i := 0; x == ""; i++ {
		if k := fmt.Sprint("x", i); memory.TierCell(m, k, other) == cell {
			x = k
		}
	}
	for i := 0; a.Limit == 0; i++ {
		if p := throttler.PerHour(5).Named(fmt.Sprint("undo-a", i)); memory.TierCell(m, "k", p) != cell {
			a = p
		}
	}
	_, err := m.Take(ctx, x, other, 2, t0) // 2 counted, in the table
	require.NoError(t, err)
	_, err = m.Take(ctx, "k", b, 1, t0) // evicts x's state to the cell b's goes to
	require.NoError(t, err)
	d, err := m.Take(ctx, "k", throttler.All(a, b), 1, t0)
	require.NoError(t, err)
	assert.False(t, d.Allowed, "b's state came back from a cell that counts 2")
	got, err := m.Peek(ctx, "k", a, t0)
	require.NoError(t, err)
	assert.Zero(t, got.Used, "a's unit was refunded")
}
