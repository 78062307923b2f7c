package httplimit_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/httplimit"
	"github.com/throttlekit/throttlekit/internal/sleep"
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

func newRate(t testing.TB, th *throttler.Throttler, p throttler.Policy, key httplimit.KeyFunc, o *httplimit.Options) func(http.Handler) http.Handler {
	t.Helper()
	mw, err := httplimit.Rate(th, p, key, o)
	require.NoError(t, err)
	return mw
}

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

func TestRateRejects(t *testing.T) {
	th := newThrottler(t, newMemory(t), nil)
	p := throttler.PerMinute(10).Named("api")
	var nilThrottler *throttler.Throttler
	tests := []struct {
		name   string
		th     *throttler.Throttler
		p      throttler.Policy
		key    httplimit.KeyFunc
		o      *httplimit.Options
		want   string
		wantIs error
	}{
		{name: "zero policy", th: th, p: throttler.Policy{}, key: httplimit.KeyByRemoteIP, want: "throttler: invalid policy: limit must be between 1 and 2^48, got 0", wantIs: throttler.ErrInvalidPolicy},
		{name: "no window", th: th, p: throttler.Policy{Limit: 1}, key: httplimit.KeyByRemoteIP, want: "throttler: invalid policy: window must be >= 1ms, got 0s", wantIs: throttler.ErrInvalidPolicy},
		{name: "name with a space", th: th, p: p.Named("my api"), key: httplimit.KeyByRemoteIP, want: `throttler: invalid policy: name "my api": only printable ASCII without spaces is allowed`, wantIs: throttler.ErrInvalidPolicy},
		{name: "nil KeyFunc", th: th, p: p, key: nil, want: "httplimit: Rate needs a KeyFunc, got nil"},
		{name: "DeniedStatus 200", th: th, p: p, key: httplimit.KeyByRemoteIP, o: &httplimit.Options{DeniedStatus: 200}, want: "httplimit: Options.DeniedStatus must be a 4xx or 5xx status, got 200"},
		{name: "DeniedStatus 99", th: th, p: p, key: httplimit.KeyByRemoteIP, o: &httplimit.Options{DeniedStatus: 99}, want: "httplimit: Options.DeniedStatus must be a 4xx or 5xx status, got 99"},
		{name: "DeniedStatus 600", th: th, p: p, key: httplimit.KeyByRemoteIP, o: &httplimit.Options{DeniedStatus: 600}, want: "httplimit: Options.DeniedStatus must be a 4xx or 5xx status, got 600"},
		{name: "nil Throttler", th: nilThrottler, p: p, key: httplimit.KeyByRemoteIP, want: "httplimit: Rate needs a Throttler built by throttler.New, got nil"},
	}
	for _, tc := range tests {
		mw, err := httplimit.Rate(tc.th, tc.p, tc.key, tc.o)
		assert.EqualError(t, err, tc.want, tc.name)
		if tc.wantIs != nil {
			assert.ErrorIs(t, err, tc.wantIs, tc.name)
		}
		assert.Nil(t, mw, tc.name)
	}

	for _, o := range []*httplimit.Options{nil, {}, {DeniedStatus: 400}, {DeniedStatus: 503}, {DeniedStatus: 599}} {
		_, err := httplimit.Rate(th, p, httplimit.KeyByRemoteIP, o)
		assert.NoError(t, err, "%+v", o)
	}
}

// TestRateOnAZeroThrottler: a zero Throttler (which throttler.New did not
// build) cannot be told from a built one when Rate is built, but it never
// admits: every call of it fails, and every request is answered by OnError.
func TestRateOnAZeroThrottler(t *testing.T) {
	reached := false
	h := newRate(t, &throttler.Throttler{}, throttler.PerMinute(10), httplimit.KeyByHeader("X-Client"), nil)(
		http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached = true }))
	w := serve(h)
	assert.Equal(t, http.StatusInternalServerError, w.Code)
	assert.False(t, reached, "the handler ran behind a Throttler that never decided")
	assert.Empty(t, w.Header().Get("X-RateLimit-Limit"), "no decision, no headers")
}

func TestRateHeaders(t *testing.T) {
	clock := sleep.NewFake(t0.Add(250 * time.Millisecond))
	th := newThrottler(t, newMemory(t), &throttler.Options{Clock: clock.Now})
	p := throttler.PerMinute(3).Named("core")
	h := newRate(t, th, p, httplimit.KeyByHeader("X-Client"), nil)(etagHandler)
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

func TestRateIETFHeaders(t *testing.T) {
	th := newThrottler(t, newMemory(t), &throttler.Options{Clock: func() time.Time { return t0 }})
	h := newRate(t, th, throttler.PerHour(5000).Named("core"), httplimit.KeyByHeader("X-Client"), &httplimit.Options{IETFHeaders: true})(etagHandler)
	w := serve(h)
	assert.Equal(t, `"core";q=5000;w=3600`, w.Header().Get("RateLimit-Policy"))
	assert.Equal(t, `"core";r=4999;t=3600`, w.Header().Get("RateLimit"))

	// A bucket's policy is its rate; its burst shows as what remains.
	h = newRate(t, th, throttler.PerHour(2).WithBurst(5).Named("search"), httplimit.KeyByHeader("X-Client"), &httplimit.Options{IETFHeaders: true})(etagHandler)
	w = serve(h)
	assert.Equal(t, `"search";q=2;w=3600`, w.Header().Get("RateLimit-Policy"))
	assert.Equal(t, `"search";r=4;t=1800`, w.Header().Get("RateLimit"), "full again once the taken token refilled: half an hour")
	assert.Equal(t, "5", w.Header().Get("X-RateLimit-Limit"), "the capacity")

	h = newRate(t, th, throttler.PerHour(5000).Named("core"), httplimit.KeyByHeader("X-Client"), nil)(etagHandler)
	w = serve(h)
	assert.Empty(t, w.Header().Get("RateLimit-Policy"), "opt-in")
	assert.Empty(t, w.Header().Get("RateLimit"))
}

func TestRateDeniedStatusIsConfigurable(t *testing.T) {
	th := newThrottler(t, newMemory(t), nil)
	h := newRate(t, th, throttler.PerMinute(1), httplimit.KeyByHeader("X-Client"), &httplimit.Options{DeniedStatus: http.StatusServiceUnavailable})(etagHandler)
	assert.Equal(t, 200, serve(h).Code)
	assert.Equal(t, 503, serve(h).Code)
}

func TestRateKeyErrors(t *testing.T) {
	stub := &stubBackend{next: newMemory(t)}
	th := newThrottler(t, stub, nil)
	tests := []struct {
		name string
		key  httplimit.KeyFunc
	}{
		{"header missing", httplimit.KeyByHeader("X-Missing")},
		{"KeyFunc error", func(*http.Request) (string, error) { return "", errors.New("token signature invalid") }},
		{"KeyFunc error wrapping ErrNoKey", func(*http.Request) (string, error) { return "", fmt.Errorf("%w: no token", httplimit.ErrNoKey) }},
		{"empty key", func(*http.Request) (string, error) { return "", nil }},
		{"key too long", func(*http.Request) (string, error) { return strings.Repeat("k", throttler.MaxKeyLen+1), nil }},
	}
	for _, tc := range tests {
		var got error
		o := &httplimit.Options{OnError: func(w http.ResponseWriter, r *http.Request, err error) {
			got = err
			http.Error(w, "custom", http.StatusUnauthorized)
		}}
		w := serve(newRate(t, th, throttler.PerMinute(1), tc.key, nil)(etagHandler))
		assert.Equal(t, http.StatusBadRequest, w.Code, tc.name)
		assert.Equal(t, "Bad Request\n", w.Body.String(), "%s: the status text alone", tc.name)

		w = serve(newRate(t, th, throttler.PerMinute(1), tc.key, o)(etagHandler))
		assert.Equal(t, http.StatusUnauthorized, w.Code, tc.name)
		assert.True(t, errors.Is(got, httplimit.ErrNoKey) || throttler.IsInputError(got), "%s: %v", tc.name, got)
	}
	assert.Equal(t, 4, stub.count(), "KeyFunc errors count nothing; the two keys returned reached the store (twice each), which refused them")
}

// Keys are often API tokens or e-mail addresses, and errors carry them: no
// default answer ever writes an error, so no key and no internal detail
// reaches a client.
func TestErrorAnswersNeverHoldTheKeyNorTheError(t *testing.T) {
	const key = "alice@example.com"
	leak := fmt.Errorf(`redis: take %q (policy "api"): %w`, key, context.DeadlineExceeded)
	p := throttler.PerMinute(5).Named("api")
	tests := []struct {
		name     string
		backend  throttler.Backend
		mode     bool
		key      httplimit.KeyFunc
		status   int
		forbid   []string
		inHeader bool
	}{
		{"fail closed", &stubBackend{err: leak}, failClosed, httplimit.KeyByHeader("X-Client"), 503,
			[]string{key, "redis", "deadline", "throttler", "httplimit"}, true},
		{"key too long", newMemory(t), failOpen, func(*http.Request) (string, error) {
			return "token-" + key + strings.Repeat("x", throttler.MaxKeyLen), nil
		}, 400,
			[]string{key, "token-", "4096", "throttler", "httplimit"}, true},
		{"KeyFunc error", newMemory(t), failOpen, func(*http.Request) (string, error) { return "", fmt.Errorf("token %q is not signed", key) }, 400,
			[]string{key, "signed", "throttler", "httplimit"}, true},
	}
	for _, tc := range tests {
		th := newThrottler(t, tc.backend, &throttler.Options{FailClosed: tc.mode})
		w := serve(newRate(t, th, p, tc.key, nil)(etagHandler), "X-Client", key)
		assert.Equal(t, tc.status, w.Code, tc.name)
		assert.Equal(t, http.StatusText(tc.status)+"\n", w.Body.String(), tc.name)
		for _, s := range tc.forbid {
			assert.NotContains(t, strings.ToLower(w.Body.String()), strings.ToLower(s), tc.name)
			for name, v := range w.Header() {
				assert.NotContains(t, strings.Join(v, " "), s, "%s: header %s", tc.name, name)
			}
		}
	}
}

func TestKeyByRemoteIP(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "192.0.2.7:5555"
	k, err := httplimit.KeyByRemoteIP(r)
	require.NoError(t, err)
	assert.Equal(t, "192.0.2.7", k)
	r.RemoteAddr = "garbage"
	_, err = httplimit.KeyByRemoteIP(r)
	assert.EqualError(t, err, `remote address "garbage" has no host`, "no prefix: the middleware adds ErrNoKey's")
}

func TestRateDegraded(t *testing.T) {
	p := throttler.PerMinute(5)
	t.Run("fail open sets no count it does not know", func(t *testing.T) {
		th := newThrottler(t, &stubBackend{err: errDown}, nil)
		w := serve(newRate(t, th, p, httplimit.KeyByHeader("X-Client"), &httplimit.Options{IETFHeaders: true})(etagHandler))
		assert.Equal(t, 200, w.Code)
		assert.Equal(t, "5", w.Header().Get("X-RateLimit-Limit"))
		for _, h := range []string{"X-RateLimit-Remaining", "X-RateLimit-Used", "X-RateLimit-Reset", "RateLimit", "RateLimit-Policy"} {
			assert.Empty(t, w.Header().Get(h), h)
		}
	})
	t.Run("fail closed answers 503", func(t *testing.T) {
		th := newThrottler(t, &stubBackend{err: errDown}, &throttler.Options{FailClosed: true})
		w := serve(newRate(t, th, p, httplimit.KeyByHeader("X-Client"), nil)(etagHandler))
		assert.Equal(t, http.StatusServiceUnavailable, w.Code)
		assert.Equal(t, "1", w.Header().Get("Retry-After"))
	})
	t.Run("the fallback's counts are real", func(t *testing.T) {
		th := newThrottler(t, &stubBackend{err: errDown}, &throttler.Options{Fallback: newMemory(t)})
		w := serve(newRate(t, th, p, httplimit.KeyByHeader("X-Client"), nil)(etagHandler))
		assert.Equal(t, 200, w.Code)
		assert.Equal(t, "4", w.Header().Get("X-RateLimit-Remaining"))
	})
}

// Counting at the start of the request: concurrent requests can never pass
// the last allowed one.
func TestRateExactUnderConcurrency(t *testing.T) {
	th := newThrottler(t, newMemory(t), &throttler.Options{Clock: func() time.Time { return t0 }})
	release := make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release })
	h := newRate(t, th, throttler.PerMinute(10), httplimit.KeyByHeader("X-Client"), nil)(slow)
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			w := serve(h)
			mu.Lock()
			codes[w.Code]++
			mu.Unlock()
		})
	}
	// The 54 denied requests return while the 10 admitted still block.
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return codes[429] == 54 }, 5*time.Second, time.Millisecond)
	close(release)
	wg.Wait()
	assert.Equal(t, map[int]int{200: 10, 429: 54}, codes)
}

func TestRefundOnlyWhenRefundable(t *testing.T) {
	stub := &stubBackend{next: newMemory(t)}
	th := newThrottler(t, stub, nil)
	h := newRate(t, th, throttler.PerMinute(5), httplimit.KeyByHeader("X-Client"), nil)(etagHandler)
	serve(h)
	assert.Equal(t, 1, stub.count(), "a 200 costs one call")
	serve(h, "If-None-Match", "x")
	assert.Equal(t, 3, stub.count(), "a 304 costs a take and a refund")
	d, err := th.Peek(context.Background(), "alice", throttler.PerMinute(5))
	require.NoError(t, err)
	assert.Equal(t, int64(1), d.Used)
}

// get sends a GET with X-Client: client to url.
func get(t *testing.T, url, client string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("X-Client", client)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	return resp
}

// A streaming handler behind the middleware flushes: the client reads the
// first chunk while the handler still runs. (The writer used to hide
// http.Flusher.)
func TestRateStreams(t *testing.T) {
	th := newThrottler(t, newMemory(t), &throttler.Options{Clock: func() time.Time { return t0 }})
	release := make(chan struct{})
	stream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, ok := w.(http.Flusher)
		if !ok {
			http.Error(w, "no Flusher", http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "first\n")
		f.Flush()
		<-release
		_, _ = io.WriteString(w, "second\n")
	})
	srv := httptest.NewServer(newRate(t, th, throttler.PerMinute(5), httplimit.KeyByHeader("X-Client"), nil)(stream))
	defer srv.Close()

	type read struct {
		resp  *http.Response
		first string
		err   error
	}
	done := make(chan read, 1)
	req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	req.Header.Set("X-Client", "alice")
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- read{err: err}
			return
		}
		first, err := bufio.NewReader(resp.Body).ReadString('\n')
		done <- read{resp, first, err}
	}()
	var r read
	select {
	case r = <-done:
	case <-time.After(10 * time.Second): // a guard against a hang, not a clock
		close(release)
		t.Fatal("the first chunk never arrived: the writer does not flush")
	}
	close(release)
	require.NoError(t, r.err)
	defer r.resp.Body.Close()
	assert.Equal(t, 200, r.resp.StatusCode)
	assert.Equal(t, "first\n", r.first, "read before the handler finished")
	assert.Equal(t, "4", r.resp.Header.Get("X-RateLimit-Remaining"))
}

// The writer the handler gets has exactly the optional interfaces of the
// server's: all of them behind net/http's server, none behind a writer that
// has none.
func TestRateWriterKeepsTheServersInterfaces(t *testing.T) {
	th := newThrottler(t, newMemory(t), nil)
	mw := newRate(t, th, throttler.PerMinute(100), httplimit.KeyByHeader("X-Client"), nil)
	interfaces := func(w http.ResponseWriter) string {
		_, flusher := w.(http.Flusher)
		_, hijacker := w.(http.Hijacker)
		_, readerFrom := w.(io.ReaderFrom)
		_, stringWriter := w.(io.StringWriter)
		return fmt.Sprintf("Flusher=%v Hijacker=%v ReaderFrom=%v StringWriter=%v", flusher, hijacker, readerFrom, stringWriter)
	}
	report := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		deadline := rc.SetWriteDeadline(time.Time{}) // found through the wrapper
		_, _ = fmt.Fprintf(w, "%s deadline=%v", interfaces(w), deadline)
	})

	srv := httptest.NewServer(mw(report))
	defer srv.Close()
	resp := get(t, srv.URL, "alice")
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, "Flusher=true Hijacker=true ReaderFrom=true StringWriter=true deadline=<nil>", string(body))

	plain := &plainWriter{header: http.Header{}}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-Client", "bob")
	var got string
	mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = interfaces(w) })).ServeHTTP(plain, r)
	assert.Equal(t, "Flusher=false Hijacker=false ReaderFrom=false StringWriter=false", got, "none added")
}

// plainWriter is an http.ResponseWriter with no optional interface.
type plainWriter struct {
	header http.Header
	status int
	body   strings.Builder
}

func (w *plainWriter) Header() http.Header         { return w.header }
func (w *plainWriter) Write(b []byte) (int, error) { return w.body.Write(b) }
func (w *plainWriter) WriteHeader(status int)      { w.status = status }

// A refundable response's unit goes back before its headers are sent,
// whichever method sends them: the headers show the count after the refund.
func TestRateRefundsBeforeTheHeaders(t *testing.T) {
	tests := []struct {
		name    string
		handler http.HandlerFunc
		status  int
	}{
		{"WriteHeader 304", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNotModified) }, 304},
		{"103 then 304", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusEarlyHints) // informational: not the answer
			w.WriteHeader(http.StatusNotModified)
		}, 304},
		{"Flush first", func(w http.ResponseWriter, r *http.Request) {
			w.(http.Flusher).Flush()
			_, _ = w.Write([]byte("streamed"))
		}, 200},
		{"FlushError through a ResponseController", func(w http.ResponseWriter, r *http.Request) {
			_ = http.NewResponseController(w).Flush()
			_, _ = w.Write([]byte("streamed"))
		}, 200},
		{"Write first", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("body")) }, 200},
		{"WriteString first", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "body") }, 200},
		{"ReadFrom first", func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(w, strings.NewReader("body")) }, 200},
		{"Hijack is no response: no refund", func(w http.ResponseWriter, r *http.Request) {
			conn, buf, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nX-RateLimit-Remaining: hijacked\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
			_ = buf.Flush()
		}, 200},
	}
	th := newThrottler(t, newMemory(t), &throttler.Options{Clock: func() time.Time { return t0 }})
	p := throttler.PerMinute(5)
	refundable := &httplimit.Options{Refundable: func(status int) bool { return status == 200 || status == 304 }}
	for i, tc := range tests {
		srv := httptest.NewServer(newRate(t, th, p, httplimit.KeyByHeader("X-Client"), refundable)(tc.handler))
		client := fmt.Sprintf("client-%d", i)
		resp := get(t, srv.URL, client)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		srv.Close()

		assert.Equal(t, tc.status, resp.StatusCode, tc.name)
		d, err := th.Peek(context.Background(), client, p)
		require.NoError(t, err)
		if strings.HasPrefix(tc.name, "Hijack") {
			assert.Equal(t, "hijacked", resp.Header.Get("X-RateLimit-Remaining"))
			assert.Equal(t, int64(1), d.Used, "%s: counted", tc.name)
			continue
		}
		assert.Equal(t, "5", resp.Header.Get("X-RateLimit-Remaining"), "%s: the header shows the refund", tc.name)
		assert.Equal(t, "0", resp.Header.Get("X-RateLimit-Used"), tc.name)
		assert.Equal(t, int64(0), d.Used, "%s: refunded once", tc.name)
	}
}

// A denied answer's body states the policy's rate; a token bucket's
// capacity shows as its burst, never as a quota per window.
func TestRateDeniedBodyStatesTheRate(t *testing.T) {
	for _, tc := range []struct {
		p    throttler.Policy
		want string
	}{
		{throttler.PerHour(2), "rate limit exceeded: 2 per 1h0m0s; retry in 3600s\n"},
		{throttler.PerHour(2).WithAlgorithm(throttler.TokenBucket), "rate limit exceeded: 2 per 1h0m0s; retry in 1800s\n"},
		{throttler.PerHour(2).WithBurst(5), "rate limit exceeded: 2 per 1h0m0s, burst 5; retry in 1800s\n"},
		{throttler.PerHour(2).WithAlgorithm(throttler.SlidingLog), "rate limit exceeded: 2 per 1h0m0s; retry in 3600s\n"},
	} {
		th := newThrottler(t, newMemory(t), &throttler.Options{Clock: func() time.Time { return t0 }})
		h := newRate(t, th, tc.p, httplimit.KeyByHeader("X-Client"), nil)(etagHandler)
		var w *httptest.ResponseRecorder
		for range tc.p.Capacity() + 1 {
			w = serve(h)
		}
		assert.Equal(t, http.StatusTooManyRequests, w.Code, "%+v", tc.p)
		assert.Equal(t, tc.want, w.Body.String(), "%+v", tc.p)
	}
}

// TestRateResetAdmitsTheClientThatReturns: on every algorithm, the
// instants an answer names (X-RateLimit-Reset, and for a denial
// Retry-After; the IETF RateLimit's t) are ones at which a client that
// returns, with nobody else spending in between, is admitted; a denied
// answer's t is never shorter than its Retry-After. t0 is 7s into an
// epoch-aligned minute: the sliding-window counter's rows spend 2 at 30s
// into it, so its window ends 30s later, while a unit fits only 30s after
// that (the previous window's 2 weigh 1 there).
func TestRateResetAdmitsTheClientThatReturns(t *testing.T) {
	s, ms := time.Second, time.Millisecond
	tests := []struct {
		name  string
		p     throttler.Policy
		spend []time.Duration // after t0: one request each, all admitted
		at    time.Duration   // after t0, the answer read: a denial, or the last admission when at is the last spend
		reset time.Duration   // after t0, X-RateLimit-Reset: the earliest admission, in whole seconds
	}{
		{"fixed window, last admitted", throttler.PerMinute(2), []time.Duration{250 * ms, 10 * s}, 10 * s, 61 * s},
		{"fixed window, denied", throttler.PerMinute(2), []time.Duration{250 * ms, 10 * s}, 20*s + 700*ms, 61 * s},
		{"token bucket, last admitted", throttler.PerMinute(2).WithAlgorithm(throttler.TokenBucket), []time.Duration{0, 0}, 0, 60 * s},
		{"token bucket, denied", throttler.PerMinute(2).WithBurst(3), []time.Duration{0, 0, 0}, 700 * ms, 90 * s},
		{"sliding log, last admitted", throttler.PerMinute(2).WithAlgorithm(throttler.SlidingLog), []time.Duration{0, 20 * s}, 20 * s, 80 * s},
		{"sliding log, denied", throttler.PerMinute(2).WithAlgorithm(throttler.SlidingLog), []time.Duration{0, 20 * s}, 30*s + 300*ms, 80 * s},
		{"sliding window, last admitted", throttler.PerMinute(2).WithAlgorithm(throttler.SlidingWindow), []time.Duration{23 * s, 23 * s}, 23 * s, 83 * s},
		{"sliding window, denied", throttler.PerMinute(2).WithAlgorithm(throttler.SlidingWindow), []time.Duration{23 * s, 23 * s}, 23*s + 400*ms, 83 * s},
		{"sliding window, denied in the next window", throttler.PerMinute(3).WithAlgorithm(throttler.SlidingWindow), []time.Duration{23 * s, 23 * s, 23 * s}, 53*s + 100*ms, 113 * s},
		{"sliding window of 1, denied", throttler.PerMinute(1).WithAlgorithm(throttler.SlidingWindow), []time.Duration{23 * s}, 23*s + 1*ms, 113 * s},
		{"sliding window of 1, last admitted", throttler.PerMinute(1).WithAlgorithm(throttler.SlidingWindow), []time.Duration{23 * s}, 23 * s, 113 * s},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// replay spends on a fresh store and returns the last answer.
			replay := func() (*sleep.Fake, http.Handler, *httptest.ResponseRecorder) {
				clock := sleep.NewFake(t0)
				th := newThrottler(t, newMemory(t), &throttler.Options{Clock: clock.Now})
				h := newRate(t, th, tc.p, httplimit.KeyByHeader("X-Client"), &httplimit.Options{IETFHeaders: true})(etagHandler)
				var w *httptest.ResponseRecorder
				for _, at := range tc.spend {
					clock.Set(t0.Add(at))
					w = serve(h)
					require.Equal(t, http.StatusOK, w.Code, "spending at %v", at)
				}
				if tc.at != tc.spend[len(tc.spend)-1] {
					clock.Set(t0.Add(tc.at))
					w = serve(h)
					require.Equal(t, http.StatusTooManyRequests, w.Code)
				}
				return clock, h, w
			}
			_, _, w := replay()
			now := t0.Add(tc.at)
			require.Equal(t, "0", w.Header().Get("X-RateLimit-Remaining"))
			reset, err := strconv.ParseInt(w.Header().Get("X-RateLimit-Reset"), 10, 64)
			require.NoError(t, err)
			assert.Equal(t, t0.Add(tc.reset), time.Unix(reset, 0).UTC(), "X-RateLimit-Reset")
			var tSec int64
			_, err = fmt.Sscanf(w.Header().Get("RateLimit"), `"default";r=0;t=%d`, &tSec)
			require.NoError(t, err, "RateLimit: %q", w.Header().Get("RateLimit"))
			returns := map[string]time.Time{
				"X-RateLimit-Reset": time.Unix(reset, 0),
				"RateLimit t":       now.Add(time.Duration(tSec) * s),
			}
			if w.Code == http.StatusTooManyRequests {
				retry, err := strconv.ParseInt(w.Header().Get("Retry-After"), 10, 64)
				require.NoError(t, err)
				assert.GreaterOrEqual(t, tSec, retry, "RateLimit t is shorter than Retry-After")
				returns["Retry-After"] = now.Add(time.Duration(retry) * s)
				assert.False(t, time.Unix(reset, 0).Before(now.Add(time.Duration(retry-1)*s)), "X-RateLimit-Reset %v more than a second before Retry-After %ds", time.Unix(reset, 0), retry)
			}
			for header, at := range returns {
				clock, h, _ := replay()
				clock.Set(at)
				assert.Equal(t, http.StatusOK, serve(h).Code, "a client returning at %s (%v after the answer) is refused", header, at.Sub(now))
			}
		})
	}
}

// countingClock moves on by a second every time it is read, and counts
// the readings.
type countingClock struct {
	mu    sync.Mutex
	now   time.Time
	reads int
}

func (c *countingClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reads++
	c.now = c.now.Add(time.Second)
	return c.now
}

// TestRateReadsTheClockOncePerDecision: the headers of an answer are
// computed at the instant its Take was made at, the IETF RateLimit's t
// included: one reading of the clock for a request, and one more for a
// 304's refund, which is a decision of its own.
func TestRateReadsTheClockOncePerDecision(t *testing.T) {
	clock := &countingClock{now: t0.Add(-time.Second)}
	th := newThrottler(t, newMemory(t), &throttler.Options{Clock: clock.Now})
	h := newRate(t, th, throttler.PerMinute(5).Named("core"), httplimit.KeyByHeader("X-Client"), &httplimit.Options{IETFHeaders: true})(etagHandler)

	w := serve(h)
	assert.Equal(t, 1, clock.reads)
	assert.Equal(t, `"core";r=4;t=60`, w.Header().Get("RateLimit"), "t is counted from the Take's instant")

	w = serve(h, "If-None-Match", `"v1"`)
	assert.Equal(t, http.StatusNotModified, w.Code)
	assert.Equal(t, 3, clock.reads, "a take and its refund")
	assert.Equal(t, `"core";r=4;t=58`, w.Header().Get("RateLimit"), "after the refund, from the refund's instant")
}

// TestResetAdmitsOnRandomTraces: on random traces of every algorithm (small
// limits and windows, costs up to the capacity, the clock stepping by up to
// a window, sometimes back), every Take's answer that leaves nothing or is
// denied names a reset (before the headers round it to seconds) at which a
// Take of one unit, with nothing spent in between, is admitted; a denial's
// is never before the call's ms plus its RetryAfter.
func TestResetAdmitsOnRandomTraces(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 6))
	ctx := context.Background()
	type step struct {
		at   time.Time
		cost int64
	}
	checked := 0
	for trace := range 400 {
		alg := throttler.Algorithm(trace % 4)
		p := throttler.Policy{Limit: 1 + r.Int64N(4), Window: time.Duration(5+r.Int64N(20)) * time.Millisecond, Algorithm: alg}
		if alg == throttler.TokenBucket && r.IntN(2) == 0 {
			p.Burst = 1 + r.Int64N(6)
		}
		var steps []step
		at := t0
		for range 12 {
			w := p.Window
			if r.IntN(6) == 0 {
				at = at.Add(-time.Duration(r.Int64N(int64(w/time.Millisecond))) * time.Millisecond)
			} else {
				at = at.Add(time.Duration(r.Int64N(int64(w/time.Millisecond)+1)) * time.Millisecond)
			}
			steps = append(steps, step{at, 1 + r.Int64N(p.Capacity())})
		}
		// replay takes steps[:n] on a fresh store and returns the last answer.
		replay := func(n int) throttler.Backend {
			m := traceMemory(t)
			for _, s := range steps[:n] {
				_, err := m.Take(ctx, "k", p, s.cost, s.at)
				require.NoError(t, err)
			}
			return m
		}
		m := traceMemory(t)
		for i, s := range steps {
			d, err := m.Take(ctx, "k", p, s.cost, s.at)
			require.NoError(t, err)
			if d.Allowed && d.Remaining > 0 {
				continue
			}
			reset := httplimit.ResetOf(p, d, s.at)
			if !d.Allowed {
				assert.False(t, reset.Before(time.UnixMilli(s.at.UnixMilli()).Add(d.RetryAfter)), "trace %d step %d %v: reset %v before the admission", trace, i, p, reset)
			}
			again, err := replay(i+1).Take(ctx, "k", p, 1, reset)
			require.NoError(t, err)
			assert.True(t, again.Allowed, "trace %d step %d %v at %v cost %d: %+v; one unit refused at the reset %v",
				trace, i, p, s.at.Sub(t0), s.cost, d, reset.Sub(t0))
			checked++
		}
	}
	t.Logf("%d answers checked", checked)
}

// traceMemory is a memory backend whose state only the trace's own calls
// sweep, at the trace's instants: a timer sweep estimates the clock from
// real time, so a run stalled for a second (-race on a loaded machine)
// could drop state that the trace's clock, which stands still between
// steps, still counts on, and the store under test would then answer
// differently from its replay.
func traceMemory(t testing.TB) *memory.Backend {
	t.Helper()
	m, err := memory.New(&memory.Options{SweepEvery: time.Hour})
	require.NoError(t, err)
	return m
}
