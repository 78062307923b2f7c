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

func TestDemoAPI(t *testing.T) {
	srv := httptest.NewServer(newHandler(throttler.Policy{Name: "core", Limit: 2, Window: time.Hour}, log.New(io.Discard, "", 0)))
	defer srv.Close()
	get := func(path string, header ...string) *http.Response {
		req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		require.NoError(t, err)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	r := get("/repos")
	assert.Equal(t, 200, r.StatusCode)
	assert.Equal(t, "1", r.Header.Get("X-RateLimit-Remaining"))
	reset := r.Header.Get("X-RateLimit-Reset")

	r = get("/repos", "If-None-Match", `"repos-v1"`)
	assert.Equal(t, 304, r.StatusCode)
	assert.Equal(t, "1", r.Header.Get("X-RateLimit-Remaining"), "the 304 was refunded")
	assert.Equal(t, reset, r.Header.Get("X-RateLimit-Reset"))

	assert.Equal(t, 200, get("/repos").StatusCode)
	r = get("/repos")
	assert.Equal(t, 429, r.StatusCode)
	assert.NotEmpty(t, r.Header.Get("Retry-After"))
	assert.Equal(t, 200, get("/repos", "Authorization", "token alice").StatusCode, "another client has its own window")
	assert.Equal(t, 400, get("/repos", "Authorization", "Basic xyz").StatusCode)

	resp, err := http.Get(srv.URL + "/rate_limit")
	require.NoError(t, err)
	defer resp.Body.Close()
	var body map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	assert.Equal(t, float64(2), body["used"], "rate_limit does not count")
}

func TestUsageNamesTheAddress(t *testing.T) {
	var b bytes.Buffer
	printUsage(&b, "http://127.0.0.1:1234", throttler.PerMinute(5).Named("core"))
	assert.True(t, strings.Contains(b.String(), "curl -i http://127.0.0.1:1234/repos"))
}

func TestRunRejectsABadPolicy(t *testing.T) {
	err := run("127.0.0.1:0", throttler.Policy{Name: "core", Limit: 0, Window: time.Minute}, io.Discard)
	assert.ErrorIs(t, err, throttler.ErrInvalidPolicy)
}
