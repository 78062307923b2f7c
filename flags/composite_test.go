package flags

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

// A Router takes composites when both its backends do, and hands one as it
// is to the backend its key is routed to.
func TestRouterComposites(t *testing.T) {
	old, next := mem(t), mem(t)
	r, err := NewRouter(old, next, percent(t, 100), nil)
	require.NoError(t, err)
	assert.True(t, r.Traits().Composites)
	c := throttler.All(throttler.PerSecond(1).Named("s"), throttler.PerHour(5).Named("h"))
	now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	d, err := r.Take(context.Background(), "k", c, 1, now)
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	h, err := next.Peek(context.Background(), "k", throttler.PerHour(5).Named("h"), now)
	require.NoError(t, err)
	assert.Equal(t, int64(1), h.Used, "the new backend, the key's, counted the composite")
	for _, r := range []struct{ old, new throttler.Backend }{{oneAtATime{old}, next}, {old, oneAtATime{next}}} {
		rt, err := NewRouter(r.old, r.new, percent(t, 0), nil)
		require.NoError(t, err)
		assert.False(t, rt.Traits().Composites, "one backend takes none")
	}
}
