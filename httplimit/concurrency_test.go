package httplimit_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/httplimit"
	"github.com/throttlekit/throttlekit/throttler"
)

func newConcurrency(t testing.TB, th *throttler.Throttler, p throttler.ConcurrencyPolicy, o *httplimit.Options) func(http.Handler) http.Handler {
	t.Helper()
	mw, err := httplimit.Concurrency(th, p, httplimit.KeyByHeader("X-Client"), o)
	require.NoError(t, err)
	return mw
}

func TestConcurrencyRejects(t *testing.T) {
	th := newThrottler(t, newMemory(t), nil)
	noLeases := newThrottler(t, rateOnly{newMemory(t)}, nil)
	p := throttler.ConcurrencyPolicy{Name: "inflight", Limit: 2, TTL: time.Minute}
	key := httplimit.KeyByHeader("X-Client")
	var nilThrottler *throttler.Throttler
	const noThrottler = "httplimit: Concurrency needs a Throttler, built by throttler.New, whose backend holds leases (Throttler.SupportsLeases)"
	tests := []struct {
		name   string
		th     *throttler.Throttler
		p      throttler.ConcurrencyPolicy
		key    httplimit.KeyFunc
		o      *httplimit.Options
		want   string
		wantIs error
	}{
		{name: "nil Throttler", th: nilThrottler, p: p, key: key, want: noThrottler},
		{name: "zero Throttler", th: &throttler.Throttler{}, p: p, key: key, want: noThrottler},
		{name: "no leases", th: noLeases, p: p, key: key, want: noThrottler},
		{name: "zero policy", th: th, p: throttler.ConcurrencyPolicy{}, key: key, wantIs: throttler.ErrInvalidPolicy,
			want: "throttler: invalid policy: concurrency limit must be between 1 and 10000, got 0"},
		{name: "nil KeyFunc", th: th, p: p, want: "httplimit: Concurrency needs a KeyFunc, got nil"},
		{name: "DeniedStatus 200", th: th, p: p, key: key, o: &httplimit.Options{DeniedStatus: 200},
			want: "httplimit: Options.DeniedStatus must be a 4xx or 5xx status, got 200"},
	}
	for _, tc := range tests {
		mw, err := httplimit.Concurrency(tc.th, tc.p, tc.key, tc.o)
		assert.EqualError(t, err, tc.want, tc.name)
		if tc.wantIs != nil {
			assert.ErrorIs(t, err, tc.wantIs, tc.name)
		}
		assert.Nil(t, mw, tc.name)
	}
	_, err := httplimit.Concurrency(th, p, key, &httplimit.Options{DeniedStatus: 503})
	assert.NoError(t, err)
}

// TestConcurrencyHoldsALeaseWhileTheHandlerRuns: a second request of a
// client with one in flight is refused, with the limit's headers, while
// another client's passes; once the first ends, its slot is free again.
func TestConcurrencyHoldsALeaseWhileTheHandlerRuns(t *testing.T) {
	th := newThrottler(t, newMemory(t), &throttler.Options{Clock: func() time.Time { return t0 }})
	var h http.Handler
	var nested []*httptest.ResponseRecorder
	reached := 0
	h = newConcurrency(t, th, throttler.ConcurrencyPolicy{Name: "inflight", Limit: 1, TTL: 10 * time.Second}, nil)(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			reached++
			if r.Header.Get("X-Client") == "alice" && len(nested) == 0 {
				nested = append(nested, serve(h, "X-Client", "alice"), serve(h, "X-Client", "bob"))
			}
		}))

	w := serve(h, "X-Client", "alice")
	assert.Equal(t, http.StatusOK, w.Code)
	assert.Empty(t, w.Header().Get("X-RateLimit-Limit"), "an admitted request gets no header from Concurrency")
	require.Len(t, nested, 2)
	refused := nested[0]
	assert.Equal(t, http.StatusTooManyRequests, refused.Code)
	assert.Equal(t, "too many concurrent requests: at most 1 in flight; retry in 10s\n", refused.Body.String())
	for k, v := range map[string]string{
		"X-RateLimit-Resource": "inflight", "X-RateLimit-Limit": "1", "X-RateLimit-Remaining": "0",
		"X-RateLimit-Used": "1", "Retry-After": "10", "X-RateLimit-Reset": fmt.Sprint(t0.Add(10 * time.Second).Unix()),
	} {
		assert.Equal(t, v, refused.Header().Get(k), k)
	}
	assert.Equal(t, http.StatusOK, nested[1].Code, "another client's request")
	assert.Equal(t, 2, reached, "alice's first and bob's")
	assert.Equal(t, http.StatusOK, serve(h, "X-Client", "alice").Code, "released when the handler returned")
}

func TestConcurrencyDeniedStatusIsConfigurable(t *testing.T) {
	th := newThrottler(t, newMemory(t), nil)
	p := throttler.Concurrent(1, time.Minute)
	_, _, err := th.Acquire(context.Background(), "alice", p)
	require.NoError(t, err)
	w := serve(newConcurrency(t, th, p, &httplimit.Options{DeniedStatus: http.StatusServiceUnavailable})(etagHandler), "X-Client", "alice")
	assert.Equal(t, http.StatusServiceUnavailable, w.Code)
}

// A handler that panics still gives its lease back, and the panic goes on
// up to the server.
func TestConcurrencyReleasesOnPanic(t *testing.T) {
	th := newThrottler(t, newMemory(t), nil)
	p := throttler.Concurrent(1, time.Minute)
	h := newConcurrency(t, th, p, nil)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("handler bug") }))
	func() {
		defer func() { assert.Equal(t, "handler bug", recover()) }()
		serve(h, "X-Client", "alice")
	}()
	_, d, err := th.Acquire(context.Background(), "alice", p)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "the panicking request's lease is still held")
}

// A client that disconnects while its handler runs cancels the request's
// context; the lease still goes back to the store, on a context without
// the cancellation and bounded by the Throttler's Timeout.
func TestConcurrencyReleasesAfterTheClientLeft(t *testing.T) {
	store := newNetLeases(t)
	th := newThrottler(t, store, &throttler.Options{Timeout: time.Minute})
	p := throttler.Concurrent(1, time.Minute)
	h := newConcurrency(t, th, p, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Context().Value(cancelKey{}).(context.CancelFunc)() // the client goes away
	}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req := httptest.NewRequestWithContext(context.WithValue(ctx, cancelKey{}, cancel), http.MethodGet, "/", nil)
	req.Header.Set("X-Client", "alice")
	h.ServeHTTP(httptest.NewRecorder(), req)

	assert.Equal(t, 1, store.releases)
	assert.True(t, store.bounded, "the release's context has the Timeout's deadline")
	_, d, err := th.Acquire(context.Background(), "alice", p)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "the lease was not given back")
}

// A release that fails is told to OnReleaseError (under FailClosed: a
// Throttler that fails open reports a failed Release only to its Observe).
func TestConcurrencyReleaseError(t *testing.T) {
	store := newNetLeases(t)
	th := newThrottler(t, store, &throttler.Options{FailClosed: true})
	var released []error
	h := newConcurrency(t, th, throttler.Concurrent(1, time.Minute), &httplimit.Options{
		OnReleaseError: func(r *http.Request, err error) { released = append(released, err) },
	})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { store.setFail(errDown) }))
	w := serve(h, "X-Client", "alice")
	assert.Equal(t, http.StatusOK, w.Code)
	require.Len(t, released, 1)
	assert.True(t, errors.Is(released[0], throttler.ErrUnavailable), "%v", released[0])
}
