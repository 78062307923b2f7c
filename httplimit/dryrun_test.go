package httplimit_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/httplimit"
	"github.com/throttlekit/throttlekit/throttler"
)

// keySet enforces the keys in it.
type keySet struct{ keys map[string]bool }

func (s *keySet) Enforced(k string) bool { return s.keys[k] }

var rateHeaders = []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Used",
	"X-RateLimit-Reset", "X-RateLimit-Resource", "RateLimit-Policy", "RateLimit", "Retry-After"}

// TestRateDryRun: a key the policy does not enforce is never refused and,
// unless DryRunHeaders, gets no rate headers; an enforced key of the same
// policy is refused as usual.
func TestRateDryRun(t *testing.T) {
	p := throttler.PerMinute(1).Named("api").EnforcedBy(&keySet{keys: map[string]bool{"alice": true}})
	for _, opted := range []bool{false, true} {
		th := newThrottler(t, newMemory(t), &throttler.Options{Clock: func() time.Time { return t0 }})
		reached := 0
		h := newRate(t, th, p, httplimit.KeyByHeader("X-Client"),
			&httplimit.Options{DryRunHeaders: opted, IETFHeaders: true})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			reached++
		}))
		for i := range 3 {
			w := serve(h, "X-Client", "bob")
			require.Equal(t, http.StatusOK, w.Code, "bob, call %d", i)
			assert.Empty(t, w.Header().Get("Retry-After"), "bob, call %d", i)
			for _, name := range rateHeaders[:len(rateHeaders)-1] {
				assert.Equal(t, opted, w.Header().Get(name) != "", "bob, call %d, header %s, DryRunHeaders %v", i, name, opted)
			}
			if opted {
				assert.Equal(t, "0", w.Header().Get("X-RateLimit-Remaining"), "bob, call %d", i)
				assert.Equal(t, "1", w.Header().Get("X-RateLimit-Used"), "bob, call %d: a would-be denial counts nothing", i)
			}
		}
		assert.Equal(t, 3, reached)
		w := serve(h, "X-Client", "alice")
		require.Equal(t, http.StatusOK, w.Code)
		assert.Equal(t, "0", w.Header().Get("X-RateLimit-Remaining"), "an enforced key has its headers")
		w = serve(h, "X-Client", "alice")
		require.Equal(t, http.StatusTooManyRequests, w.Code)
		assert.NotEmpty(t, w.Header().Get("Retry-After"))
		assert.Equal(t, "0", w.Header().Get("X-RateLimit-Remaining"))
		assert.Equal(t, 4, reached)
	}
}

// A 304 gives its unit back to a dry-run key whose call was counted, and
// nothing for a would-be denial, which counted nothing.
func TestRateDryRunRefund(t *testing.T) {
	th := newThrottler(t, newMemory(t), &throttler.Options{Clock: func() time.Time { return t0 }})
	p := throttler.PerMinute(2).Named("api").DryRun()
	h := newRate(t, th, p, httplimit.KeyByHeader("X-Client"), nil)(etagHandler)
	used := func() int64 {
		d, err := th.Peek(context.Background(), "alice", p)
		require.NoError(t, err)
		return d.Used
	}
	w := serve(h, "If-None-Match", `"x"`)
	assert.Equal(t, int64(0), used(), "a counted call's unit goes back")
	assert.Empty(t, w.Header().Get("X-RateLimit-Remaining"), "the refund's headers are a dry run's too")
	serve(h)
	serve(h)
	w = serve(h, "If-None-Match", `"x"`) // a would-be denial
	assert.Equal(t, http.StatusNotModified, w.Code)
	assert.Equal(t, int64(2), used(), "a would-be denial gave back a unit it never took")
}

func TestRateRefusesABadEnforcer(t *testing.T) {
	th := newThrottler(t, newMemory(t), nil)
	p := throttler.PerMinute(1).Named("api").EnforcedBy((*keySet)(nil))
	_, err := httplimit.Rate(th, p, httplimit.KeyByRemoteIP, nil)
	require.ErrorIs(t, err, throttler.ErrInvalidPolicy)
}

// TestRateCompositeMemberDryRun: a login enforced at 2 a second with a
// new 3-an-hour member in dry run. The dry-run member never refuses and is
// in no header, unless DryRunHeaders lists it; the numbers shown are the
// enforced member's, so Remaining never says 0 to a client that is then
// admitted. A key that enforces the hour is refused by it.
func TestRateCompositeMemberDryRun(t *testing.T) {
	hour := throttler.PerHour(3).Named("login-h").EnforcedBy(&keySet{keys: map[string]bool{"alice": true}})
	login := throttler.All(throttler.PerSecond(2).Named("login-s"), hour)
	for _, opted := range []bool{false, true} {
		now := t0
		th := newThrottler(t, newMemory(t), &throttler.Options{Clock: func() time.Time { return now }})
		h := newRate(t, th, login, httplimit.KeyByHeader("X-Client"),
			&httplimit.Options{DryRunHeaders: opted, IETFHeaders: true})(etagHandler)
		listed := `"login-s";q=2;w=1`
		if opted {
			listed += `, "login-h";q=3;w=3600`
		}
		for i, want := range []string{"1", "0", "1", "0", "1", "0"} {
			now = t0.Add(time.Duration(i/2) * time.Second)
			w := serve(h, "X-Client", "bob")
			require.Equal(t, http.StatusOK, w.Code, "bob, call %d (the hour would deny from call 3)", i)
			assert.Equal(t, want, w.Header().Get("X-RateLimit-Remaining"), "bob, call %d", i)
			assert.Equal(t, "login-s", w.Header().Get("X-RateLimit-Resource"), "bob, call %d", i)
			assert.Equal(t, listed, w.Header().Get("RateLimit-Policy"), "bob, call %d", i)
		}
		for i, code := range []int{200, 200, 200, 429} {
			now = t0.Add(time.Duration(i/2) * time.Second)
			w := serve(h, "X-Client", "alice")
			require.Equal(t, code, w.Code, "alice, call %d", i)
			assert.Equal(t, `"login-s";q=2;w=1, "login-h";q=3;w=3600`, w.Header().Get("RateLimit-Policy"))
			if code == 429 {
				assert.Equal(t, "login-h", w.Header().Get("X-RateLimit-Resource"), "the hour refuses alice")
			}
		}
	}
}

// TestRateCompositeEveryMemberEnforcedBy: both members have their own
// Enforcer; for alice the minute is enforced and the hour in dry run. When
// the hour would deny, alice still gets the minute's headers: a member
// enforced for her makes the composite's headers hers.
func TestRateCompositeEveryMemberEnforcedBy(t *testing.T) {
	minute := throttler.PerMinute(5).Named("m").EnforcedBy(&keySet{keys: map[string]bool{"alice": true}})
	hour := throttler.PerHour(1).Named("h").EnforcedBy(&keySet{keys: map[string]bool{}})
	th := newThrottler(t, newMemory(t), &throttler.Options{Clock: func() time.Time { return t0 }})
	h := newRate(t, th, throttler.All(minute, hour), httplimit.KeyByHeader("X-Client"),
		&httplimit.Options{IETFHeaders: true})(etagHandler)
	for i, remaining := range []string{"4", "3"} {
		w := serve(h, "X-Client", "alice")
		require.Equal(t, http.StatusOK, w.Code, "call %d", i)
		assert.Equal(t, "m", w.Header().Get("X-RateLimit-Resource"), "call %d", i)
		assert.Equal(t, remaining, w.Header().Get("X-RateLimit-Remaining"), "call %d (the second: the hour would deny)", i)
		assert.Equal(t, `"m";q=5;w=60`, w.Header().Get("RateLimit-Policy"), "call %d", i)
	}
}
