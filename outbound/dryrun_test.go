package outbound_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/throttlekit/throttlekit/flags"

	"github.com/throttlekit/throttlekit/outbound"
	"github.com/throttlekit/throttlekit/throttler"
)

// TestDryRun: a policy in dry run sends every request at once, waiting or
// failing fast, and still counts them.
func TestDryRun(t *testing.T) {
	p := throttler.PerMinute(1).Named("gateway").DryRun()
	for _, failFast := range []bool{false, true} {
		f := newFleet(t, 1, outbound.Options{Policy: p, FailFast: failFast}, nil)
		for range 3 {
			assert.Equal(t, http.StatusOK, f.mustGet(t, 0).StatusCode, "FailFast %v", failFast)
		}
		assert.Len(t, f.remote.Calls(), 3, "FailFast %v", failFast)
		assert.Empty(t, f.w.Sleeps(), "FailFast %v", failFast)
		d, err := f.ths[0].Peek(context.Background(), gatewayKey, p)
		require.NoError(t, err)
		assert.True(t, d.WouldDeny, "FailFast %v", failFast)
		assert.Equal(t, int64(1), d.Used, "FailFast %v", failFast)
	}
}

// nilSet is an Enforcer that cannot be used as a nil pointer.
type nilSet struct{}

func (*nilSet) Enforced(string) bool { return true }

// A Route's policy with a nil Enforcer is an error of the request, before
// anything is sent.
func TestRouteWithABadEnforcer(t *testing.T) {
	route := func(*http.Request) (outbound.Route, error) {
		return outbound.Route{Policy: throttler.PerMinute(1).Named("gateway").EnforcedBy((*nilSet)(nil))}, nil
	}
	f := newFleet(t, 1, outbound.Options{Policy: perMinute, Route: route}, nil)
	_, err := f.get(t, 0)
	require.ErrorIs(t, err, throttler.ErrInvalidPolicy)
	assert.Empty(t, f.remote.Calls())
}

// TestARollbackToDryRunSendsAtOnce: a key enforced while a request waits
// for its capacity, then rolled back to dry run: a new request of that key
// is sent at once, never queued behind the waiting one (which a request
// with a deadline before the key's capacity would be refused for). The
// window runs on the fake clock, which nothing moves; the waiting request's
// sleep is the Throttler's own, which only its cancellation ends.
func TestARollbackToDryRunSendsAtOnce(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	pct, err := flags.NewPercent(100)
	require.NoError(t, err)
	e, err := flags.Enforcement(pct)
	require.NoError(t, err)
	p := throttler.PerMinute(1).Named("gateway").EnforcedBy(e)
	f := newFleet(t, 1, outbound.Options{Policy: p}, nil)
	require.Equal(t, http.StatusOK, f.mustGet(t, 0).StatusCode) // spends the minute's unit

	head, stopHead := context.WithCancel(context.Background())
	defer stopHead()
	headDone := make(chan error, 1)
	go func() {
		req, _ := post(t, head)
		resp, err := f.trs[0].RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		headDone <- err
	}()
	// Until the head has queued, a request asks the store itself and is
	// refused by its own denial; once it has, the request is queued.
	queued := false
	for start := time.Now(); !queued && time.Since(start) < 10*time.Second; {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		req, _ := post(t, ctx)
		takes := f.store.takes.Load()
		_, err := f.trs[0].RoundTrip(req)
		cancel()
		require.ErrorIs(t, err, throttler.ErrWouldExceedDeadline)
		queued = f.store.takes.Load() == takes
	}
	require.True(t, queued, "no request ever queued behind the head")

	require.NoError(t, pct.Set(0))
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := post(t, ctx)
	resp, err := f.trs[0].RoundTrip(req)
	require.NoError(t, err, "queued behind the head")
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	require.GreaterOrEqual(t, len(f.remote.Calls()), 2, "sent")

	stopHead()
	if err := <-headDone; err != nil {
		require.ErrorIs(t, err, context.Canceled, "the head is sent once it sees the rollback, or canceled")
	}
	d, err := f.ths[0].Peek(context.Background(), gatewayKey, p)
	require.NoError(t, err)
	assert.True(t, d.WouldDeny, "the requests sent in dry run are counted")
}

// TestDryRunStillHonoursAPause: a key in dry run waits for no capacity,
// but a pause its remote asked for holds it: that is the remote's limit.
func TestDryRunStillHonoursAPause(t *testing.T) {
	f := newFleet(t, 1, outbound.Options{Policy: throttler.PerMinute(1).Named("gateway").DryRun()}, nil)
	f.remote.answer = func(n int, _ *http.Request) *http.Response {
		if n == 0 {
			return respond(http.StatusTooManyRequests, "Retry-After", "30")
		}
		return respond(http.StatusOK)
	}
	assert.Equal(t, http.StatusTooManyRequests, f.mustGet(t, 0).StatusCode)
	assert.Equal(t, http.StatusOK, f.mustGet(t, 0).StatusCode)
	assert.Equal(t, []time.Duration{30 * time.Second}, f.w.Sleeps(), "the pause, no wait for capacity")
	calls := f.remote.Calls()
	require.Len(t, calls, 2)
	assert.Equal(t, t0.Add(30*time.Second), calls[1].at)
}
