package throttler_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/sleep"
	"github.com/throttlekit/throttlekit/throttler"
)

// failOpen and failClosed name the values of throttler.Options.FailClosed.
const failOpen, failClosed = false, true

var t0 = time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)

// stubBackend answers every call with err (or delegates to next when err is
// nil) and records what it was given.
type stubBackend struct {
	mu    sync.Mutex
	err   error
	next  throttler.Backend
	calls int
	ctxs  []context.Context
	block bool // wait for ctx to end, like a paused server
}

func (s *stubBackend) do(ctx context.Context, f func() (throttler.Decision, error)) (throttler.Decision, error) {
	s.mu.Lock()
	s.calls++
	s.ctxs = append(s.ctxs, ctx)
	err, block := s.err, s.block
	s.mu.Unlock()
	if block {
		<-ctx.Done()
		return throttler.Decision{}, ctx.Err()
	}
	if err != nil {
		return throttler.Decision{}, err
	}
	return f()
}

func (s *stubBackend) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	return s.do(ctx, func() (throttler.Decision, error) { return s.next.Take(ctx, key, p, cost, now) })
}

func (s *stubBackend) Peek(ctx context.Context, key string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	return s.do(ctx, func() (throttler.Decision, error) { return s.next.Peek(ctx, key, p, now) })
}

func (s *stubBackend) Refund(ctx context.Context, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
	return s.do(ctx, func() (throttler.Decision, error) { return s.next.Refund(ctx, key, p, cost, receipt, now) })
}

func (s *stubBackend) set(err error) { s.mu.Lock(); s.err = err; s.mu.Unlock() }

func (s *stubBackend) count() int { s.mu.Lock(); defer s.mu.Unlock(); return s.calls }

// errDown is a store failure: what a client returns when the server is gone.
var errDown error = &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}

func newMemory(t testing.TB) *memory.Backend {
	t.Helper()
	m, err := memory.New(nil)
	require.NoError(t, err)
	return m
}

func newThrottler(t testing.TB, b throttler.Backend, o *throttler.Options) *throttler.Throttler {
	t.Helper()
	th, err := throttler.New(b, o)
	require.NoError(t, err)
	return th
}

func TestPolicyValidate(t *testing.T) {
	tests := []struct {
		p    throttler.Policy
		want error
	}{
		{throttler.PerSecond(10), nil},
		{throttler.PerMinute(1).Named("api"), nil},
		{throttler.PerHour(5000).Named("core"), nil},
		{throttler.Policy{Name: "x", Limit: 1, Window: time.Millisecond}, nil},
		{throttler.PerSecond(0), throttler.ErrInvalidPolicy},
		{throttler.PerSecond(-1), throttler.ErrInvalidPolicy},
		{throttler.PerSecond(throttler.MaxLimit), nil},
		{throttler.PerSecond(throttler.MaxLimit + 1), throttler.ErrInvalidPolicy},
		{throttler.Policy{Limit: 1}, throttler.ErrInvalidPolicy},
		{throttler.Policy{Limit: 1, Window: -time.Second}, throttler.ErrInvalidPolicy},
		{throttler.Policy{Limit: 1, Window: 1500 * time.Microsecond}, throttler.ErrInvalidPolicy},
		{throttler.PerSecond(1).Named("has space"), throttler.ErrInvalidPolicy},
		{throttler.PerSecond(1).Named("new\nline"), throttler.ErrInvalidPolicy},
		{throttler.PerSecond(1).Named(string(make([]byte, 200))), throttler.ErrInvalidPolicy},
		// Names of at most 128 bytes, as Policy.Name's doc says.
		{throttler.PerSecond(1).Named(strings.Repeat("n", 128)), nil},
		{throttler.PerSecond(1).Named(strings.Repeat("n", 129)), throttler.ErrInvalidPolicy},
		// Algorithms and their bounds.
		{throttler.PerSecond(10).WithAlgorithm(throttler.TokenBucket), nil},
		{throttler.PerSecond(10).WithBurst(50), nil},
		{throttler.PerSecond(10).WithBurst(-1), throttler.ErrInvalidPolicy},
		{throttler.PerSecond(10).WithBurst(throttler.MaxLimit + 1), throttler.ErrInvalidPolicy},
		{throttler.Policy{Limit: 10, Window: time.Second, Burst: 5}, throttler.ErrInvalidPolicy},
		{throttler.PerSecond(10).WithAlgorithm(throttler.SlidingLog).WithBurst(5).WithAlgorithm(throttler.SlidingLog), throttler.ErrInvalidPolicy},
		{throttler.PerSecond(10).WithAlgorithm(throttler.Algorithm(4)), throttler.ErrInvalidPolicy},
		{throttler.PerSecond(throttler.MaxLogLimit).WithAlgorithm(throttler.SlidingLog), nil},
		{throttler.PerSecond(throttler.MaxLogLimit + 1).WithAlgorithm(throttler.SlidingLog), throttler.ErrInvalidPolicy},
		// 2^53 exactly:
		{throttler.Policy{Limit: 1 << 43, Window: 1024 * time.Millisecond, Algorithm: throttler.SlidingWindow}, nil},
		{throttler.Policy{Limit: 1<<43 + 1, Window: 1024 * time.Millisecond, Algorithm: throttler.SlidingWindow}, throttler.ErrInvalidPolicy},
		{throttler.Policy{Limit: 1, Window: 1024 * time.Millisecond, Algorithm: throttler.TokenBucket, Burst: 1 << 43}, nil},
		{throttler.Policy{Limit: 1, Window: 1024 * time.Millisecond, Algorithm: throttler.TokenBucket, Burst: 1<<43 + 1}, throttler.ErrInvalidPolicy},
		// The product overflows 64 bits:
		{throttler.Policy{Limit: throttler.MaxLimit, Window: 1 << 40 * time.Millisecond, Algorithm: throttler.TokenBucket}, throttler.ErrInvalidPolicy},
	}
	for _, tc := range tests {
		err := tc.p.Validate()
		if tc.want == nil {
			assert.NoError(t, err, "%v", tc.p)
		} else {
			assert.ErrorIs(t, err, tc.want, "%v", tc.p)
		}
	}
	assert.Equal(t, "core: 5000 per 1h0m0s", throttler.PerHour(5000).Named("core").String())
	assert.Equal(t, "10 per 1s", throttler.PerSecond(10).String())
	assert.Equal(t, "10 per 1s (token-bucket, burst 20)", throttler.PerSecond(10).WithBurst(20).String())
	assert.Equal(t, "api: 3 per 1m0s (sliding-log)", throttler.PerMinute(3).WithAlgorithm(throttler.SlidingLog).Named("api").String())
	assert.Equal(t, int64(20), throttler.PerSecond(10).WithBurst(20).Capacity())
	assert.Equal(t, int64(10), throttler.PerSecond(10).WithAlgorithm(throttler.TokenBucket).Capacity())
	assert.Equal(t, "Algorithm(9)", throttler.Algorithm(9).String())
}

func TestTakeAboveCapacityIsAnInputError(t *testing.T) {
	for _, p := range []throttler.Policy{
		throttler.PerSecond(5),
		throttler.PerSecond(5).WithBurst(8),
		throttler.PerSecond(5).WithAlgorithm(throttler.SlidingLog),
		throttler.PerSecond(5).WithAlgorithm(throttler.SlidingWindow),
	} {
		assert.NoError(t, throttler.ValidateCall(throttler.OpTake, "k", p, p.Capacity(), time.Time{}), "%v", p)
		assert.ErrorIs(t, throttler.ValidateCall(throttler.OpTake, "k", p, p.Capacity()+1, time.Time{}), throttler.ErrInvalidCost, "%v", p)
		assert.NoError(t, throttler.ValidateCall(throttler.OpRefund, "k", p, throttler.MaxLimit, t0), "%v: a refund clamps", p)
		assert.NoError(t, throttler.ValidateCall(throttler.OpPeek, "k", p, 0, time.Time{}), "%v: a peek has no cost", p)
	}
}

func TestAllowUsesTheClock(t *testing.T) {
	clock := sleep.NewFake(t0)
	th := newThrottler(t, newMemory(t), &throttler.Options{Clock: clock.Now})
	p := throttler.PerMinute(2).Named("api")
	ctx := context.Background()
	steps := []struct {
		advance time.Duration
		allowed bool
		used    int64
	}{
		{0, true, 1}, {10 * time.Second, true, 2}, {10 * time.Second, false, 2},
		{40 * time.Second, true, 1}, // the window opened at t0 ended at t0+1m
	}
	for i, s := range steps {
		clock.Add(s.advance)
		d, err := th.Allow(ctx, "client", p)
		require.NoError(t, err)
		assert.Equal(t, s.allowed, d.Allowed, "step %d", i)
		assert.Equal(t, s.used, d.Used, "step %d", i)
		assert.False(t, d.Degraded)
	}
}

// Bad input is the caller's error whatever state the primary is in: never
// an outage, so never answered by the fallback or by failing open.
func TestBadInputIsAnInputErrorNeverAnOutage(t *testing.T) {
	p := throttler.PerMinute(10)
	calls := []struct {
		name string
		call func(*throttler.Throttler) (throttler.Decision, error)
		want error
	}{
		{"empty key", func(th *throttler.Throttler) (throttler.Decision, error) {
			return th.Allow(context.Background(), "", p)
		}, throttler.ErrInvalidKey},
		{"key too long", func(th *throttler.Throttler) (throttler.Decision, error) {
			return th.Allow(context.Background(), strings.Repeat("k", throttler.MaxKeyLen+1), p)
		}, throttler.ErrInvalidKey},
		{"cost 0", func(th *throttler.Throttler) (throttler.Decision, error) {
			return th.AllowN(context.Background(), "k", p, 0)
		}, throttler.ErrInvalidCost},
		{"cost above the limit", func(th *throttler.Throttler) (throttler.Decision, error) {
			return th.AllowN(context.Background(), "k", p, 11)
		}, throttler.ErrInvalidCost},
		{"negative refund", func(th *throttler.Throttler) (throttler.Decision, error) {
			return th.Refund(context.Background(), "k", p, -2, throttler.Decision{Allowed: true, ResetAt: time.Now().Add(time.Hour)})
		}, throttler.ErrInvalidCost},
		{"zero policy", func(th *throttler.Throttler) (throttler.Decision, error) {
			return th.Peek(context.Background(), "k", throttler.Policy{})
		}, throttler.ErrInvalidPolicy},
	}
	primaries := []struct {
		name        string
		err         error // the primary's failure; nil: up
		breakerOpen bool
	}{
		{"primary up", nil, false},
		{"primary down", errDown, false},
		{"breaker open", errDown, true},
	}
	for _, pr := range primaries {
		for _, mode := range []bool{failOpen, failClosed} {
			for _, c := range calls {
				t.Run(fmt.Sprintf("%s/failclosed=%v/%s", pr.name, mode, c.name), func(t *testing.T) {
					primary := &stubBackend{next: newMemory(t)}
					fallback := &stubBackend{next: newMemory(t)}
					var seen []throttler.Observation
					th := newThrottler(t, primary, &throttler.Options{Clock: func() time.Time { return t0 }, FailClosed: mode, Fallback: fallback, BreakerThreshold: 1,
						Observe: func(o throttler.Observation) { seen = append(seen, o) }})
					if pr.breakerOpen {
						primary.set(errDown)
						_, err := th.Allow(context.Background(), "other", p) // opens the breaker
						require.NoError(t, err)
						seen = nil
					}
					primary.set(pr.err)
					before := fallback.count()

					d, err := c.call(th)
					assert.ErrorIs(t, err, c.want)
					assert.False(t, d.Allowed, "never failed open")
					assert.False(t, d.Degraded)
					assert.NotErrorIs(t, err, throttler.ErrUnavailable)
					assert.Equal(t, before, fallback.count(), "the fallback never sees bad input")
					require.Len(t, seen, 1)
					assert.Equal(t, throttler.SourceNone, seen[0].Source)
					assert.True(t, throttler.IsInputError(seen[0].Err), "%v", seen[0].Err)
				})
			}
		}
	}
}

// Validation runs once per call, in the leaf backend: the Throttler does not
// validate in front of a primary that answers (here one that accepts
// anything), only when the primary fails.
func TestThrottlerValidatesOnlyWhenThePrimaryFails(t *testing.T) {
	lenient := &stubBackend{next: acceptAll{}}
	th := newThrottler(t, lenient, nil)
	d, err := th.Allow(context.Background(), "", throttler.Policy{})
	require.NoError(t, err, "the primary answered: its word is final")
	assert.True(t, d.Allowed)
	assert.Equal(t, 1, lenient.count())

	lenient.set(errDown)
	_, err = th.Allow(context.Background(), "", throttler.Policy{})
	assert.ErrorIs(t, err, throttler.ErrInvalidKey, "the primary failed: the Throttler checks before failing open")
}

// acceptAll allows everything, checking nothing.
type acceptAll struct{}

func (acceptAll) Take(context.Context, string, throttler.Policy, int64, time.Time) (throttler.Decision, error) {
	return throttler.Decision{Allowed: true}, nil
}

func (acceptAll) Peek(context.Context, string, throttler.Policy, time.Time) (throttler.Decision, error) {
	return throttler.Decision{Allowed: true}, nil
}

func (acceptAll) Refund(context.Context, string, throttler.Policy, int64, time.Time, time.Time) (throttler.Decision, error) {
	return throttler.Decision{Allowed: true}, nil
}

func TestFailureModes(t *testing.T) {
	p := throttler.PerMinute(10).Named("api")
	tests := []struct {
		name        string
		mode        bool
		fallback    bool
		wantAllowed bool
		wantErr     error
		wantSource  throttler.Source
		wantKnown   bool
	}{
		{"fail open", failOpen, false, true, nil, throttler.SourceFailureMode, false},
		{"fail closed", failClosed, false, false, throttler.ErrUnavailable, throttler.SourceFailureMode, false},
		{"fallback", failClosed, true, true, nil, throttler.SourceFallback, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stub := &stubBackend{err: errDown}
			var obs throttler.Observation
			o := &throttler.Options{Clock: func() time.Time { return t0 }, FailClosed: tc.mode, Observe: func(x throttler.Observation) { obs = x }}
			if tc.fallback {
				o.Fallback = newMemory(t)
			}
			d, err := newThrottler(t, stub, o).Allow(context.Background(), "k", p)
			if tc.wantErr != nil {
				assert.ErrorIs(t, err, tc.wantErr)
				assert.ErrorIs(t, err, errDown, "the cause is kept")
			} else {
				assert.NoError(t, err)
			}
			assert.Equal(t, tc.wantAllowed, d.Allowed)
			assert.True(t, d.Degraded)
			assert.Equal(t, tc.wantKnown, !d.ResetAt.IsZero())
			assert.Equal(t, p.Limit, d.Limit)
			assert.Equal(t, tc.wantSource, obs.Source)
			assert.ErrorIs(t, obs.Err, errDown, "the hook sees the failure even when it is hidden from the caller")
		})
	}
}

// TestDegradedDecisionsReportTheHealthyLimit: whoever answers (the store,
// the fallback or the failure mode), a Decision's Limit is the one the
// algorithm reports, a token bucket's capacity included, so that
// X-RateLimit-Limit holds still through an outage.
func TestDegradedDecisionsReportTheHealthyLimit(t *testing.T) {
	for _, p := range []throttler.Policy{
		throttler.PerMinute(10),
		throttler.PerSecond(10).WithAlgorithm(throttler.TokenBucket),
		throttler.PerSecond(10).WithBurst(25),
		throttler.PerSecond(10).WithBurst(4),
		throttler.PerMinute(10).WithAlgorithm(throttler.SlidingLog),
		throttler.PerMinute(10).WithAlgorithm(throttler.SlidingWindow),
	} {
		clock := func() time.Time { return t0 }
		healthy, err := newThrottler(t, newMemory(t), &throttler.Options{Clock: clock}).Allow(context.Background(), "k", p)
		require.NoError(t, err)
		require.False(t, healthy.Degraded)
		for _, o := range []*throttler.Options{
			{Clock: clock, FailClosed: false},
			{Clock: clock, FailClosed: true},
			{Clock: clock, Fallback: newMemory(t)},
		} {
			d, _ := newThrottler(t, &stubBackend{err: errDown}, o).Allow(context.Background(), "k", p)
			assert.True(t, d.Degraded)
			assert.Equal(t, healthy.Limit, d.Limit, "%v, fail closed %v, fallback %v", p, o.FailClosed, o.Fallback != nil)
		}
	}
}

func TestTimeoutBoundsEveryCall(t *testing.T) {
	stub := &stubBackend{block: true}
	th := newThrottler(t, stub, &throttler.Options{Timeout: 20 * time.Millisecond})
	d, err := th.Allow(context.Background(), "k", throttler.PerSecond(1))
	require.NoError(t, err)
	assert.True(t, d.Allowed && d.Degraded, "a hung backend fails open")
	require.Len(t, stub.ctxs, 1)
	deadline, ok := stub.ctxs[0].Deadline()
	require.True(t, ok, "the backend's context carries the timeout")
	assert.WithinDuration(t, time.Now(), deadline, time.Second)
}

func TestCallerCancellationIsNotAnOutage(t *testing.T) {
	stub := &stubBackend{block: true}
	th := newThrottler(t, stub, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := th.Allow(ctx, "k", throttler.PerSecond(1))
	assert.ErrorIs(t, err, context.Canceled)
}

// After BreakerThreshold store failures the primary is skipped for
// BreakerCooldown (on the monotonic clock), then tried again. Each call is
// of another key: a key the fallback answered stays with it for its window
// (TestFallbackStint).
func TestBreaker(t *testing.T) {
	clock := &monoClock{}
	primary := &stubBackend{err: errDown, next: newMemory(t)}
	fallback := newMemory(t)
	th := newThrottler(t, primary, &throttler.Options{Clock: func() time.Time { return t0 }, Fallback: fallback, BreakerThreshold: 3, BreakerCooldown: 2 * time.Second})
	throttler.SetMonotonic(th, clock.Now)
	p := throttler.PerMinute(100)
	ctx := context.Background()
	key := 0
	allow := func() (throttler.Decision, error) {
		key++
		return th.Allow(ctx, fmt.Sprint("k", key), p)
	}
	for i := 0; i < 10; i++ {
		d, err := allow()
		require.NoError(t, err)
		require.True(t, d.Degraded)
		require.Equal(t, int64(1), d.Used, "the fallback keeps limiting")
	}
	assert.Equal(t, 3, primary.count(), "the primary is skipped once the breaker opens")

	primary.set(nil)
	clock.Add(time.Second)
	_, _ = allow()
	assert.Equal(t, 3, primary.count(), "still cooling down")

	clock.Add(time.Second)
	d, err := allow()
	require.NoError(t, err)
	assert.False(t, d.Degraded, "the recovered primary answers again")
	assert.Equal(t, 4, primary.count())

	// One failure after recovery does not reopen it: the count restarted.
	primary.set(errDown)
	_, _ = allow()
	primary.set(nil)
	d, _ = allow()
	assert.False(t, d.Degraded)
}

func TestBackendInputErrorIsReturned(t *testing.T) {
	stub := &stubBackend{err: throttler.ErrInvalidKey}
	th := newThrottler(t, stub, &throttler.Options{Fallback: newMemory(t)})
	_, err := th.Allow(context.Background(), "k", throttler.PerSecond(1))
	assert.ErrorIs(t, err, throttler.ErrInvalidKey, "a key the store cannot hold is the caller's problem, not an outage")
}

// deafBackend ignores its context, like gomemcache: it answers only when
// released.
type deafBackend struct {
	stubBackend
	release chan struct{}
}

func (d *deafBackend) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	<-d.release
	return throttler.Decision{}, errDown
}

func TestDetachBoundsABackendThatIgnoresItsContext(t *testing.T) {
	deaf := &deafBackend{release: make(chan struct{})}
	defer close(deaf.release)
	var obs []throttler.Observation
	th := newThrottler(t, deaf, &throttler.Options{Timeout: 10 * time.Millisecond, Detach: true, MaxDetached: 2, Fallback: newMemory(t),
		Observe: func(o throttler.Observation) { obs = append(obs, o) }})
	p := throttler.PerMinute(10)
	for i := 0; i < 3; i++ {
		// Returns although the backend has not answered: the release comes
		// only when the test ends. A key per call: the fallback keeps a key
		// it answered for its window, without calling the primary.
		d, err := th.Allow(context.Background(), fmt.Sprint("k", i), p)
		require.NoError(t, err)
		assert.True(t, d.Degraded)
		assert.Equal(t, int64(1), d.Used, "the fallback counts")
	}
	require.Len(t, obs, 3)
	assert.ErrorIs(t, obs[0].Err, context.DeadlineExceeded)
	assert.ErrorIs(t, obs[2].Err, throttler.ErrUnavailable, "a third call finds MaxDetached calls still running")
}

// blindBackend is a deafBackend that says so (Traits.IgnoresContext),
// as the Memcached backend and the Redis backend over an
// AutoPipeliner do.
type blindBackend struct{ deafBackend }

func (*blindBackend) Traits() throttler.Traits { return throttler.Traits{IgnoresContext: true} }

// A backend that says it ignores its context is detached without
// Options.Detach: the Throttler's Timeout bounds its calls all the same.
func TestDetachIsAutomaticForABackendThatSaysItIgnoresItsContext(t *testing.T) {
	blind := &blindBackend{deafBackend{release: make(chan struct{})}}
	defer close(blind.release)
	th := newThrottler(t, blind, &throttler.Options{Timeout: 10 * time.Millisecond, Fallback: newMemory(t)})
	d, err := th.Allow(context.Background(), "k", throttler.PerMinute(10))
	require.NoError(t, err, "returns although the backend has not answered: the release comes only when the test ends")
	assert.True(t, d.Degraded)
	assert.Equal(t, int64(1), d.Used, "the fallback counts")
}

func TestDetachReturnsTheBackendsAnswer(t *testing.T) {
	th := newThrottler(t, newMemory(t), &throttler.Options{Detach: true, Clock: func() time.Time { return t0 }})
	for i := int64(1); i <= 3; i++ {
		d, err := th.AllowN(context.Background(), "k", throttler.PerMinute(2), 1)
		require.NoError(t, err)
		assert.Equal(t, i <= 2, d.Allowed)
		assert.False(t, d.Degraded)
	}
}

// localStub says its calls never block, so it gets the caller's context as is.
type localStub struct{ stubBackend }

func (*localStub) Traits() throttler.Traits { return throttler.Traits{InProcess: true} }

func TestInProcessBackendsGetNoTimeoutContext(t *testing.T) {
	local := &localStub{stubBackend{next: newMemory(t)}}
	_, err := newThrottler(t, local, nil).Allow(context.Background(), "k", throttler.PerSecond(1))
	require.NoError(t, err)
	_, hasDeadline := local.ctxs[0].Deadline()
	assert.False(t, hasDeadline, "an in-process call needs no timer")

	remote := &stubBackend{next: newMemory(t)}
	_, err = newThrottler(t, remote, nil).Allow(context.Background(), "k", throttler.PerSecond(1))
	require.NoError(t, err)
	_, hasDeadline = remote.ctxs[0].Deadline()
	assert.True(t, hasDeadline)
}

func TestSourceString(t *testing.T) {
	assert.Equal(t, "fallback", throttler.SourceFallback.String())
	assert.Equal(t, "Source(9)", throttler.Source(9).String(), "out of range prints, never panics")
}

func TestNewRejects(t *testing.T) {
	var nilMemory *memory.Backend
	mem := newMemory(t)
	tests := []struct {
		name string
		b    throttler.Backend
		o    *throttler.Options
		want string
	}{
		{"nil backend", nil, nil, "throttler: New needs a backend, got nil"},
		{"typed-nil backend", nilMemory, nil, "throttler: New needs a backend, got a nil *memory.Backend"},
		{"negative Timeout", mem, &throttler.Options{Timeout: -time.Millisecond}, "throttler: Options.Timeout must be >= 0, got -1ms"},
		{"Timeout in the wrong unit", mem, &throttler.Options{Timeout: 100}, "throttler: Options.Timeout must be 0 (the default, 100ms) or at least 1ms, got 100ns: every call would time out and fail open (a duration counts nanoseconds)"},
		{"Timeout just under 1ms", mem, &throttler.Options{Timeout: time.Millisecond - 1}, "throttler: Options.Timeout must be 0 (the default, 100ms) or at least 1ms, got 999.999µs: every call would time out and fail open (a duration counts nanoseconds)"},
		{"negative BreakerThreshold", mem, &throttler.Options{BreakerThreshold: -1}, "throttler: Options.BreakerThreshold must be >= 0, got -1"},
		{"negative BreakerCooldown", mem, &throttler.Options{BreakerCooldown: -time.Second}, "throttler: Options.BreakerCooldown must be >= 0, got -1s"},
		{"negative MaxDetached", mem, &throttler.Options{MaxDetached: -1}, "throttler: Options.MaxDetached must be >= 0, got -1"},
		{"typed-nil Fallback", mem, &throttler.Options{Fallback: nilMemory}, "throttler: Options.Fallback is a nil *memory.Backend"},
	}
	for _, tc := range tests {
		th, err := throttler.New(tc.b, tc.o)
		assert.EqualError(t, err, tc.want, tc.name)
		assert.Nil(t, th, tc.name)
	}

	// Zero means default; nothing else is needed.
	for _, o := range []*throttler.Options{nil, {}, {FailClosed: true, Fallback: mem}, {Timeout: time.Millisecond}} {
		_, err := throttler.New(mem, o)
		assert.NoError(t, err)
	}
}

// A backend built wrong (redis.New(nil, nil)) fails every call, which a
// Throttler would read as an outage and answer by failing open: every call
// allowed, no error anywhere. The mistake stops construction instead, and a
// Throttler that was never built answers errors, never allows.
func TestMisconfiguredBackendIsAnErrorAtConstructionNeverAFailOpen(t *testing.T) {
	var nilMemory *memory.Backend
	badMemory, memErr := memory.New(&memory.Options{Shards: -1})
	require.EqualError(t, memErr, "memory: Options.Shards must be between 0 (default) and 65536, got -1")

	builds := []struct {
		name string
		b    throttler.Backend
		o    *throttler.Options
	}{
		{"nil", nil, nil},
		{"typed nil", nilMemory, nil},
		{"memory.New's error ignored", badMemory, nil},
		{"typed-nil fallback", newMemory(t), &throttler.Options{Fallback: nilMemory}},
	}
	p := throttler.PerMinute(1)
	for _, tc := range builds {
		th, err := throttler.New(tc.b, tc.o)
		require.Error(t, err, tc.name)
		allowed := 0
		for range 10 {
			d, err := th.Allow(context.Background(), "k", p)
			assert.Error(t, err, "%s: a Throttler New refused answers errors", tc.name)
			if d.Allowed {
				allowed++
			}
		}
		assert.Zero(t, allowed, tc.name)
	}
}

func TestZeroThrottlerErrsNeverPanics(t *testing.T) {
	for _, th := range []*throttler.Throttler{nil, {}} {
		for _, call := range []func() (throttler.Decision, error){
			func() (throttler.Decision, error) { return th.Allow(context.Background(), "k", throttler.PerSecond(1)) },
			func() (throttler.Decision, error) {
				return th.AllowN(context.Background(), "k", throttler.PerSecond(1), 1)
			},
			func() (throttler.Decision, error) { return th.Peek(context.Background(), "k", throttler.PerSecond(1)) },
			func() (throttler.Decision, error) {
				return th.Refund(context.Background(), "k", throttler.PerSecond(1), 1, throttler.Decision{})
			},
		} {
			d, err := call()
			assert.EqualError(t, err, "throttler: Throttler has no backend; build one with New")
			assert.False(t, d.Allowed)
		}
	}
}

// Two unnamed policies on one key never share a window: sharing one, PerHour(3)
// admitted 120 in 2 hours next to PerMinute(2).
func TestUnnamedPoliciesOnOneKeyStayApart(t *testing.T) {
	clock := sleep.NewFake(t0)
	th := newThrottler(t, newMemory(t), &throttler.Options{Clock: clock.Now})
	hourly, perMinute := throttler.PerHour(3), throttler.PerMinute(2)
	ctx := context.Background()
	admitted := map[throttler.Policy]int{}
	for range 120 { // two hours, one step a minute
		for _, p := range []throttler.Policy{perMinute, hourly, perMinute, hourly} {
			d, err := th.Allow(ctx, "alice", p)
			require.NoError(t, err)
			if d.Allowed {
				admitted[p]++
			}
		}
		clock.Add(time.Minute)
	}
	assert.Equal(t, 6, admitted[hourly], "3 an hour")
	assert.Equal(t, 240, admitted[perMinute], "2 a minute")

	// Named policies share their Name's window, whatever their Limit: a
	// live policy's Limit can change without a fresh window.
	core := throttler.PerHour(3).Named("core")
	_, err := th.AllowN(ctx, "bob", core, 3)
	require.NoError(t, err)
	d, err := th.Peek(ctx, "bob", throttler.PerHour(5).Named("core"))
	require.NoError(t, err)
	assert.Equal(t, int64(3), d.Used)
}

// Every error says "throttler:" once, however many layers it crossed.
func TestErrorsHaveOnePrefix(t *testing.T) {
	var errs []error
	_, err := throttler.New(nil, nil)
	errs = append(errs, err)
	_, err = newThrottler(t, newMemory(t), nil).Allow(context.Background(), "", throttler.PerSecond(1))
	errs = append(errs, err)

	// Fail closed, with a detached call that times out and a fallback that
	// fails too.
	deaf := &deafBackend{release: make(chan struct{})}
	defer close(deaf.release)
	th := newThrottler(t, deaf, &throttler.Options{Timeout: time.Millisecond, Detach: true, FailClosed: true, Fallback: &stubBackend{err: errDown}})
	_, err = th.Allow(context.Background(), "k", throttler.PerSecond(1))
	require.ErrorIs(t, err, throttler.ErrUnavailable)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	errs = append(errs, err)

	require.Len(t, errs, 3)
	for _, err := range errs {
		require.Error(t, err)
		assert.Equal(t, 1, strings.Count(err.Error(), "throttler:"), "%q", err)
	}
}
