package outbound_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/httplimit"
	"github.com/throttlekit/throttlekit/internal/sleep"
	"github.com/throttlekit/throttlekit/outbound"
	"github.com/throttlekit/throttlekit/throttler"
)

// failOpen and failClosed name the values of throttler.Options.FailClosed.
const failOpen, failClosed = false, true

// t0 is far from today, so that a context deadline set on the fake clock
// never passes in real time.
var t0 = time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)

// world is one fake clock for the Throttlers, the Transports and the
// remote: a Transport's sleep moves it.
type world = sleep.Fake

func newWorld() *world { return sleep.NewFake(t0) }

func noJitter(time.Duration) time.Duration { return 0 }

// counted counts the calls that reach a backend, and fails the Takes that
// fail says to.
type counted struct {
	throttler.Backend
	takes, peeks, refunds atomic.Int64
	fail                  func(p throttler.Policy) bool
}

func (c *counted) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	c.takes.Add(1)
	if c.fail != nil && c.fail(p) {
		return throttler.Decision{}, errors.New("connection refused")
	}
	return c.Backend.Take(ctx, key, p, cost, now)
}

func (c *counted) Peek(ctx context.Context, key string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	c.peeks.Add(1)
	return c.Backend.Peek(ctx, key, p, now)
}

func (c *counted) Refund(ctx context.Context, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
	c.refunds.Add(1)
	return c.Backend.Refund(ctx, key, p, cost, receipt, now)
}

// Traits are the store's but for Route and Store, which would bypass the
// counts: the composites and the other traits of the memory backend.
func (c *counted) Traits() throttler.Traits {
	return throttler.Traits{Composites: throttler.TraitsOf(c.Backend).Composites}
}

// call is one request as the remote saw it.
type call struct {
	at     time.Time
	method string
	body   string
}

// remote is a base transport standing for the remote API: it records each
// request and answers what answer says for the n-th (from 0).
type remote struct {
	w      *world
	mu     sync.Mutex
	calls  []call
	answer func(n int, r *http.Request) *http.Response
	closed atomic.Int64 // bodies of its responses closed
}

func (g *remote) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		r.Body.Close()
	}
	g.mu.Lock()
	n := len(g.calls)
	g.calls = append(g.calls, call{at: g.w.Now(), method: r.Method, body: string(body)})
	g.mu.Unlock()
	resp := http.StatusOK
	var h []string
	if g.answer != nil {
		a := g.answer(n, r)
		resp, h = a.StatusCode, nil
		for k, v := range a.Header {
			for _, x := range v {
				h = append(h, k, x)
			}
		}
	}
	out := respond(resp, h...)
	out.Body = &closeCounter{Reader: strings.NewReader("answer"), n: &g.closed}
	out.Request = r
	return out, nil
}

func (g *remote) Calls() []call { g.mu.Lock(); defer g.mu.Unlock(); return slices.Clone(g.calls) }

type closeCounter struct {
	io.Reader
	n *atomic.Int64
}

func (c *closeCounter) Close() error { c.n.Add(1); return nil }

// respond builds a response with status and header pairs.
func respond(status int, header ...string) *http.Response {
	h := http.Header{}
	for i := 0; i+1 < len(header); i += 2 {
		h.Add(header[i], header[i+1])
	}
	return &http.Response{StatusCode: status, Header: h, Body: http.NoBody}
}

// fleet is several processes calling one remote: each its own Throttler
// and Transport, all over one store.
type fleet struct {
	w      *world
	store  *counted
	remote *remote
	ths    []*throttler.Throttler
	trs    []*outbound.Transport
}

func newFleet(t *testing.T, n int, o outbound.Options, to *throttler.Options) *fleet {
	t.Helper()
	w := newWorld()
	m, err := memory.New(nil)
	require.NoError(t, err)
	f := &fleet{w: w, store: &counted{Backend: m}, remote: &remote{w: w}}
	for range n {
		opts := throttler.Options{}
		if to != nil {
			opts = *to
		}
		opts.Clock = w.Now
		th, err := throttler.New(f.store, &opts)
		require.NoError(t, err)
		o := o
		o.Base = f.remote
		tr, err := outbound.New(th, &o)
		require.NoError(t, err)
		outbound.SetWorld(tr, w.Now, w.Sleep, noJitter)
		f.ths = append(f.ths, th)
		f.trs = append(f.trs, tr)
	}
	return f
}

// get sends a GET to the remote through transport i.
func (f *fleet) get(t *testing.T, i int) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "https://gateway.example/pay", nil)
	require.NoError(t, err)
	return f.trs[i].RoundTrip(req)
}

func (f *fleet) mustGet(t *testing.T, i int) *http.Response {
	t.Helper()
	resp, err := f.get(t, i)
	require.NoError(t, err)
	resp.Body.Close()
	return resp
}

const gatewayKey = "gateway.example:443"

var perMinute = throttler.PerMinute(100).Named("gateway")

func TestNewRejects(t *testing.T) {
	th, err := throttler.New(&counted{}, nil)
	require.NoError(t, err)
	route := func(*http.Request) (outbound.Route, error) { return outbound.Route{}, nil }
	tests := []struct {
		name string
		th   *throttler.Throttler
		o    *outbound.Options
		want string
		is   error
	}{
		{"nil throttler", nil, &outbound.Options{Policy: perMinute}, "outbound: New needs a Throttler, got nil", nil},
		{"typed-nil base", th, &outbound.Options{Policy: perMinute, Base: (*http.Transport)(nil)}, "outbound: Options.Base is a nil *http.Transport", nil},
		{"no policy, no route", th, nil, "outbound: Options.Policy: invalid policy: limit must be between 1 and 2^48, got 0", throttler.ErrInvalidPolicy},
		{"invalid policy", th, &outbound.Options{Policy: throttler.PerMinute(10).WithBurst(-1)}, "outbound: Options.Policy: invalid policy: burst must be between 0 (the limit) and 2^48, got -1", throttler.ErrInvalidPolicy},
		{"invalid policy with a route", th, &outbound.Options{Route: route, Policy: throttler.Policy{Limit: 1}}, "outbound: Options.Policy: invalid policy: window must be >= 1ms, got 0s", throttler.ErrInvalidPolicy},
		{"negative retries", th, &outbound.Options{Policy: perMinute, Retries: -1}, "outbound: Options.Retries must be >= 0, got -1", nil},
		{"negative max pause", th, &outbound.Options{Policy: perMinute, MaxPause: -time.Second}, "outbound: Options.MaxPause must be >= 0, got -1s", nil},
		{"sub-millisecond max pause", th, &outbound.Options{Policy: perMinute, MaxPause: time.Microsecond}, "outbound: Options.MaxPause must be at least 1ms, got 1µs", nil},
		{"pause name with a space", th, &outbound.Options{Policy: perMinute, PauseName: "a b"}, `outbound: Options.PauseName: invalid policy: name "a b": only printable ASCII without spaces is allowed`, throttler.ErrInvalidPolicy},
		{"policy named as the pauses", th, &outbound.Options{Policy: perMinute.Named("outbound-pause")}, `outbound: Options.Policy is named "outbound-pause", as the pauses are (Options.PauseName)`, nil},
		{"a composite's member named as the pauses", th, &outbound.Options{Policy: throttler.All(perMinute, throttler.PerHour(9).Named("outbound-pause"))}, `outbound: Options.Policy is named "outbound-pause", as the pauses are (Options.PauseName)`, nil},
		{"a composite on a Throttler that takes none", th, &outbound.Options{Policy: throttler.All(perMinute, throttler.PerHour(900).Named("gateway-h"))}, "outbound: Options.Policy is a composite, but the Throttler's backend takes none (Throttler.SupportsComposites): throttler: invalid policy", throttler.ErrInvalidPolicy},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := outbound.New(tc.th, tc.o)
			require.Error(t, err)
			assert.Nil(t, tr)
			assert.EqualError(t, err, tc.want)
			if tc.is != nil {
				assert.ErrorIs(t, err, tc.is)
			}
		})
	}

	for _, o := range []*outbound.Options{{Policy: perMinute}, {Route: route}, {Route: route, Policy: perMinute, Base: http.DefaultTransport}} {
		_, err := outbound.New(th, o)
		assert.NoError(t, err)
	}
	m, err := memory.New(nil)
	require.NoError(t, err)
	composites, err := throttler.New(m, nil)
	require.NoError(t, err)
	_, err = outbound.New(composites, &outbound.Options{Policy: throttler.All(perMinute, throttler.PerHour(900).Named("gateway-h"))})
	assert.NoError(t, err, "a partner's per-minute and per-hour limits as one, on a store that takes composites")
}

func TestHostKey(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"https://API.Example.com/v1/pay", "api.example.com:443"},
		{"http://example.com", "example.com:80"},
		{"http://example.com:8080/x", "example.com:8080"},
		{"HTTPS://[::1]/", "[::1]:443"},
		{"ftp://files.example/", "files.example"},
	} {
		req, err := http.NewRequest(http.MethodGet, tc.url, nil)
		require.NoError(t, err)
		got, err := outbound.HostKey(req) // the default key
		require.NoError(t, err, tc.url)
		assert.Equal(t, tc.want, got, tc.url)
	}
	_, err := outbound.HostKey(&http.Request{})
	assert.EqualError(t, err, "outbound: request has no URL")
	req, err := http.NewRequest(http.MethodGet, "/relative", nil)
	require.NoError(t, err)
	_, err = outbound.HostKey(req)
	assert.EqualError(t, err, "outbound: request URL has no host")
}

func TestPauseFrom(t *testing.T) {
	date := t0.Format(http.TimeFormat)
	skewed := t0.Add(-time.Hour) // the remote's clock is an hour behind ours
	unix := func(at time.Time) string { return strconv.FormatInt(at.Unix(), 10) }
	tests := []struct {
		name   string
		status int
		header []string
		want   time.Duration // 0: no pause
	}{
		{"429 with seconds", 429, []string{"Retry-After", "120"}, 2 * time.Minute},
		{"503 with seconds", 503, []string{"Retry-After", " 3 "}, 3 * time.Second},
		{"429 with a date", 429, []string{"Retry-After", t0.Add(90 * time.Second).Format(http.TimeFormat)}, 90 * time.Second},
		{"429 with a date, against the remote's Date", 429, []string{"Date", skewed.Format(http.TimeFormat), "Retry-After", skewed.Add(10 * time.Second).Format(http.TimeFormat)}, 10 * time.Second},
		{"429 with a date passed", 429, []string{"Retry-After", t0.Add(-time.Second).Format(http.TimeFormat)}, 0},
		{"429 with zero", 429, []string{"Retry-After", "0"}, 0},
		{"429 with a negative", 429, []string{"Retry-After", "-5"}, 0},
		{"429 with garbage", 429, []string{"Retry-After", "soon"}, 0},
		{"429 with nothing", 429, nil, 0},
		{"Retry-After on a 200 is not a pause", 200, []string{"Retry-After", "5"}, 0},
		{"Retry-After on a 500 is not a pause", 500, []string{"Retry-After", "5"}, 0},
		{"GitHub: remaining 0, reset in Unix seconds", 200, []string{"Date", date, "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", unix(t0.Add(20 * time.Second))}, 20 * time.Second},
		{"GitHub, against the remote's Date", 403, []string{"Date", skewed.Format(http.TimeFormat), "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", unix(skewed.Add(20 * time.Second))}, 20 * time.Second},
		{"GitHub, no Date", 200, []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", unix(t0.Add(20 * time.Second))}, 20 * time.Second},
		{"reset in Unix milliseconds", 200, []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", strconv.FormatInt(t0.Add(1500*time.Millisecond).UnixMilli(), 10)}, 1500 * time.Millisecond},
		{"reset in seconds from now", 200, []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "30"}, 30 * time.Second},
		{"reset-after, fractional", 200, []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset-After", "1.2345", "X-RateLimit-Reset", "99"}, 1235 * time.Millisecond},
		{"something remains", 200, []string{"X-RateLimit-Remaining", "5", "X-RateLimit-Reset", "30"}, 0},
		{"remaining 0 without a reset", 200, []string{"X-RateLimit-Remaining", "0"}, 0},
		{"IETF fields, up to draft 06", 200, []string{"RateLimit-Remaining", "0", "RateLimit-Reset", "10"}, 10 * time.Second},
		{"IETF list", 200, []string{"RateLimit", `"default";r=0;t=10`}, 10 * time.Second},
		{"IETF list, the spent one", 200, []string{"RateLimit", `"burst";r=5;t=1, "daily";r=0;t=3600`}, time.Hour},
		{"IETF list, none spent", 200, []string{"RateLimit", `"burst";r=5;t=1, "daily";r=9;t=3600`}, 0},
		{"IETF list over two lines", 200, []string{"RateLimit", `"burst";r=5;t=1`, "RateLimit", `"daily";r=0;t=60`}, time.Minute},
		{"IETF dictionary of early drafts", 200, []string{"RateLimit", "limit=10, remaining=0, reset=7"}, 7 * time.Second},
		{"the longest wins", 429, []string{"Retry-After", "5", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "12"}, 12 * time.Second},
		{"a huge reset saturates", 200, []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1e300"}, time.Duration(1<<63 - 1).Truncate(time.Millisecond)},
		{"NaN", 200, []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "NaN"}, 0},
	}
	for _, tc := range tests {
		h := http.Header{}
		for i := 0; i < len(tc.header); i += 2 {
			h.Add(tc.header[i], tc.header[i+1])
		}
		got, ok := outbound.PauseFrom(h, tc.status, t0)
		assert.Equal(t, tc.want, got, tc.name)
		assert.Equal(t, tc.want > 0, ok, tc.name)
	}
}

// TestTransportSendsWhatIsAdmitted: with room, each request costs the
// store a Take and a Peek of the pause, and nothing waits.
func TestTransportSendsWhatIsAdmitted(t *testing.T) {
	f := newFleet(t, 1, outbound.Options{Policy: perMinute}, nil)
	for range 3 {
		assert.Equal(t, http.StatusOK, f.mustGet(t, 0).StatusCode)
	}
	assert.Len(t, f.remote.Calls(), 3)
	assert.Equal(t, int64(3), f.store.takes.Load())
	assert.Equal(t, int64(3), f.store.peeks.Load())
	assert.Zero(t, f.store.refunds.Load())
	d, err := f.ths[0].Peek(context.Background(), gatewayKey, perMinute)
	require.NoError(t, err)
	assert.Equal(t, int64(3), d.Used)
	assert.Empty(t, f.w.Sleeps())
}

// TestAPauseStopsTheFleet: one process is told 429 Retry-After 30; the
// others learn it from the store and send nothing before then.
func TestAPauseStopsTheFleet(t *testing.T) {
	var pauses []outbound.Pause
	f := newFleet(t, 3, outbound.Options{Policy: perMinute, OnPause: func(p outbound.Pause) { pauses = append(pauses, p) }}, nil)
	f.remote.answer = func(n int, _ *http.Request) *http.Response {
		if n == 0 {
			return respond(http.StatusTooManyRequests, "Retry-After", "30")
		}
		return respond(http.StatusOK)
	}
	resp := f.mustGet(t, 0)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "without Retries the 429 is the answer")
	assert.Equal(t, []outbound.Pause{{Key: gatewayKey, Status: 429, Duration: 30 * time.Second}}, pauses)
	assert.Equal(t, 30*time.Second, outbound.KnownPause(f.trs[0], gatewayKey))

	// Process 1 takes its unit, finds the pause in the store, gives the
	// unit back and waits; then it sends.
	assert.Equal(t, http.StatusOK, f.mustGet(t, 1).StatusCode)
	assert.Equal(t, []time.Duration{30 * time.Second}, f.w.Sleeps())
	// Process 2 comes after the pause: no wait.
	assert.Equal(t, http.StatusOK, f.mustGet(t, 2).StatusCode)
	assert.Equal(t, []time.Duration{30 * time.Second}, f.w.Sleeps())

	calls := f.remote.Calls()
	require.Len(t, calls, 3)
	assert.True(t, calls[0].at.Equal(t0))
	assert.True(t, calls[1].at.Equal(t0.Add(30*time.Second)), "sent at %v", calls[1].at)
	d, err := f.ths[0].Peek(context.Background(), gatewayKey, perMinute)
	require.NoError(t, err)
	assert.Equal(t, int64(3), d.Used, "the unit taken during the pause was refunded")
	assert.Equal(t, int64(1), f.store.refunds.Load())
}

// TestAPauseFromHeadersOfASuccess: a 200 saying the remote's limit is spent
// pauses the key until its reset, so the next call never earns a 429.
func TestAPauseFromHeadersOfASuccess(t *testing.T) {
	f := newFleet(t, 2, outbound.Options{Policy: perMinute}, nil)
	f.remote.answer = func(n int, _ *http.Request) *http.Response {
		if n == 0 {
			return respond(http.StatusOK, "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", strconv.FormatInt(t0.Add(20*time.Second).Unix(), 10))
		}
		return respond(http.StatusOK)
	}
	f.mustGet(t, 0)
	f.mustGet(t, 1)
	assert.Equal(t, []time.Duration{20 * time.Second}, f.w.Sleeps())
	assert.True(t, f.remote.Calls()[1].at.Equal(t0.Add(20*time.Second)))
}

// TestTheFirstPauseWins: a pause already open is not extended by a longer
// one reported while it lasts (by a call that was in flight); the process
// told the longer one keeps it for itself.
func TestTheFirstPauseWins(t *testing.T) {
	f := newFleet(t, 2, outbound.Options{Policy: perMinute}, nil)
	f.remote.answer = func(n int, _ *http.Request) *http.Response {
		if n == 0 {
			// Process 1's call is in flight when process 0 is told 10s.
			f.mustGet(t, 0)
			return respond(http.StatusTooManyRequests, "Retry-After", "20")
		}
		return respond(http.StatusTooManyRequests, "Retry-After", "10")
	}
	f.mustGet(t, 1)
	assert.Equal(t, 10*time.Second, outbound.KnownPause(f.trs[0], gatewayKey))
	assert.Equal(t, 20*time.Second, outbound.KnownPause(f.trs[1], gatewayKey))
	d, err := f.ths[0].Peek(context.Background(), gatewayKey, throttler.Policy{Name: "outbound-pause", Limit: 1, Window: time.Millisecond})
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	assert.Equal(t, 10*time.Second, d.RetryAfter, "the store keeps the first pause")
}

type replayCase struct {
	name       string
	method     string
	body       string
	getBody    bool // keep the GetBody that NewRequest sets
	key        bool // an Idempotency-Key header
	answers    []int
	retryAfter string
	deadline   time.Duration // after t0; 0: none
	wantStatus int
	wantCalls  int
}

// TestRetries: a 429 or 503 with a pause is sent again after it, only when
// its body can be rebuilt and repeating it is safe, and only within the
// request's deadline; the body the remote reads is the same every time.
func TestRetries(t *testing.T) {
	tests := []replayCase{
		{name: "GET after a 429", method: "GET", answers: []int{429, 200}, retryAfter: "2", wantStatus: 200, wantCalls: 2},
		{name: "GET after a 503", method: "GET", answers: []int{503, 200}, retryAfter: "2", wantStatus: 200, wantCalls: 2},
		{name: "PUT with a body", method: "PUT", body: "v=1", getBody: true, answers: []int{429, 200}, retryAfter: "2", wantStatus: 200, wantCalls: 2},
		{name: "POST with an idempotency key", method: "POST", body: "pay 10", getBody: true, key: true, answers: []int{429, 200}, retryAfter: "2", wantStatus: 200, wantCalls: 2},
		{name: "POST without an idempotency key", method: "POST", body: "pay 10", getBody: true, answers: []int{429, 200}, retryAfter: "2", wantStatus: 429, wantCalls: 1},
		{name: "POST whose body cannot be rebuilt", method: "POST", body: "pay 10", key: true, answers: []int{429, 200}, retryAfter: "2", wantStatus: 429, wantCalls: 1},
		{name: "no pause, no retry", method: "GET", answers: []int{429, 200}, wantStatus: 429, wantCalls: 1},
		{name: "a 500 is not retried", method: "GET", answers: []int{500, 200}, retryAfter: "2", wantStatus: 500, wantCalls: 1},
		{name: "retries run out", method: "GET", answers: []int{429, 429, 200}, retryAfter: "2", wantStatus: 429, wantCalls: 2},
		{name: "the pause outlasts the deadline", method: "GET", answers: []int{429, 200}, retryAfter: "2", deadline: 2 * time.Second, wantStatus: 429, wantCalls: 1},
		{name: "the pause ends before the deadline", method: "GET", answers: []int{429, 200}, retryAfter: "2", deadline: 3 * time.Second, wantStatus: 200, wantCalls: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, 1, outbound.Options{Policy: perMinute, Retries: 1}, nil)
			f.remote.answer = func(n int, _ *http.Request) *http.Response {
				status := tc.answers[n]
				if status != 200 && tc.retryAfter != "" {
					return respond(status, "Retry-After", tc.retryAfter)
				}
				return respond(status)
			}
			ctx := context.Background()
			if tc.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, t0.Add(tc.deadline))
				defer cancel()
			}
			var body io.Reader
			if tc.body != "" {
				body = bytes.NewBufferString(tc.body)
			}
			req, err := http.NewRequestWithContext(ctx, tc.method, "https://gateway.example/pay", body)
			require.NoError(t, err)
			if !tc.getBody {
				req.GetBody = nil
			}
			if tc.key {
				req.Header.Set("Idempotency-Key", "pay-42")
			}
			resp, err := f.trs[0].RoundTrip(req)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, tc.wantStatus, resp.StatusCode)
			calls := f.remote.Calls()
			require.Len(t, calls, tc.wantCalls)
			for _, c := range calls {
				assert.Equal(t, tc.body, c.body, "the remote read another body")
				assert.Equal(t, tc.method, c.method)
			}
			if tc.wantCalls == 2 {
				assert.True(t, calls[1].at.Equal(t0.Add(2*time.Second)), "retried at %v", calls[1].at)
			}
			assert.Equal(t, int64(tc.wantCalls), f.remote.closed.Load(), "every response body closed, the retried ones by the Transport")
		})
	}
}

// closeRecorder is a request body that records whether it was closed.
type closeRecorder struct {
	io.Reader
	closed bool
}

func (c *closeRecorder) Close() error { c.closed = true; return nil }

func post(t *testing.T, ctx context.Context) (*http.Request, *closeRecorder) {
	body := &closeRecorder{Reader: strings.NewReader("pay 10")}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://gateway.example/pay", body)
	require.NoError(t, err)
	return req, body
}

// TestFailFast: a request that would wait fails at once with a
// *LimitedError, saying how long; nothing is sent and its body is closed.
func TestFailFast(t *testing.T) {
	f := newFleet(t, 2, outbound.Options{Policy: throttler.PerMinute(1).Named("gateway"), FailFast: true}, nil)

	f.mustGet(t, 0)
	req, body := post(t, context.Background())
	_, err := f.trs[0].RoundTrip(req)
	le, ok := errors.AsType[*outbound.LimitedError](err)
	require.True(t, ok, "%v", err)
	assert.Equal(t, outbound.LimitedError{RetryAfter: time.Minute}, *le)
	assert.EqualError(t, err, "outbound: rate limited: retry in 1m0s")
	assert.True(t, body.closed)
	assert.Len(t, f.remote.Calls(), 1)

	// A pause, known in the process or found in the store.
	g := newFleet(t, 2, outbound.Options{Policy: perMinute, FailFast: true}, nil)
	g.remote.answer = func(int, *http.Request) *http.Response {
		return respond(http.StatusTooManyRequests, "Retry-After", "30")
	}
	assert.Equal(t, http.StatusTooManyRequests, g.mustGet(t, 0).StatusCode, "FailFast never retries")
	for i := range 2 {
		_, err := g.get(t, i)
		require.ErrorAs(t, err, &le, "process %d", i)
		assert.Equal(t, outbound.LimitedError{RetryAfter: 30 * time.Second, Paused: true}, *le)
		assert.EqualError(t, err, "outbound: rate limited: the remote asked to pause for 30s more")
	}
	// Through an http.Client, which wraps it in a *url.Error.
	_, err = (&http.Client{Transport: g.trs[1]}).Get("https://gateway.example/pay")
	le, ok = errors.AsType[*outbound.LimitedError](err)
	require.True(t, ok, "%v", err)
	assert.True(t, le.Paused)
	assert.Len(t, g.remote.Calls(), 1)
	assert.Empty(t, g.w.Sleeps())
	d, err := g.ths[1].Peek(context.Background(), gatewayKey, perMinute)
	require.NoError(t, err)
	assert.Equal(t, int64(1), d.Used, "the unit process 1 took was refunded")
}

// TestRoutes: per-merchant keys from a Route, or the default key with the
// Route's policy; its errors fail the request before anything is sent or
// counted.
func TestRoutes(t *testing.T) {
	merchant := func(r *http.Request) (outbound.Route, error) {
		m := r.Header.Get("X-Merchant")
		switch m {
		case "":
			return outbound.Route{}, errors.New("no merchant")
		case "big":
			return outbound.Route{Key: "gw:" + m, Policy: throttler.PerMinute(1000).Named("big")}, nil
		case "pause":
			return outbound.Route{Key: "gw:" + m, Policy: throttler.PerMinute(1000).Named("outbound-pause")}, nil
		case "host":
			return outbound.Route{Policy: throttler.PerMinute(1000).Named("big")}, nil // the default key
		case "long":
			return outbound.Route{Key: strings.Repeat("k", throttler.MaxKeyLen+1)}, nil
		}
		return outbound.Route{Key: "gw:" + m}, nil // Options.Policy
	}
	f := newFleet(t, 1, outbound.Options{Policy: perMinute, Route: merchant}, nil)
	send := func(m string) error {
		req, body := post(t, context.Background())
		if m != "" {
			req.Header.Set("X-Merchant", m)
		}
		resp, err := f.trs[0].RoundTrip(req)
		if err != nil {
			assert.True(t, body.closed, "the body of an unsent request is closed")
			return err
		}
		resp.Body.Close()
		return nil
	}
	require.NoError(t, send("small"))
	require.NoError(t, send("big"))
	require.NoError(t, send("host"))
	ctx := context.Background()
	for _, c := range []struct {
		key string
		p   throttler.Policy
	}{{"gw:small", perMinute}, {"gw:big", throttler.PerMinute(1000).Named("big")}, {gatewayKey, throttler.PerMinute(1000).Named("big")}} {
		d, err := f.ths[0].Peek(ctx, c.key, c.p)
		require.NoError(t, err)
		assert.Equal(t, int64(1), d.Used, c.key)
	}
	d, err := f.ths[0].Peek(ctx, gatewayKey, perMinute)
	require.NoError(t, err)
	assert.Zero(t, d.Used, "the default key under the Route's policy only")

	takes := f.store.takes.Load()
	assert.EqualError(t, send(""), "outbound: Options.Route: no merchant")
	assert.EqualError(t, send("pause"), `outbound: Options.Route gave a policy named "outbound-pause", as the pauses are (Options.PauseName)`)
	err = send("long")
	require.ErrorIs(t, err, throttler.ErrInvalidKey)
	assert.Equal(t, 1, strings.Count(err.Error(), "outbound:"), err.Error())
	assert.NotContains(t, err.Error(), "throttler:")
	assert.Equal(t, takes+1, f.store.takes.Load(), "only the long key reached the store, which refused it")
	assert.Len(t, f.remote.Calls(), 3)
}

type down struct{}

func (down) Take(context.Context, string, throttler.Policy, int64, time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, errors.New("connection refused")
}

func (down) Peek(context.Context, string, throttler.Policy, time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, errors.New("connection refused")
}

func (down) Refund(context.Context, string, throttler.Policy, int64, time.Time, time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, errors.New("connection refused")
}

// TestStoreDown: the Throttler's failure mode decides: failing closed is
// an error before sending, failing open sends.
func TestStoreDown(t *testing.T) {
	for _, mode := range []bool{failClosed, failOpen} {
		th, err := throttler.New(down{}, &throttler.Options{FailClosed: mode})
		require.NoError(t, err)
		r := &remote{w: newWorld()}
		tr, err := outbound.New(th, &outbound.Options{Policy: perMinute, Base: r})
		require.NoError(t, err)
		req, body := post(t, context.Background())
		resp, err := tr.RoundTrip(req)
		if mode == failClosed {
			require.ErrorIs(t, err, throttler.ErrUnavailable)
			assert.True(t, strings.HasPrefix(err.Error(), "outbound: waiting for capacity: backend unavailable"), err.Error())
			assert.True(t, body.closed)
			assert.Empty(t, r.Calls())
			continue
		}
		require.NoError(t, err)
		resp.Body.Close()
		assert.Len(t, r.Calls(), 1)
	}
}

// TestAPauseTheStoreCannotRecord still holds the process that learned it,
// and OnPause says that the fleet does not know.
func TestAPauseTheStoreCannotRecord(t *testing.T) {
	var pauses []outbound.Pause
	f := newFleet(t, 1, outbound.Options{Policy: perMinute, OnPause: func(p outbound.Pause) { pauses = append(pauses, p) }},
		&throttler.Options{FailClosed: true})
	f.store.fail = func(p throttler.Policy) bool { return p.Name == "outbound-pause" }
	f.remote.answer = func(n int, _ *http.Request) *http.Response {
		if n == 0 {
			return respond(http.StatusServiceUnavailable, "Retry-After", "30")
		}
		return respond(http.StatusOK)
	}
	f.mustGet(t, 0)
	require.Len(t, pauses, 1)
	require.ErrorIs(t, pauses[0].Err, throttler.ErrUnavailable)
	assert.True(t, strings.HasPrefix(pauses[0].Err.Error(), "outbound: recording a pause: backend unavailable"), pauses[0].Err.Error())
	f.mustGet(t, 0)
	assert.Equal(t, []time.Duration{30 * time.Second}, f.w.Sleeps())
}

// TestMaxPause bounds what a response can ask for.
func TestMaxPause(t *testing.T) {
	f := newFleet(t, 1, outbound.Options{Policy: perMinute, MaxPause: time.Minute}, nil)
	f.remote.answer = func(int, *http.Request) *http.Response {
		return respond(http.StatusTooManyRequests, "Retry-After", "86400")
	}
	f.mustGet(t, 0)
	assert.Equal(t, time.Minute, outbound.KnownPause(f.trs[0], gatewayKey))
}

// TestDeadlinesAndCancellation run on the real clock: a pause longer than
// the deadline fails at once, a cancellation ends the wait within a small
// bound, and no goroutine is left.
func TestDeadlinesAndCancellation(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const bound = 250 * time.Millisecond // scheduling under -race on a busy machine; typically well under 1ms
	th, err := throttler.New(mustMemory(t), nil)
	require.NoError(t, err)
	r := &remote{w: &world{}, answer: func(n int, _ *http.Request) *http.Response {
		return respond(http.StatusTooManyRequests, "Retry-After", "60")
	}}
	tr, err := outbound.New(th, &outbound.Options{Policy: perMinute, Base: r})
	require.NoError(t, err)
	sleeping := make(chan struct{}, 1)
	outbound.SetWorld(tr, nil, func(ctx context.Context, d time.Duration) error {
		sleeping <- struct{}{}
		return sleep.Context(ctx, d)
	}, nil)
	req, err := http.NewRequest(http.MethodGet, "https://gateway.example/", nil)
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, body := post(t, ctx)
	start := time.Now()
	_, err = tr.RoundTrip(req)
	require.ErrorIs(t, err, throttler.ErrWouldExceedDeadline)
	assert.Less(t, time.Since(start), bound, "not at once")
	assert.True(t, body.closed)

	ctx, cancelCause := context.WithCancelCause(context.Background())
	req, _ = post(t, ctx)
	done := make(chan error, 1)
	go func() { _, err := tr.RoundTrip(req); done <- err }()
	<-sleeping
	canceled := time.Now()
	cancelCause(errors.New("shutting down"))
	err = <-done
	took := time.Since(canceled)
	require.ErrorIs(t, err, context.Canceled)
	assert.Less(t, took, bound)
	t.Logf("returned %v after the cancellation", took)
	assert.Len(t, r.Calls(), 1)
}

// TestQueuedRequestReturnsAtOnceWhenTheDeadlineComesFirst runs on the real
// clock: a request queued behind another waiting for its key's capacity
// (the billing-day pattern: most waiters are queued) fails at once with
// ErrWouldExceedDeadline when its deadline comes before the capacity can,
// as one alone does, without a call to the store.
func TestQueuedRequestReturnsAtOnceWhenTheDeadlineComesFirst(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const bound = 250 * time.Millisecond // scheduling under -race on a busy machine; typically well under 1ms
	store := &counted{Backend: mustMemory(t)}
	th, err := throttler.New(store, nil)
	require.NoError(t, err)
	r := &remote{w: &world{}}
	tr, err := outbound.New(th, &outbound.Options{Policy: throttler.PerMinute(1).Named("gateway"), Base: r})
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodGet, "https://gateway.example/", nil)
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req) // spends the minute's unit
	require.NoError(t, err)
	resp.Body.Close()

	head, stopHead := context.WithCancel(context.Background())
	headDone := make(chan error, 1)
	go func() {
		req, _ := post(t, head)
		_, err := tr.RoundTrip(req)
		headDone <- err
	}()
	// Until the head has queued, a request asks the store itself and is
	// refused by its own denial; once it has, the request is queued.
	queued := false
	for start := time.Now(); !queued && time.Since(start) < 10*time.Second; {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		req, body := post(t, ctx)
		takes := store.takes.Load()
		sent := time.Now()
		_, err := tr.RoundTrip(req)
		took := time.Since(sent)
		cancel()
		require.ErrorIs(t, err, throttler.ErrWouldExceedDeadline)
		require.Less(t, took, bound, "not at once")
		assert.True(t, body.closed)
		queued = store.takes.Load() == takes
		if queued {
			t.Logf("queued, returned after %v", took)
		}
	}
	assert.True(t, queued, "no request ever queued behind the head")
	stopHead()
	require.ErrorIs(t, <-headDone, context.Canceled)
	assert.Len(t, r.Calls(), 1)
}

func mustMemory(t *testing.T) *memory.Backend {
	m, err := memory.New(nil)
	require.NoError(t, err)
	return m
}

// handlerTransport serves requests with a handler, in process.
type handlerTransport struct{ h http.Handler }

func (h handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	h.h.ServeHTTP(rec, r)
	return rec.Result(), nil
}

// TestAgainstThrottlekitsMiddleware: a remote limited by this module's own
// middleware, 2 a minute, on every algorithm, and a client that believes it
// may make 5: the remaining count of 0 on the second answer pauses the
// client until the reset, and the remote never answers 429. t0 is 7s into
// an epoch-aligned minute: the sliding-window counter's window ends 53s
// later, where the previous window's 2 still weigh 2; its reset names when
// they weigh 1, 30s into the next window.
func TestAgainstThrottlekitsMiddleware(t *testing.T) {
	for _, tc := range []struct {
		p     throttler.Policy
		third time.Duration // after t0: when the third call is served
	}{
		{throttler.PerMinute(2), time.Minute},
		{throttler.PerMinute(2).WithAlgorithm(throttler.TokenBucket), time.Minute},
		{throttler.PerMinute(2).WithAlgorithm(throttler.SlidingLog), time.Minute},
		{throttler.PerMinute(2).WithAlgorithm(throttler.SlidingWindow), 83 * time.Second},
	} {
		for _, ietf := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/ietf=%v", tc.p.Algorithm, ietf), func(t *testing.T) {
				w := newWorld()
				server, err := throttler.New(mustMemory(t), &throttler.Options{Clock: w.Now})
				require.NoError(t, err)
				mw, err := httplimit.Rate(server, tc.p.Named("api"), httplimit.KeyByHeader("X-Client"), &httplimit.Options{IETFHeaders: ietf})
				require.NoError(t, err)
				var statuses []int
				var at []time.Time
				api := mw(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { at = append(at, w.Now()) }))
				base := handlerTransport{http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
					rec := httptest.NewRecorder()
					api.ServeHTTP(rec, r)
					statuses = append(statuses, rec.Code)
					for k, v := range rec.Header() {
						rw.Header()[k] = v
					}
					rw.WriteHeader(rec.Code)
				})}
				client, err := throttler.New(mustMemory(t), &throttler.Options{Clock: w.Now})
				require.NoError(t, err)
				tr, err := outbound.New(client, &outbound.Options{Policy: throttler.PerMinute(5), Base: base})
				require.NoError(t, err)
				outbound.SetWorld(tr, w.Now, w.Sleep, noJitter)
				for range 3 {
					req, err := http.NewRequest(http.MethodGet, "http://api.example/", nil)
					require.NoError(t, err)
					req.Header.Set("X-Client", "us")
					resp, err := tr.RoundTrip(req)
					require.NoError(t, err)
					resp.Body.Close()
				}
				assert.Equal(t, []int{200, 200, 200}, statuses)
				require.Len(t, at, 3)
				assert.Equal(t, t0.Add(tc.third), at[2], "the third was served at the reset")
				assert.Len(t, w.Sleeps(), 1)
			})
		}
	}
}

// TestWaitingForCapacity runs on the real clock: the Transport waits
// through Throttler.Wait, so calls beyond the policy go out a window
// later, not as errors.
func TestWaitingForCapacity(t *testing.T) {
	p := throttler.Policy{Limit: 2, Window: 30 * time.Millisecond, Algorithm: throttler.SlidingLog}
	// The instants the limiter admitted each call at: an admitted Take's
	// entry is the log's newest, so it is its ResetAt less the Window. They,
	// not the instants the calls reached the transport below (which add
	// each call's own scheduling delay), are what the limit orders.
	var admitted []time.Time
	for _, d := range sendWaiting(t, p, 4) {
		admitted = append(admitted, d.ResetAt.Add(-p.Window))
	}
	// The third may leave only when the first has left the window.
	assert.GreaterOrEqual(t, admitted[2].Sub(admitted[0]), p.Window)
	assert.GreaterOrEqual(t, admitted[3].Sub(admitted[1]), p.Window)
}

// sendWaiting sends n requests one after another through a Transport
// limited by p on a memory store, on the real clock, checks that every one
// was sent, and returns the Decisions that admitted them, in order.
func sendWaiting(t *testing.T, p throttler.Policy, n int) []throttler.Decision {
	t.Helper()
	var admitted []throttler.Decision
	var mu sync.Mutex
	th, err := throttler.New(mustMemory(t), &throttler.Options{Observe: func(o throttler.Observation) {
		if o.Op == throttler.OpTake && o.Policy == p && o.Decision.Allowed {
			mu.Lock()
			admitted = append(admitted, o.Decision)
			mu.Unlock()
		}
	}})
	require.NoError(t, err)
	r := &remote{w: &world{}}
	tr, err := outbound.New(th, &outbound.Options{Policy: p, Base: r})
	require.NoError(t, err)
	client := &http.Client{Transport: tr}
	for range n {
		resp, err := client.Get("https://gateway.example/")
		require.NoError(t, err)
		resp.Body.Close()
	}
	require.Len(t, r.Calls(), n, "every call was sent")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, admitted, n)
	return admitted
}

// TestPauseJitter: the fleet wakes from a pause spread over up to a tenth
// of it (at most 100ms), never earlier, and never past half the time left
// before the request's deadline.
func TestPauseJitter(t *testing.T) {
	for _, tc := range []struct {
		name     string
		deadline time.Duration // after t0; 0: none
		want     time.Duration
	}{
		{"no deadline", 0, 30*time.Second + 100*time.Millisecond},
		{"near deadline", 30*time.Second + 100*time.Millisecond, 30*time.Second + 50*time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, 1, outbound.Options{Policy: perMinute}, nil)
			outbound.SetWorld(f.trs[0], nil, nil, func(bound time.Duration) time.Duration { return bound })
			f.remote.answer = func(n int, _ *http.Request) *http.Response {
				if n == 0 {
					return respond(http.StatusTooManyRequests, "Retry-After", "30")
				}
				return respond(http.StatusOK)
			}
			f.mustGet(t, 0)
			ctx := context.Background()
			if tc.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, t0.Add(tc.deadline))
				defer cancel()
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://gateway.example/pay", nil)
			require.NoError(t, err)
			resp, err := f.trs[0].RoundTrip(req)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, []time.Duration{tc.want}, f.w.Sleeps())
		})
	}
}
