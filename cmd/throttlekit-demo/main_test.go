package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/throttler"
)

func newServer(t *testing.T, eps []endpoint) *httptest.Server {
	t.Helper()
	return newServerAt(t, eps, nil)
}

// newServerAt is newServer whose limits read clock (nil: the real one).
func newServerAt(t *testing.T, eps []endpoint, clock func() time.Time) *httptest.Server {
	t.Helper()
	srv, _ := startServer(t, eps, defaultShedding(5, time.Minute), clock)
	return srv
}

func newShedServer(t *testing.T, eps []endpoint, sh shedding) (*httptest.Server, *shedAPI) {
	t.Helper()
	return startServer(t, eps, sh, nil)
}

func startServer(t *testing.T, eps []endpoint, sh shedding, clock func() time.Time) (*httptest.Server, *shedAPI) {
	t.Helper()
	h, err := newHandler(eps, sh, clock, log.New(io.Discard, "", 0))
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, h.shed
}

// fakeClock is an instant the test sets; the server's handlers read it.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

func (c *fakeClock) add(d time.Duration) { c.set(c.now().Add(d)) }

func get(t *testing.T, url string, header ...string) (*http.Response, string) {
	t.Helper()
	return send(t, http.MethodGet, url, header...)
}

func send(t *testing.T, method, url string, header ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	return resp, string(body)
}

// rateLimit is GET /rate_limit's answer for the client of header.
func rateLimit(t *testing.T, url string, header ...string) map[string]map[string]float64 {
	t.Helper()
	r, body := get(t, url+"/rate_limit", header...)
	require.Equal(t, 200, r.StatusCode)
	var v struct {
		Resources map[string]map[string]float64
		Rate      map[string]float64
	}
	require.NoError(t, json.Unmarshal([]byte(body), &v))
	require.Equal(t, v.Resources["core"], v.Rate, "rate is core's, as on GitHub")
	return v.Resources
}

func TestDemoAPI(t *testing.T) {
	srv := newServer(t, endpoints(2, time.Hour, 0))
	r, _ := get(t, srv.URL+"/repos")
	assert.Equal(t, 200, r.StatusCode)
	assert.Equal(t, "1", r.Header.Get("X-RateLimit-Remaining"))
	assert.Equal(t, `"core";q=2;w=3600`, r.Header.Get("RateLimit-Policy"))
	reset := r.Header.Get("X-RateLimit-Reset")

	r, _ = get(t, srv.URL+"/repos", "If-None-Match", `"repos-v1"`)
	assert.Equal(t, 304, r.StatusCode)
	assert.Equal(t, "1", r.Header.Get("X-RateLimit-Remaining"), "the 304 was refunded")
	assert.Equal(t, reset, r.Header.Get("X-RateLimit-Reset"))

	r, _ = get(t, srv.URL+"/repos")
	assert.Equal(t, 200, r.StatusCode)
	r, _ = get(t, srv.URL+"/repos")
	assert.Equal(t, 429, r.StatusCode)
	assert.NotEmpty(t, r.Header.Get("Retry-After"))
	r, _ = get(t, srv.URL+"/repos", "Authorization", "token alice")
	assert.Equal(t, 200, r.StatusCode, "another client has its own window")

	assert.Equal(t, float64(2), rateLimit(t, srv.URL)["core"]["used"], "rate_limit does not count")
	assert.Equal(t, float64(2), rateLimit(t, srv.URL)["core"]["used"])
}

// The token bucket and the sliding log, side by side with the fixed window
// at the same limit: the bucket admits its burst and then asks for one
// token's wait, the log the wait until its first entry ages out; the
// headers and /rate_limit say what each counts.
func TestDemoAlgorithms(t *testing.T) {
	srv := newServer(t, endpoints(2, time.Hour, 5)) // a bucket of 5, a token every 30 minutes
	bob := []string{"Authorization", "token bob"}
	spend := func(path string, n int) *http.Response {
		t.Helper()
		for i := range n {
			r, _ := get(t, srv.URL+path, bob...)
			require.Equal(t, 200, r.StatusCode, "%s, request %d", path, i)
		}
		r, _ := get(t, srv.URL+path, bob...)
		require.Equal(t, 429, r.StatusCode, path)
		return r
	}
	retryAfter := func(r *http.Response) int64 {
		t.Helper()
		n, err := strconv.ParseInt(r.Header.Get("Retry-After"), 10, 64)
		require.NoError(t, err)
		return n
	}

	r := spend("/search", 5)
	assert.Equal(t, "5", r.Header.Get("X-RateLimit-Limit"), "a bucket's limit is its capacity")
	assert.Equal(t, "0", r.Header.Get("X-RateLimit-Remaining"))
	assert.Equal(t, "search", r.Header.Get("X-RateLimit-Resource"))
	assert.InDelta(t, 30*60, retryAfter(r), 2, "one token's wait, not the rest of an hour")
	reset, err := strconv.ParseInt(r.Header.Get("X-RateLimit-Reset"), 10, 64)
	require.NoError(t, err)
	assert.InDelta(t, time.Now().Add(5*30*time.Minute).Unix(), reset, 3, "full again after 5 tokens' refill")

	r = spend("/deliveries", 2)
	assert.Equal(t, "2", r.Header.Get("X-RateLimit-Limit"))
	assert.InDelta(t, 3600, retryAfter(r), 2, "until the first entry is an hour old")

	res := rateLimit(t, srv.URL, bob...)
	assert.Equal(t, map[string]float64{"limit": 5, "used": 5, "remaining": 0, "reset": float64(reset)}, res["search"])
	assert.Equal(t, float64(2), res["deliveries"]["used"])
	assert.Equal(t, float64(0), res["core"]["used"], "each policy counts apart")
}

// The login's composite at fixed instants: a login leaves login-s nothing,
// so the headers are login-s's and RateLimit-Policy lists both members; a
// second login in that second is refused by login-s and counts in neither
// member; once login-h is spent, the refusal is its own and login-s keeps
// its unit.
func TestDemoLogin(t *testing.T) {
	t0 := time.Date(2031, 1, 2, 3, 4, 5, 250e6, time.UTC)
	clock := &fakeClock{t: t0}
	srv := newServerAt(t, endpoints(5, time.Minute, 0), clock.now)
	carol := []string{"Authorization", "token carol"}
	login := func(at time.Time) *http.Response {
		t.Helper()
		clock.set(at)
		r, _ := send(t, http.MethodPost, srv.URL+"/login", carol...)
		return r
	}
	unix := func(t time.Time) string { return strconv.FormatInt(unixCeil(t), 10) }
	wantPolicy := `"login-s";q=1;w=1, "login-h";q=100;w=3600`

	r := login(t0)
	assert.Equal(t, http.StatusOK, r.StatusCode)
	assert.Equal(t, "login-s", r.Header.Get("X-RateLimit-Resource"))
	assert.Equal(t, "1", r.Header.Get("X-RateLimit-Limit"))
	assert.Equal(t, "0", r.Header.Get("X-RateLimit-Remaining"))
	assert.Equal(t, unix(t0.Add(time.Second)), r.Header.Get("X-RateLimit-Reset"))
	assert.Equal(t, wantPolicy, r.Header.Get("RateLimit-Policy"))
	assert.Equal(t, `"login-s";r=0;t=1`, r.Header.Get("RateLimit"))

	r = login(t0.Add(500 * time.Millisecond))
	assert.Equal(t, http.StatusTooManyRequests, r.StatusCode)
	assert.Equal(t, "1", r.Header.Get("Retry-After"), "login-s's half second, rounded up")
	assert.Equal(t, "login-s", r.Header.Get("X-RateLimit-Resource"))
	assert.Equal(t, "0", r.Header.Get("X-RateLimit-Remaining"))
	assert.Equal(t, wantPolicy, r.Header.Get("RateLimit-Policy"))
	res := rateLimit(t, srv.URL, carol...)
	assert.Equal(t, map[string]float64{"limit": 100, "used": 1, "remaining": 99, "reset": float64(unixCeil(t0.Add(time.Hour)))},
		res["login-h"], "the refused login spent nothing from the hour")
	assert.Equal(t, map[string]float64{"limit": 1, "used": 1, "remaining": 0, "reset": float64(unixCeil(t0.Add(time.Second)))},
		res["login-s"])
	assert.Equal(t, float64(0), rateLimit(t, srv.URL)["login-h"]["used"], "another client has its own limits")

	// A login a second, from the Retry-After on: the hour's other 99.
	for i := 1; i < 100; i++ {
		r = login(t0.Add(time.Duration(i) * time.Second))
		require.Equal(t, http.StatusOK, r.StatusCode, "login %d", i)
	}
	assert.Equal(t, "login-h", r.Header.Get("X-RateLimit-Resource"), "both have 0 left: the later reset binds")
	at := t0.Add(100 * time.Second)
	r = login(at)
	assert.Equal(t, http.StatusTooManyRequests, r.StatusCode)
	assert.Equal(t, "login-h", r.Header.Get("X-RateLimit-Resource"))
	assert.Equal(t, "100", r.Header.Get("X-RateLimit-Limit"))
	assert.Equal(t, strconv.Itoa(3600-100), r.Header.Get("Retry-After"))
	assert.Equal(t, `"login-h";r=0;t=3500`, r.Header.Get("RateLimit"))
	res = rateLimit(t, srv.URL, carol...)
	assert.Equal(t, float64(0), res["login-s"]["used"], "refused by login-h, the login spent nothing from its second")
	assert.Equal(t, float64(100), res["login-h"]["used"])
}

// Input errors are the client's: 400 on every endpoint, never a 503, and
// the answer never repeats the key (often a secret token).
func TestDemoInputErrorsAnswer400(t *testing.T) {
	srv := newServer(t, endpoints(5, time.Minute, 0))
	secret := "s3cr3t-" + strings.Repeat("x", throttler.MaxKeyLen) // too long for any store
	for _, route := range []string{"GET /repos", "GET /search", "GET /deliveries", "POST /login", "GET /rate_limit"} {
		method, path, _ := strings.Cut(route, " ")
		for _, auth := range []string{"Basic xyz", "token ", "token " + secret} {
			r, body := send(t, method, srv.URL+path, "Authorization", auth)
			assert.Equal(t, http.StatusBadRequest, r.StatusCode, "%s with Authorization %.20q", route, auth)
			assert.Equal(t, "Bad Request\n", body)
			assert.NotContains(t, body, "s3cr3t")
		}
	}
}

// The printed commands work in the order shown, for any limit: each gets
// the status its note promises (a 304 example run after the limit was spent
// would get a 429), at instants the test sets: a command's sleep moves the
// clock, so that the two logins at once are in one second.
func TestUsageCommandsWorkInTheOrderShown(t *testing.T) {
	for _, limit := range []int64{1, 2, 5} {
		eps := endpoints(limit, time.Hour, 0)
		clock := &fakeClock{t: time.Date(2031, 1, 2, 3, 4, 5, 250e6, time.UTC)}
		srv := newServerAt(t, eps, clock.now)
		var usage bytes.Buffer
		printUsage(&usage, srv.URL, eps, defaultShedding(limit, time.Hour))
		for i, s := range trySteps(eps) {
			require.Contains(t, usage.String(), "  "+s.command(srv.URL)+"\n")
			var header []string
			if s.header != "" {
				name, value, ok := strings.Cut(s.header, ": ")
				require.True(t, ok)
				header = []string{name, value}
			}
			method := s.method
			if method == "" {
				method = http.MethodGet
			}
			clock.add(s.sleep)
			var statuses []int
			var last *http.Response
			var body string
			for range s.times {
				last, body = send(t, method, srv.URL+s.path, header...)
				statuses = append(statuses, last.StatusCode)
			}
			assert.Equal(t, s.want, statuses[len(statuses)-1], "limit %d, step %d: %s", limit, i, s.note)
			if s.used != nil {
				var v struct {
					Resources map[string]struct{ Used int64 }
				}
				require.NoError(t, json.Unmarshal([]byte(body), &v))
				for name, want := range s.used {
					assert.Equal(t, want, v.Resources[name].Used, "limit %d, step %d, %s: %s", limit, i, name, s.note)
				}
			}
			if s.retryMax > 0 {
				retry, err := strconv.ParseInt(last.Header.Get("Retry-After"), 10, 64)
				assert.NoError(t, err)
				assert.True(t, s.retryMin <= retry && retry <= s.retryMax, "limit %d, step %d: Retry-After %d, want %d..%d: %s",
					limit, i, retry, s.retryMin, s.retryMax, s.note)
			}
			if s.times > 1 {
				for j, code := range statuses[:len(statuses)-1] {
					assert.Equal(t, http.StatusOK, code, "limit %d, step %d, request %d", limit, i, j)
				}
			}
		}
	}
}

func TestUsage(t *testing.T) {
	var b bytes.Buffer
	printUsage(&b, "http://127.0.0.1:1234", endpoints(5, time.Minute, 0), defaultShedding(5, time.Minute))
	want := `throttlekit demo listening on http://127.0.0.1:1234 (memory backend)

Limits, per client:
  GET /repos       core: 5 per 1m0s
                   a window that resets at a stored instant (GitHub)
  GET /search      search: 5 per 1m0s (token-bucket, burst 10)
                   a steady rate with bursts (Stripe)
  GET /deliveries  deliveries: 5 per 1m0s (sliding-log)
                   at most the limit in any window (Circles' outbound calls)
  POST /login      all(login-s: 1 per 1s; login-h: 100 per 1h0m0s)
                   both limits, all or nothing: a refused login counts in neither

Try it, in this order:
  # 304: the unit is refunded, X-RateLimit-Remaining stays 5
  curl -i -H 'If-None-Match: "repos-v1"' http://127.0.0.1:1234/repos
  # 200: X-RateLimit-Remaining falls to 4
  curl -i http://127.0.0.1:1234/repos
  # every limit, not counted
  curl -i http://127.0.0.1:1234/rate_limit
  # 400: a malformed key is the client's error
  curl -i -H 'Authorization: Basic xyz' http://127.0.0.1:1234/repos
  # another client, its own window: 5 x 200
  for i in $(seq 5); do curl -s -o /dev/null -w '%{http_code}\n' -H 'Authorization: token alice' http://127.0.0.1:1234/repos; done
  # 429 until the window ends (Retry-After at most 60)
  curl -i -H 'Authorization: token alice' http://127.0.0.1:1234/repos
  # search, a token bucket: its whole burst: 10 x 200
  for i in $(seq 10); do curl -s -o /dev/null -w '%{http_code}\n' -H 'Authorization: token alice' http://127.0.0.1:1234/search; done
  # 429 until a token refills, one every 12s (Retry-After at most 12); X-RateLimit-Limit is the burst, X-RateLimit-Reset when the bucket is full again
  curl -i -H 'Authorization: token alice' http://127.0.0.1:1234/search
  # deliveries, a sliding log: 5 x 200
  for i in $(seq 5); do curl -s -o /dev/null -w '%{http_code}\n' -H 'Authorization: token alice' http://127.0.0.1:1234/deliveries; done
  # 429 until the first of them is 1m0s old (Retry-After at most 60)
  curl -i -H 'Authorization: token alice' http://127.0.0.1:1234/deliveries
  # login: two at once are 200, then 429 with Retry-After 1 from login-s; X-RateLimit-* are login-s's (the binding limit), RateLimit-Policy lists login-s and login-h
  curl -i -X POST -H 'Authorization: token alice' http://127.0.0.1:1234/login http://127.0.0.1:1234/login
  # login-h used 1, not 2: the refused login counted in neither limit
  curl -i -H 'Authorization: token alice' http://127.0.0.1:1234/rate_limit
  # after the Retry-After, a login passes again
  sleep 1; curl -i -X POST -H 'Authorization: token alice' http://127.0.0.1:1234/login

Stripe's four limiters, in this order, on GET|POST /exports (each takes 5s) and POST /charges (critical):
  worker shedder  4 workers; sheds after 28s of utilization above 0.8, all but critical 2m0s later
  fleet shedder   5 requests at once, of which non-critical traffic may hold 4
  concurrency     2 exports in flight per client
  rate            exports: 5 per 1m0s; charges: 5 per 1m0s
A refusal names its limiter in X-RateLimit-Limiter: 503 for the shedders, 429 for the limits.

Try it:
  # concurrency: 3 exports of one client at once; the one over 2 gets 429 concurrency
  for i in $(seq 3); do curl -s -o /dev/null -w '%{http_code} %header{X-RateLimit-Limiter}\n' -H 'Authorization: token bob' http://127.0.0.1:1234/exports & done; wait
  # fleet: 5 clients at once; beyond the non-critical share they get 503 fleet-shedder, a charge still passes
  for i in $(seq 5); do curl -s -o /dev/null -w '%{http_code} %header{X-RateLimit-Limiter}\n' -H "Authorization: token c$i" http://127.0.0.1:1234/exports & done; sleep 1; curl -s -o /dev/null -w '%{http_code} %header{X-RateLimit-Limiter}\n' -X POST http://127.0.0.1:1234/charges; wait
  # worker: pretend the process is saturated
  curl -X PUT 'http://127.0.0.1:1234/admin/utilization?value=1'
  # watch the shedding amount: it reaches 0 after 28s, then test-mode traffic goes first, then reads, then writes
  curl -s http://127.0.0.1:1234/admin/shedding
  # a test-mode export once shedding has started: 503 worker-shedder (or 200, by chance, early on)
  curl -s -o /dev/null -w '%{http_code} %header{X-RateLimit-Limiter}\n' -H 'X-Test-Mode: 1' http://127.0.0.1:1234/exports
  # back to normal: traffic comes back as slowly
  curl -X PUT 'http://127.0.0.1:1234/admin/utilization?value=0'

Ctrl-C stops it.
`
	assert.Equal(t, want, b.String())
}

// A flag value that one of the policies cannot take stops the demo before
// it listens, with an error naming the endpoint.
func TestBadPolicyFailsBeforeListening(t *testing.T) {
	for _, tc := range []struct {
		limit  int64
		window time.Duration
		burst  int64
		path   string
	}{
		{0, time.Minute, 0, "/repos"},
		{5, 0, 0, "/repos"},
		{-1, time.Minute, 0, "/repos"},
		{5, time.Minute, -1, "/search"},
		{throttler.MaxLogLimit + 1, time.Minute, 1, "/deliveries"},
	} {
		eps := endpoints(tc.limit, tc.window, tc.burst)
		_, err := newHandler(eps, defaultShedding(5, time.Minute), nil, log.New(io.Discard, "", 0))
		assert.ErrorIs(t, err, throttler.ErrInvalidPolicy, "%+v", tc)
		assert.ErrorContains(t, err, tc.path+": ", "%+v", tc)
		err = run("256.0.0.1:0", eps, defaultShedding(5, time.Minute), io.Discard) // an address that cannot be listened on: never reached
		assert.ErrorIs(t, err, throttler.ErrInvalidPolicy, "%+v", tc)
	}
}
