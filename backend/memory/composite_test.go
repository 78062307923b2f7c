package memory_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/throttler"
)

// BenchmarkComposite is BenchmarkTake's admitted Take on a hot key and on
// 100k keys, of one policy and of a composite of two (a per-hour and a
// per-day window), side by side: on stored state a composite's Take costs
// its members' Takes on slot copies, and the one allocation of the Decision
// that carries their Decisions.
func BenchmarkComposite(b *testing.B) {
	ctx := context.Background()
	one := throttler.Policy{Name: "bench", Limit: 1 << 40, Window: time.Hour}
	two := throttler.All(one, throttler.Policy{Name: "bench-day", Limit: 1 << 40, Window: 24 * time.Hour})
	keys := make([]string, 100_000)
	for i := range keys {
		keys[i] = fmt.Sprint("client-", i)
	}
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
