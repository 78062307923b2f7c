package throttler_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

var t0 = time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)

// fakeClock is moved by tests; nothing sleeps.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

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

func (s *stubBackend) Refund(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	return s.do(ctx, func() (throttler.Decision, error) { return s.next.Refund(ctx, key, p, cost, now) })
}

func (s *stubBackend) set(err error) { s.mu.Lock(); s.err = err; s.mu.Unlock() }

func (s *stubBackend) count() int { s.mu.Lock(); defer s.mu.Unlock(); return s.calls }

var errDown = errors.New("connection refused")

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
}

func TestAllowUsesTheClock(t *testing.T) {
	clock := &fakeClock{now: t0}
	th := throttler.New(memory.New(nil), &throttler.Options{Clock: clock.Now})
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

func TestBadInputNeverReachesTheBackend(t *testing.T) {
	stub := &stubBackend{next: memory.New(nil)}
	var seen []throttler.Observation
	th := throttler.New(stub, &throttler.Options{Observe: func(o throttler.Observation) { seen = append(seen, o) }})
	ctx := context.Background()
	_, err := th.Allow(ctx, "", throttler.PerSecond(1))
	assert.ErrorIs(t, err, throttler.ErrInvalidKey)
	_, err = th.AllowN(ctx, "k", throttler.PerSecond(1), 0)
	assert.ErrorIs(t, err, throttler.ErrInvalidCost)
	_, err = th.Refund(ctx, "k", throttler.PerSecond(1), -2)
	assert.ErrorIs(t, err, throttler.ErrInvalidCost)
	_, err = th.Peek(ctx, "k", throttler.PerSecond(0))
	assert.ErrorIs(t, err, throttler.ErrInvalidPolicy)
	assert.Zero(t, stub.count())
	require.Len(t, seen, 4)
	for _, o := range seen {
		assert.Equal(t, throttler.SourceNone, o.Source)
		assert.True(t, throttler.IsInputError(o.Err), "%v", o.Err)
	}
}

func TestFailureModes(t *testing.T) {
	p := throttler.PerMinute(10).Named("api")
	tests := []struct {
		name        string
		mode        throttler.FailureMode
		fallback    bool
		wantAllowed bool
		wantErr     error
		wantSource  throttler.Source
		wantKnown   bool
	}{
		{"fail open", throttler.FailOpen, false, true, nil, throttler.SourceFailureMode, false},
		{"fail closed", throttler.FailClosed, false, false, throttler.ErrUnavailable, throttler.SourceFailureMode, false},
		{"fallback", throttler.FailClosed, true, true, nil, throttler.SourceFallback, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stub := &stubBackend{err: errDown}
			var obs throttler.Observation
			o := &throttler.Options{Clock: func() time.Time { return t0 }, FailureMode: tc.mode, Observe: func(x throttler.Observation) { obs = x }}
			if tc.fallback {
				o.Fallback = memory.New(nil)
			}
			d, err := throttler.New(stub, o).Allow(context.Background(), "k", p)
			if tc.wantErr != nil {
				assert.ErrorIs(t, err, tc.wantErr)
				assert.ErrorIs(t, err, errDown, "the cause is kept")
			} else {
				assert.NoError(t, err)
			}
			assert.Equal(t, tc.wantAllowed, d.Allowed)
			assert.True(t, d.Degraded)
			assert.Equal(t, tc.wantKnown, d.Known())
			assert.Equal(t, p.Limit, d.Limit)
			assert.Equal(t, tc.wantSource, obs.Source)
			assert.ErrorIs(t, obs.Err, errDown, "the hook sees the failure even when it is hidden from the caller")
		})
	}
}

func TestTimeoutBoundsEveryCall(t *testing.T) {
	stub := &stubBackend{block: true}
	th := throttler.New(stub, &throttler.Options{Timeout: 20 * time.Millisecond})
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
	th := throttler.New(stub, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := th.Allow(ctx, "k", throttler.PerSecond(1))
	assert.ErrorIs(t, err, context.Canceled)
}

// After BreakerThreshold failures the primary is skipped for
// BreakerCooldown (on the Throttler's clock), then tried again.
func TestBreaker(t *testing.T) {
	clock := &fakeClock{now: t0}
	primary := &stubBackend{err: errDown, next: memory.New(nil)}
	fallback := memory.New(nil)
	th := throttler.New(primary, &throttler.Options{Clock: clock.Now, Fallback: fallback, BreakerThreshold: 3, BreakerCooldown: 2 * time.Second})
	p := throttler.PerMinute(100)
	ctx := context.Background()
	for i := 0; i < 10; i++ {
		d, err := th.Allow(ctx, "k", p)
		require.NoError(t, err)
		require.True(t, d.Degraded)
		require.Equal(t, int64(i+1), d.Used, "the fallback keeps limiting")
	}
	assert.Equal(t, 3, primary.count(), "the primary is skipped once the breaker opens")

	primary.set(nil)
	clock.Add(time.Second)
	_, _ = th.Allow(ctx, "k", p)
	assert.Equal(t, 3, primary.count(), "still cooling down")

	clock.Add(time.Second)
	d, err := th.Allow(ctx, "k", p)
	require.NoError(t, err)
	assert.False(t, d.Degraded, "the recovered primary answers again")
	assert.Equal(t, 4, primary.count())

	// One failure after recovery does not reopen it: the count restarted.
	primary.set(errDown)
	_, _ = th.Allow(ctx, "k", p)
	primary.set(nil)
	d, _ = th.Allow(ctx, "k", p)
	assert.False(t, d.Degraded)
}

func TestBackendInputErrorIsReturned(t *testing.T) {
	stub := &stubBackend{err: throttler.ErrInvalidKey}
	th := throttler.New(stub, &throttler.Options{Fallback: memory.New(nil)})
	_, err := th.Allow(context.Background(), "k", throttler.PerSecond(1))
	assert.ErrorIs(t, err, throttler.ErrInvalidKey, "a key the store cannot hold is the caller's problem, not an outage")
}

func TestWindowState(t *testing.T) {
	p := throttler.Policy{Limit: 10, Window: time.Minute}
	tests := []struct {
		name    string
		used    int64
		resetAt time.Time
		allowed bool
		want    throttler.Decision
	}{
		{"open", 4, t0.Add(30 * time.Second), true, throttler.Decision{Allowed: true, Limit: 10, Used: 4, Remaining: 6, ResetAt: t0.Add(30 * time.Second)}},
		{"denied", 10, t0.Add(30 * time.Second), false, throttler.Decision{Limit: 10, Used: 10, Remaining: 0, ResetAt: t0.Add(30 * time.Second), RetryAfter: 30 * time.Second}},
		{"over a lowered limit", 12, t0.Add(time.Second), false, throttler.Decision{Limit: 10, Used: 12, Remaining: 0, ResetAt: t0.Add(time.Second), RetryAfter: time.Second}},
		{"absent", 0, time.Time{}, true, throttler.Decision{Allowed: true, Limit: 10, Remaining: 10, ResetAt: t0.Add(time.Minute)}},
		{"ended at now", 7, t0, true, throttler.Decision{Allowed: true, Limit: 10, Remaining: 10, ResetAt: t0.Add(time.Minute)}},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, throttler.WindowState(p, tc.used, tc.resetAt, t0, tc.allowed), tc.name)
	}
	full := throttler.PeekState(p, 10, t0.Add(time.Second), t0)
	assert.False(t, full.Allowed)
	assert.Equal(t, time.Second, full.RetryAfter)
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
	th := throttler.New(deaf, &throttler.Options{Timeout: 10 * time.Millisecond, Detach: true, MaxDetached: 2, Fallback: memory.New(nil),
		Observe: func(o throttler.Observation) { obs = append(obs, o) }})
	p := throttler.PerMinute(10)
	for i := 0; i < 3; i++ {
		// Returns although the backend has not answered: the release comes
		// only when the test ends.
		d, err := th.Allow(context.Background(), "k", p)
		require.NoError(t, err)
		assert.True(t, d.Degraded)
		assert.Equal(t, int64(i+1), d.Used, "the fallback counts")
	}
	require.Len(t, obs, 3)
	assert.ErrorIs(t, obs[0].Err, context.DeadlineExceeded)
	assert.ErrorIs(t, obs[2].Err, throttler.ErrUnavailable, "a third call finds MaxDetached calls still running")
}

func TestDetachReturnsTheBackendsAnswer(t *testing.T) {
	th := throttler.New(memory.New(nil), &throttler.Options{Detach: true, Clock: func() time.Time { return t0 }})
	for i := int64(1); i <= 3; i++ {
		d, err := th.AllowN(context.Background(), "k", throttler.PerMinute(2), 1)
		require.NoError(t, err)
		assert.Equal(t, i <= 2, d.Allowed)
		assert.False(t, d.Degraded)
	}
}

// localStub says its calls never block, so it gets the caller's context as is.
type localStub struct{ stubBackend }

func (*localStub) InProcess() bool { return true }

func TestInProcessBackendsGetNoTimeoutContext(t *testing.T) {
	local := &localStub{stubBackend{next: memory.New(nil)}}
	_, err := throttler.New(local, nil).Allow(context.Background(), "k", throttler.PerSecond(1))
	require.NoError(t, err)
	_, hasDeadline := local.ctxs[0].Deadline()
	assert.False(t, hasDeadline, "an in-process call needs no timer")

	remote := &stubBackend{next: memory.New(nil)}
	_, err = throttler.New(remote, nil).Allow(context.Background(), "k", throttler.PerSecond(1))
	require.NoError(t, err)
	_, hasDeadline = remote.ctxs[0].Deadline()
	assert.True(t, hasDeadline)

	assert.True(t, throttler.IsInProcess(memory.New(nil)))
	assert.False(t, throttler.IsInProcess(remote))
}

func TestSourceString(t *testing.T) {
	assert.Equal(t, "fallback", throttler.SourceFallback.String())
	assert.Equal(t, "Source(9)", throttler.Source(9).String(), "out of range prints, never panics")
}
