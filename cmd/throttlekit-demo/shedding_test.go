package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/shed"
)

func do(t *testing.T, ctx context.Context, method, url string, header ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if ctx.Err() != nil {
		return nil // a request the test cancelled
	}
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// waitFor waits until count() is n, or fails the test after 30s.
func waitFor(t *testing.T, what string, count func() int64, n int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for count() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d, want %d", what, count(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitExporting waits until n exports run in their handler: each holds its
// fleet slot and its concurrency lease. The worker shedder's in-flight count is
// not enough: it counts a request as soon as that shedder admits it, before
// the fleet and concurrency limiters have, so a check made then could find
// a slot still free and start an hour-long export that nothing cancels.
func waitExporting(t *testing.T, api *shedAPI, n int64) {
	t.Helper()
	waitFor(t, "exports in their handler", api.exporting.Load, n)
}

// waitInFlight waits until the worker shedder counts n exports in flight.
func waitInFlight(t *testing.T, api *shedAPI, n int64) {
	t.Helper()
	waitFor(t, "in flight", func() int64 { return api.worker.Stats().InFlight }, n)
}

// Exports that run until the test cancels them: bob's third at once is
// refused by the concurrency limit; with 4 exports in flight the fleet's
// non-critical share is full and a fifth client's is shed, while a charge
// (critical) passes; once they end, every lease is back.
func TestDemoConcurrencyAndFleet(t *testing.T) {
	sh := defaultShedding(100, time.Hour)
	sh.work = time.Hour // until cancelled
	srv, api := newShedServer(t, endpoints(5, time.Minute, 0), sh)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	// Registered after the server's Close, so it runs first: a check that
	// stops the test early must still end the hour-long exports, or Close
	// waits for them until the test binary's timeout.
	t.Cleanup(func() { cancel(); wg.Wait() })
	hold := func(client string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			do(t, ctx, "GET", srv.URL+"/exports", "Authorization", "token "+client)
		}()
	}
	hold("bob")
	hold("bob")
	waitExporting(t, api, 2)
	r := do(t, context.Background(), "GET", srv.URL+"/exports", "Authorization", "token bob")
	assert.Equal(t, http.StatusTooManyRequests, r.StatusCode)
	assert.Equal(t, "concurrency", r.Header.Get(shed.HeaderLimiter))
	assert.Equal(t, "exports-inflight", r.Header.Get("X-RateLimit-Resource"))
	assert.Equal(t, "2", r.Header.Get("X-RateLimit-Limit"))

	hold("c1")
	hold("c2")
	waitExporting(t, api, 4)
	r = do(t, context.Background(), "POST", srv.URL+"/exports", "Authorization", "token c3")
	assert.Equal(t, http.StatusServiceUnavailable, r.StatusCode)
	assert.Equal(t, "fleet-shedder", r.Header.Get(shed.HeaderLimiter))
	r = do(t, context.Background(), "POST", srv.URL+"/charges", "Authorization", "token c3")
	assert.Equal(t, http.StatusOK, r.StatusCode, "critical traffic is never shed")
	assert.Empty(t, r.Header.Get(shed.HeaderLimiter))
	assert.Equal(t, "charges", r.Header.Get("X-RateLimit-Resource"))

	cancel()
	wg.Wait()
	waitInFlight(t, api, 0)
	for i := range 4 {
		_, d, err := api.fleet.Admit(context.Background(), shed.Read)
		require.NoError(t, err)
		assert.True(t, d.Allowed, "fleet slot %d: the exports' leases were released", i)
	}
}

// A pretend saturation, the worker shedder's ticks at fixed instants: after
// 68 s test-mode traffic is shed entirely and reads not yet; charges pass.
func TestDemoWorkerShedder(t *testing.T) {
	sh := defaultShedding(100, time.Hour)
	sh.work = 0
	srv, api := newShedServer(t, endpoints(5, time.Minute, 0), sh)
	bg := context.Background()
	for _, v := range []string{"2", "-0.1", "NaN", "x", ""} {
		r := do(t, bg, "PUT", srv.URL+"/admin/utilization?value="+v)
		assert.Equal(t, http.StatusBadRequest, r.StatusCode, "value %q", v)
	}
	r := do(t, bg, "PUT", srv.URL+"/admin/utilization?value=1")
	require.Equal(t, http.StatusNoContent, r.StatusCode)
	t0 := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	for s := 0; s <= 68; s++ {
		api.worker.Update(t0.Add(time.Duration(s) * time.Second))
	}
	r = do(t, bg, "GET", srv.URL+"/exports", "Authorization", "token dave", "X-Test-Mode", "1")
	assert.Equal(t, http.StatusServiceUnavailable, r.StatusCode)
	assert.Equal(t, "worker-shedder", r.Header.Get(shed.HeaderLimiter))
	r = do(t, bg, "GET", srv.URL+"/exports", "Authorization", "token dave")
	assert.Equal(t, http.StatusOK, r.StatusCode, "reads are not shed yet")
	r = do(t, bg, "POST", srv.URL+"/charges", "Authorization", "token dave", "X-Test-Mode", "1")
	assert.Equal(t, http.StatusOK, r.StatusCode, "critical wins over test mode")

	resp, err := http.Get(srv.URL + "/admin/shedding")
	require.NoError(t, err)
	defer resp.Body.Close()
	var state struct {
		ShedAmount float64            `json:"shed_amount"`
		Drop       map[string]float64 `json:"drop_chance"`
		Pretend    float64            `json:"pretend_utilization"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&state))
	assert.InDelta(t, 40.0/120, state.ShedAmount, 1e-9)
	assert.Equal(t, map[string]float64{"test-mode": 1, "read": 0, "write": 0, "critical": 0}, state.Drop)
	assert.Equal(t, 1.0, state.Pretend)
}

// Shedding flags that cannot work stop the demo before it listens.
func TestBadSheddingFailsBeforeListening(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*shedding)
		want string
	}{
		{"no workers", func(s *shedding) { s.workers = 0 }, "-workers must be at least 1"},
		{"no fleet", func(s *shedding) { s.fleet = 0 }, "concurrency limit must be between"},
		{"share above 1", func(s *shedding) { s.share = 1.5 }, "Share must be in (0, 1]"},
		{"no inflight", func(s *shedding) { s.inflight = 0 }, "/exports: throttler: invalid policy: concurrency limit"},
		{"ramp negative", func(s *shedding) { s.ramp = -time.Second }, "Ramp must be >= 0"},
	} {
		sh := defaultShedding(5, time.Minute)
		tc.edit(&sh)
		err := run("256.0.0.1:0", endpoints(5, time.Minute, 0), sh, io.Discard)
		assert.ErrorContains(t, err, tc.want, tc.name)
	}
}
