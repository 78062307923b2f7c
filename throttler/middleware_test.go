package throttler_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

// etagHandler answers 304 when the client sends If-None-Match, 200 otherwise.
var etagHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("If-None-Match") != "" {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	_, _ = w.Write([]byte("ok"))
})

func serve(h http.Handler, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, "/repos", nil)
	r.Header.Set("X-Client", "alice")
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestMiddlewareHeaders(t *testing.T) {
	clock := &fakeClock{now: t0.Add(250 * time.Millisecond)}
	th := throttler.New(memory.New(nil), &throttler.Options{Clock: clock.Now})
	p := throttler.PerMinute(3).Named("core")
	h := th.Middleware(p, throttler.KeyByHeader("X-Client"), nil)(etagHandler)
	wantReset := strconv.FormatInt(t0.Add(time.Minute).Unix()+1, 10) // 250ms past a second: rounded up

	tests := []struct {
		advance    time.Duration
		header     []string
		status     int
		remaining  string
		used       string
		retryAfter string
	}{
		{0, nil, 200, "2", "1", ""},
		{time.Second, []string{"If-None-Match", `"v1"`}, 304, "2", "1", ""}, // refunded before the headers went out
		{time.Second, nil, 200, "1", "2", ""},
		{time.Second, nil, 200, "0", "3", ""},
		{time.Second, nil, 429, "0", "3", "56"},
		{55*time.Second + 500*time.Millisecond, nil, 429, "0", "3", "1"}, // 0.5s left: rounded up
	}
	for i, tc := range tests {
		clock.Add(tc.advance)
		w := serve(h, tc.header...)
		assert.Equal(t, tc.status, w.Code, "request %d", i)
		assert.Equal(t, "3", w.Header().Get("X-RateLimit-Limit"), "request %d", i)
		assert.Equal(t, tc.remaining, w.Header().Get("X-RateLimit-Remaining"), "request %d", i)
		assert.Equal(t, tc.used, w.Header().Get("X-RateLimit-Used"), "request %d", i)
		assert.Equal(t, wantReset, w.Header().Get("X-RateLimit-Reset"), "request %d: Reset never wobbles inside a window", i)
		assert.Equal(t, "core", w.Header().Get("X-RateLimit-Resource"), "request %d", i)
		assert.Equal(t, tc.retryAfter, w.Header().Get("Retry-After"), "request %d", i)
	}
	clock.Add(time.Second) // the window opened at t0+250ms has ended
	w := serve(h)
	assert.Equal(t, 200, w.Code)
	assert.Equal(t, "2", w.Header().Get("X-RateLimit-Remaining"))
}

func TestMiddlewareIETFHeaders(t *testing.T) {
	th := throttler.New(memory.New(nil), &throttler.Options{Clock: func() time.Time { return t0 }})
	h := th.Middleware(throttler.PerHour(5000).Named("core"), throttler.KeyByHeader("X-Client"), &throttler.MiddlewareOptions{IETFHeaders: true})(etagHandler)
	w := serve(h)
	assert.Equal(t, `"core";q=5000;w=3600`, w.Header().Get("RateLimit-Policy"))
	assert.Equal(t, `"core";r=4999;t=3600`, w.Header().Get("RateLimit"))
}

func TestMiddlewareDeniedStatusIsConfigurable(t *testing.T) {
	th := throttler.New(memory.New(nil), nil)
	h := th.Middleware(throttler.PerMinute(1), throttler.KeyByHeader("X-Client"), &throttler.MiddlewareOptions{DeniedStatus: http.StatusServiceUnavailable})(etagHandler)
	assert.Equal(t, 200, serve(h).Code)
	assert.Equal(t, 503, serve(h).Code)
}

func TestMiddlewareKeyErrors(t *testing.T) {
	stub := &stubBackend{next: memory.New(nil)}
	th := throttler.New(stub, nil)
	h := th.Middleware(throttler.PerMinute(1), throttler.KeyByHeader("X-Missing"), nil)(etagHandler)
	w := serve(h)
	assert.Equal(t, http.StatusBadRequest, w.Code)
	assert.Contains(t, w.Body.String(), "X-Missing")
	assert.Zero(t, stub.count(), "nothing counted")

	failing := throttler.KeyFunc(func(*http.Request) (string, error) { return "", errors.New("token signature invalid") })
	w = serve(th.Middleware(throttler.PerMinute(1), failing, nil)(etagHandler))
	assert.Equal(t, http.StatusBadRequest, w.Code)
	assert.Contains(t, w.Body.String(), "token signature invalid")

	long := throttler.KeyFunc(func(*http.Request) (string, error) { return string(make([]byte, throttler.MaxKeyLen+1)), nil })
	w = serve(th.Middleware(throttler.PerMinute(1), long, nil)(etagHandler))
	assert.Equal(t, http.StatusBadRequest, w.Code)
}

func TestKeyByRemoteIP(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "192.0.2.7:5555"
	k, err := throttler.KeyByRemoteIP(r)
	require.NoError(t, err)
	assert.Equal(t, "192.0.2.7", k)
	r.RemoteAddr = "garbage"
	_, err = throttler.KeyByRemoteIP(r)
	assert.ErrorIs(t, err, throttler.ErrNoKey)
}

func TestMiddlewareDegraded(t *testing.T) {
	p := throttler.PerMinute(5)
	t.Run("fail open sets no count it does not know", func(t *testing.T) {
		th := throttler.New(&stubBackend{err: errDown}, nil)
		w := serve(th.Middleware(p, throttler.KeyByHeader("X-Client"), nil)(etagHandler))
		assert.Equal(t, 200, w.Code)
		assert.Equal(t, "5", w.Header().Get("X-RateLimit-Limit"))
		for _, h := range []string{"X-RateLimit-Remaining", "X-RateLimit-Used", "X-RateLimit-Reset"} {
			assert.Empty(t, w.Header().Get(h), h)
		}
	})
	t.Run("fail closed answers 503", func(t *testing.T) {
		th := throttler.New(&stubBackend{err: errDown}, &throttler.Options{FailureMode: throttler.FailClosed})
		w := serve(th.Middleware(p, throttler.KeyByHeader("X-Client"), nil)(etagHandler))
		assert.Equal(t, http.StatusServiceUnavailable, w.Code)
		assert.Equal(t, "1", w.Header().Get("Retry-After"))
	})
	t.Run("the fallback's counts are real", func(t *testing.T) {
		th := throttler.New(&stubBackend{err: errDown}, &throttler.Options{Fallback: memory.New(nil)})
		w := serve(th.Middleware(p, throttler.KeyByHeader("X-Client"), nil)(etagHandler))
		assert.Equal(t, 200, w.Code)
		assert.Equal(t, "4", w.Header().Get("X-RateLimit-Remaining"))
	})
}

// Counting at the start of the request: concurrent requests can never pass
// the last allowed one.
func TestMiddlewareExactUnderConcurrency(t *testing.T) {
	th := throttler.New(memory.New(nil), &throttler.Options{Clock: func() time.Time { return t0 }})
	release := make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release })
	h := th.Middleware(throttler.PerMinute(10), throttler.KeyByHeader("X-Client"), nil)(slow)
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := serve(h)
			mu.Lock()
			codes[w.Code]++
			mu.Unlock()
		}()
	}
	// The 54 denied requests return while the 10 admitted still block.
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return codes[429] == 54 }, 5*time.Second, time.Millisecond)
	close(release)
	wg.Wait()
	assert.Equal(t, map[int]int{200: 10, 429: 54}, codes)
}

func TestRefundOnlyWhenRefundable(t *testing.T) {
	stub := &stubBackend{next: memory.New(nil)}
	th := throttler.New(stub, nil)
	h := th.Middleware(throttler.PerMinute(5), throttler.KeyByHeader("X-Client"), nil)(etagHandler)
	serve(h)
	assert.Equal(t, 1, stub.count(), "a 200 costs one call")
	serve(h, "If-None-Match", "x")
	assert.Equal(t, 3, stub.count(), "a 304 costs a take and a refund")
	d, err := th.Peek(context.Background(), "alice", throttler.PerMinute(5))
	require.NoError(t, err)
	assert.Equal(t, int64(1), d.Used)
}
