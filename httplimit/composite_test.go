package httplimit_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/httplimit"
	"github.com/throttlekit/throttlekit/internal/sleep"
	"github.com/throttlekit/throttlekit/throttler"
)

// oneAtATime is a store that takes no composites.
type oneAtATime struct{ throttler.Backend }

// TestRateComposite: a login limited to 1 a second and 100 an hour. The
// headers are the binding member's, the IETF ones list both; a denied
// request spends nothing in the hour; a 304 refunds both.
func TestRateComposite(t *testing.T) {
	clock := sleep.NewFake(t0.Add(250 * time.Millisecond))
	store := newMemory(t)
	th := newThrottler(t, store, &throttler.Options{Clock: clock.Now})
	hour := throttler.PerHour(100).Named("login-h")
	login := throttler.All(throttler.PerSecond(1).Named("login-s"), hour)
	h := newRate(t, th, login, httplimit.KeyByHeader("X-Client"), &httplimit.Options{IETFHeaders: true})(etagHandler)
	unix := func(d time.Duration) string { return strconv.FormatInt(t0.Add(d).Unix(), 10) }

	w := serve(h)
	assert.Equal(t, 200, w.Code)
	assert.Equal(t, "login-s", w.Header().Get("X-RateLimit-Resource"), "the second binds: nothing left")
	assert.Equal(t, "1", w.Header().Get("X-RateLimit-Limit"))
	assert.Equal(t, "0", w.Header().Get("X-RateLimit-Remaining"))
	assert.Equal(t, unix(2*time.Second), w.Header().Get("X-RateLimit-Reset"), "the second's window ends at +1.25s")
	assert.Equal(t, `"login-s";q=1;w=1, "login-h";q=100;w=3600`, w.Header().Get("RateLimit-Policy"))
	assert.Equal(t, `"login-s";r=0;t=1`, w.Header().Get("RateLimit"))

	clock.Add(500 * time.Millisecond)
	w = serve(h)
	assert.Equal(t, 429, w.Code)
	assert.Equal(t, "1", w.Header().Get("Retry-After"))
	assert.Contains(t, w.Body.String(), "rate limit exceeded: 1 per 1s")
	d, err := store.Peek(context.Background(), "alice", hour, clock.Now())
	require.NoError(t, err)
	assert.Equal(t, int64(1), d.Used, "the denied request spent nothing in the hour")

	clock.Add(500 * time.Millisecond)
	w = serve(h, "If-None-Match", `"v1"`)
	assert.Equal(t, 304, w.Code)
	assert.Equal(t, "1", w.Header().Get("X-RateLimit-Remaining"), "refunded before the headers went out")
	d, err = store.Peek(context.Background(), "alice", hour, clock.Now())
	require.NoError(t, err)
	assert.Equal(t, int64(1), d.Used, "the hour got the 304's unit back")
}

// A composite on a Throttler that takes none is refused when the middleware
// is built.
func TestRateRefusesACompositeItCannotTake(t *testing.T) {
	c := throttler.All(throttler.PerSecond(1).Named("s"), throttler.PerHour(9).Named("h"))
	th := newThrottler(t, oneAtATime{newMemory(t)}, nil)
	_, err := httplimit.Rate(th, c, httplimit.KeyByHeader("X-Client"), nil)
	assert.ErrorIs(t, err, throttler.ErrInvalidPolicy)
	_, err = httplimit.Rate(newThrottler(t, newMemory(t), nil), c, httplimit.KeyByHeader("X-Client"), nil)
	assert.NoError(t, err)
}
