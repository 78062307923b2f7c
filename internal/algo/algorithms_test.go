package algo_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/backend/backendtest"
	"github.com/throttlekit/throttlekit/internal/algo"
	"github.com/throttlekit/throttlekit/internal/model"
	"github.com/throttlekit/throttlekit/throttler"
)

// A LogBuffer kept across calls answers as the reference model on long
// random traces: logs of hundreds of entries (so ended entries are dropped
// by index, the array is compacted and reused, and searches gallop), the
// clock stepping back (entries from the future) and jumping ahead, Peeks,
// Refunds and denied Takes. Log, which builds a buffer per call from a
// slice, answers the same.
func TestLogBufferMatchesModel(t *testing.T) {
	ctx := context.Background()
	for _, p := range []throttler.Policy{
		{Limit: 300, Window: 200 * time.Millisecond, Algorithm: throttler.SlidingLog},
		{Limit: 40, Window: 7 * time.Millisecond, Algorithm: throttler.SlidingLog},
		{Limit: 1, Window: time.Millisecond, Algorithm: throttler.SlidingLog},
	} {
		for seed := uint64(1); seed <= 6; seed++ {
			rng := rand.New(rand.NewPCG(seed, 11))
			m := model.NewModel()
			var buf algo.LogBuffer
			var log []algo.LogEntry
			now := backendtest.T0.UnixMilli()
			var receipts []int64 // of the latest admitted Takes
			for i := 0; i < 4000; i++ {
				switch r := rng.IntN(100); {
				case r < 80:
					now += int64(rng.IntN(3))
				case r < 92:
					now -= int64(rng.IntN(30))
				default:
					now += int64(rng.IntN(400))
				}
				op := []throttler.Op{throttler.OpTake, throttler.OpTake, throttler.OpTake, throttler.OpTake, throttler.OpPeek, throttler.OpRefund}[rng.IntN(6)]
				cost := 1 + rng.Int64N(min(p.Limit, 5))
				if rng.IntN(50) == 0 {
					cost = 1 + rng.Int64N(p.Limit) // a big one, often denied
				}
				// A Refund names one of the latest Takes, or one never made.
				r := now + 1 + rng.Int64N(p.Window.Milliseconds())
				if n := len(receipts); n > 0 && rng.IntN(8) != 0 {
					r = receipts[max(0, n-1-rng.IntN(4))]
				}
				msg := []any{"policy %v seed %d step %d: %v %d at %d, receipt %d", p, seed, i, op, cost, now, r}
				want, err := backend.Do(ctx, m, op, "k", p, cost, time.UnixMilli(r), time.UnixMilli(now))
				require.NoError(t, err)
				got, _ := buf.Apply(p, op, cost, r, now)
				if op == throttler.OpTake && got.Allowed {
					receipts = append(receipts, got.ResetAt.UnixMilli())
				}
				got.ResetAt = time.UnixMilli(got.ResetAt.UnixMilli())
				want.ResetAt = time.UnixMilli(want.ResetAt.UnixMilli())
				require.Equal(t, want, got, msg...)
				d, next, write := algo.Log(p, slices.Clone(log), op, cost, r, now)
				d.ResetAt = time.UnixMilli(d.ResetAt.UnixMilli())
				require.Equal(t, want, d, msg...)
				if write {
					log = next
				}
				if end, ok := m.End("k", p); ok && buf.Len() > 0 {
					require.Equal(t, end, buf.End(p), msg...)
				}
			}
		}
	}
}

// Take is Apply's admitted Take; a Take that does not fit changes nothing.
func TestLogBufferTake(t *testing.T) {
	p := throttler.Policy{Limit: 3, Window: 100 * time.Millisecond, Algorithm: throttler.SlidingLog}
	var l algo.LogBuffer
	used, resetAt, ok := l.Take(p, 2, 1000)
	require.True(t, ok)
	assert.Equal(t, int64(2), used)
	assert.Equal(t, int64(1100), resetAt)
	used, resetAt, ok = l.Take(p, 1, 1050)
	require.True(t, ok)
	assert.Equal(t, int64(3), used)
	assert.Equal(t, int64(1150), resetAt)
	assert.Equal(t, int64(1150), l.End(p))

	_, _, ok = l.Take(p, 1, 1099) // all three units still live
	require.False(t, ok)
	assert.Equal(t, 2, l.Len(), "a denied Take drops nothing")
	d, _ := l.Apply(p, throttler.OpPeek, 1, 0, 1099)
	assert.Equal(t, int64(3), d.Used)
	assert.Equal(t, time.Millisecond, d.RetryAfter, "the entry at 1000 ends at 1100")

	used, _, ok = l.Take(p, 2, 1100) // the entry at 1000 ended
	require.True(t, ok)
	assert.Equal(t, int64(3), used)
	assert.Equal(t, 2, l.Len(), "the ended entry was dropped")
	d, _ = l.Apply(p, throttler.OpPeek, 1, 0, 999)
	assert.Equal(t, int64(3), d.Used, "a clock behind sees the later entries, not the dropped one")
}
