package algo_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/internal/algo"
	"github.com/throttlekit/throttlekit/throttler"
)

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
