package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/httplimit"
	"github.com/throttlekit/throttlekit/internal/sleep"
	"github.com/throttlekit/throttlekit/throttler"
)

// A 304 whose handler ran past the window's end is not refunded into the
// next window by the middleware.
func TestRateRefundsOnlyInTheTakesWindow(t *testing.T) {
	clock := sleep.NewFake(t0)
	th := newThrottler(t, newMemory(t), &throttler.Options{Clock: clock.Now})
	p := throttler.PerMinute(2)
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Slow") != "" {
			// The window ends, and another request opens the next one.
			clock.Add(time.Minute)
			d, err := th.Allow(r.Context(), "alice", p)
			require.NoError(t, err)
			require.Equal(t, int64(1), d.Used)
		}
		w.WriteHeader(http.StatusNotModified)
	})
	h := newRate(t, th, p, httplimit.KeyByHeader("X-Client"), nil)(slow)
	do := func(slow bool) int {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-Client", "alice")
		if slow {
			req.Header.Set("X-Slow", "1")
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	assert.Equal(t, 304, do(false)) // refunded: Used 0
	assert.Equal(t, 304, do(true))  // ends in the next window: not refunded there
	d, err := th.Peek(context.Background(), "alice", p)
	require.NoError(t, err)
	assert.Equal(t, int64(1), d.Used, "the next window was credited a unit it never counted")
}

// netStore is a backend over the network as the Throttler sees one (not in
// process, so its calls get the Timeout's context), that fails a call whose
// context is done, as a network store does, and records whether each
// Refund's context had a deadline.
type netStore struct {
	throttler.Backend
	refunds, bounded int
}

func (s *netStore) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	if err := ctx.Err(); err != nil {
		return throttler.Decision{}, err
	}
	return s.Backend.Take(ctx, key, p, cost, now)
}

func (s *netStore) Refund(ctx context.Context, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
	s.refunds++
	if _, ok := ctx.Deadline(); ok {
		s.bounded++
	}
	if err := ctx.Err(); err != nil {
		return throttler.Decision{}, err
	}
	return s.Backend.Refund(ctx, key, p, cost, receipt, now)
}

// TestRateRefundsAfterTheClientLeft: a client that disconnects while
// its 304 is written cancels the request's context; the refund still
// reaches the store, on a context without the cancellation and bounded by
// the Throttler's Timeout.
func TestRateRefundsAfterTheClientLeft(t *testing.T) {
	store := &netStore{Backend: newMemory(t)}
	th := newThrottler(t, store, &throttler.Options{Clock: func() time.Time { return t0 }, Timeout: time.Minute})
	p := throttler.PerMinute(2)
	h := newRate(t, th, p, httplimit.KeyByHeader("X-Client"), nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Context().Value(cancelKey{}).(context.CancelFunc)() // the client goes away
		w.WriteHeader(http.StatusNotModified)
	}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req := httptest.NewRequestWithContext(context.WithValue(ctx, cancelKey{}, cancel), http.MethodGet, "/", nil)
	req.Header.Set("X-Client", "alice")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)

	assert.Equal(t, http.StatusNotModified, w.Code)
	assert.Equal(t, "2", w.Header().Get("X-RateLimit-Remaining"), "the headers show the refund")
	assert.Equal(t, 1, store.refunds)
	assert.Equal(t, 1, store.bounded, "the refund's context has the Timeout's deadline")
	d, err := th.Peek(context.Background(), "alice", p)
	require.NoError(t, err)
	assert.Zero(t, d.Used, "the unit was not given back")
}

type cancelKey struct{}
