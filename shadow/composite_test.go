package shadow

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/throttler"
)

// oneAtATime is a store that takes no composites.
type oneAtATime struct{ throttler.Backend }

// A shadow takes composites when both sides do, mirrors them as they are,
// and compares each member's Decision.
func TestShadowComposites(t *testing.T) {
	assert.False(t, newShadow(t, mem(t), oneAtATime{mem(t)}, nil).Traits().Composites)
	assert.False(t, newShadow(t, oneAtATime{mem(t)}, mem(t), nil).Traits().Composites)
	candidate := mem(t)
	results := make(chan Result, 4)
	s := newShadow(t, mem(t), candidate, &Options{Publish: func(r Result) { results <- r }})
	require.True(t, s.Traits().Composites)
	c := throttler.All(throttler.PerSecond(1).Named("s"), throttler.PerHour(5).Named("h"))
	now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	d, err := s.Take(context.Background(), "k", c, 1, now)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	r := <-results
	assert.False(t, r.Mismatch(), "%+v", r)
	assert.True(t, r.compared())
	h, err := candidate.Peek(context.Background(), "k", throttler.PerHour(5).Named("h"), now)
	require.NoError(t, err)
	assert.Equal(t, int64(1), h.Used, "the candidate counted the mirrored composite")
}

// TestCompareMembers: a difference in one member alone, which the
// composite's own fields hide, is a difference; so is a side without
// members.
func TestCompareMembers(t *testing.T) {
	at := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	d := func(limit, used int64) throttler.Decision {
		return throttler.Decision{Allowed: true, Limit: limit, Used: used, Remaining: limit - used, ResetAt: at}
	}
	control := throttler.Combine([]throttler.Decision{d(2, 2), d(100, 10)})
	candidate := throttler.Combine([]throttler.Decision{d(2, 2), d(100, 40)})
	assert.Equal(t, Kind(0), compare(control, control, 0, 0))
	assert.Equal(t, UsedDiffers, compare(control, candidate, 0, 0), "the hidden member differs")
	assert.Equal(t, Kind(0), compare(control, candidate, 30, 0), "within UsedTolerance")
	assert.NotZero(t, compare(control, d(2, 2), 0, 0)&AllowedDiffers, "one side is no composite")
}
