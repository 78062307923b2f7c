package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/throttler"
)

func newServer(t *testing.T, p throttler.Policy) *httptest.Server {
	t.Helper()
	h, err := newHandler(p, log.New(io.Discard, "", 0))
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, url string, header ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
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

func TestDemoAPI(t *testing.T) {
	srv := newServer(t, throttler.Policy{Name: "core", Limit: 2, Window: time.Hour})
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

	r, body := get(t, srv.URL+"/rate_limit")
	require.Equal(t, 200, r.StatusCode)
	var window map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &window))
	assert.Equal(t, float64(2), window["used"], "rate_limit does not count")
	r, body = get(t, srv.URL+"/rate_limit")
	require.Equal(t, 200, r.StatusCode)
	require.NoError(t, json.Unmarshal([]byte(body), &window))
	assert.Equal(t, float64(2), window["used"])
}

// Input errors are the client's: 400 on both endpoints, never a 503, and
// the answer never repeats the key (often a secret token).
func TestDemoInputErrorsAnswer400(t *testing.T) {
	srv := newServer(t, throttler.PerMinute(5).Named("core"))
	secret := "s3cr3t-" + strings.Repeat("x", throttler.MaxKeyLen) // too long for any store
	for _, path := range []string{"/repos", "/rate_limit"} {
		for _, auth := range []string{"Basic xyz", "token ", "token " + secret} {
			r, body := get(t, srv.URL+path, "Authorization", auth)
			assert.Equal(t, http.StatusBadRequest, r.StatusCode, "%s with Authorization %.20q", path, auth)
			assert.Equal(t, "Bad Request\n", body)
			assert.NotContains(t, body, "s3cr3t")
		}
	}
}

// The printed commands work in the order shown, for any limit: each gets
// the status its note promises (issue 10: the 304 example used to run after
// the limit was spent, and got a 429).
func TestUsageCommandsWorkInTheOrderShown(t *testing.T) {
	for _, limit := range []int64{1, 2, 5} {
		p := throttler.PerHour(limit).Named("core")
		srv := newServer(t, p)
		var usage bytes.Buffer
		printUsage(&usage, srv.URL, p)
		for i, s := range trySteps(p) {
			require.Contains(t, usage.String(), "  "+s.command(srv.URL)+"\n")
			var header []string
			if s.header != "" {
				name, value, ok := strings.Cut(s.header, ": ")
				require.True(t, ok)
				header = []string{name, value}
			}
			var statuses []int
			for range s.times {
				r, _ := get(t, srv.URL+s.path, header...)
				statuses = append(statuses, r.StatusCode)
			}
			assert.Equal(t, s.want, statuses[len(statuses)-1], "limit %d, step %d: %s", limit, i, s.note)
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
	printUsage(&b, "http://127.0.0.1:1234", throttler.PerMinute(5).Named("core"))
	want := `throttlekit demo listening on http://127.0.0.1:1234 (policy core: 5 per 1m0s, memory backend)

Try it, in this order:
  # 304: the unit is refunded, X-RateLimit-Remaining stays 5
  curl -i -H 'If-None-Match: "repos-v1"' http://127.0.0.1:1234/repos
  # 200: X-RateLimit-Remaining falls to 4
  curl -i http://127.0.0.1:1234/repos
  # the window, not counted
  curl -i http://127.0.0.1:1234/rate_limit
  # 400: a malformed key is the client's error
  curl -i -H 'Authorization: Basic xyz' http://127.0.0.1:1234/repos
  # another client, its own window: 5 x 200, then 429 with Retry-After
  for i in $(seq 6); do curl -s -o /dev/null -w '%{http_code}\n' -H 'Authorization: token alice' http://127.0.0.1:1234/repos; done

Ctrl-C stops it.
`
	assert.Equal(t, want, b.String())
}

func TestBadPolicyFailsBeforeListening(t *testing.T) {
	for _, p := range []throttler.Policy{{Name: "core", Limit: 0, Window: time.Minute}, {Name: "core", Limit: 5}, {}} {
		_, err := newHandler(p, log.New(io.Discard, "", 0))
		assert.ErrorIs(t, err, throttler.ErrInvalidPolicy, "%v", p)
		err = run("256.0.0.1:0", p, io.Discard) // an address that cannot be listened on: never reached
		assert.ErrorIs(t, err, throttler.ErrInvalidPolicy, "%v", p)
	}
}
