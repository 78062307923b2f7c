package throttler_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/throttler"
)

// fakeLeases holds leases by the lease contract, to the millisecond, and
// fails, hangs or names its stores as a test says. Its rate operations
// answer from acceptAll: these tests are about leases.
type fakeLeases struct {
	acceptAll

	mu sync.Mutex
	// held maps key and policy identity → lease → expiry (Unix ms).
	held     map[string]map[throttler.LeaseID]int64
	err      error
	hang     bool // wait for the call's context to end, like a paused server
	acquires int
	releases int
	ids      []throttler.LeaseID // every lease ID seen, in order
}

func newFakeLeases() *fakeLeases {
	return &fakeLeases{held: map[string]map[throttler.LeaseID]int64{}}
}

// identity is the storage identity of a concurrency limit: the Name of a
// named policy, the definition of an unnamed one.
func identity(key string, p throttler.ConcurrencyPolicy) string {
	if p.Name != "" {
		return key + "\x00" + p.Name
	}
	return key + "\x00 " + p.String()
}

func (f *fakeLeases) enter(ctx context.Context, op *int, id throttler.LeaseID) error {
	f.mu.Lock()
	*op++
	f.ids = append(f.ids, id)
	err, hang := f.err, f.hang
	f.mu.Unlock()
	if ctx.Err() != nil { // as a network client fails a call whose context ended
		return ctx.Err()
	}
	if hang {
		<-ctx.Done()
		return ctx.Err()
	}
	return err
}

// state drops the expired leases of k and returns the decision fields.
func (f *fakeLeases) state(k string, p throttler.ConcurrencyPolicy, nowMS int64) (map[throttler.LeaseID]int64, throttler.Decision) {
	m := f.held[k]
	if m == nil {
		m = map[throttler.LeaseID]int64{}
		f.held[k] = m
	}
	for id, exp := range m {
		if exp <= nowMS {
			delete(m, id)
		}
	}
	return m, throttler.Decision{Limit: p.Limit}
}

func decisionOf(m map[throttler.LeaseID]int64, p throttler.ConcurrencyPolicy, nowMS int64) throttler.Decision {
	used := int64(len(m))
	reset := nowMS + p.TTL.Milliseconds()
	for _, exp := range m {
		reset = min(reset, exp)
	}
	return throttler.Decision{Limit: p.Limit, Used: used, Remaining: max(p.Limit-used, 0), ResetAt: time.UnixMilli(reset).UTC()}
}

func (f *fakeLeases) Acquire(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (throttler.Decision, error) {
	if err := throttler.ValidateLease(key, p, id); err != nil {
		return throttler.Decision{}, err
	}
	if err := f.enter(ctx, &f.acquires, id); err != nil {
		return throttler.Decision{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ms := now.UnixMilli()
	m, _ := f.state(identity(key, p), p, ms)
	_, again := m[id]
	allowed := again || int64(len(m)) < p.Limit
	if allowed {
		m[id] = ms + p.TTL.Milliseconds()
	}
	d := decisionOf(m, p, ms)
	d.Allowed = allowed
	if !allowed {
		d.RetryAfter = d.ResetAt.Sub(time.UnixMilli(ms))
	}
	return d, nil
}

func (f *fakeLeases) Release(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (bool, throttler.Decision, error) {
	if err := throttler.ValidateLease(key, p, id); err != nil {
		return false, throttler.Decision{}, err
	}
	if err := f.enter(ctx, &f.releases, id); err != nil {
		return false, throttler.Decision{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ms := now.UnixMilli()
	m, _ := f.state(identity(key, p), p, ms)
	_, held := m[id]
	delete(m, id)
	d := decisionOf(m, p, ms)
	d.Allowed = d.Used < p.Limit
	if !d.Allowed {
		d.RetryAfter = d.ResetAt.Sub(time.UnixMilli(ms))
	}
	return held, d, nil
}

func (f *fakeLeases) set(err error) { f.mu.Lock(); f.err = err; f.mu.Unlock() }

func (f *fakeLeases) counts() (acquires, releases int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.acquires, f.releases
}

// namedLeases names the store of a lease call by the key's part before ':'
// (Traits.LeaseStore); rename moves every key to another name,
// as a router's rollout moves keys to another backend.
type namedLeases struct {
	*fakeLeases
	rename atomic.Pointer[string]
}

func (n *namedLeases) Traits() throttler.Traits {
	return throttler.Traits{Leases: true, LeaseStore: n.leaseStore}
}

func (n *namedLeases) leaseStore(key string, _ throttler.ConcurrencyPolicy) string {
	if r := n.rename.Load(); r != nil {
		return *r
	}
	return storeOf(key)
}

// wrapperWithoutLeases has the lease methods but says that what it wraps
// holds none (Traits.Leases false), as a router over a backend
// without leases does.
type wrapperWithoutLeases struct{ *fakeLeases }

func (wrapperWithoutLeases) Traits() throttler.Traits { return throttler.Traits{} }

var conc = throttler.ConcurrencyPolicy{Name: "exports", Limit: 2, TTL: time.Minute}

func leaseThrottler(t *testing.T, b throttler.Backend, o *throttler.Options) (*throttler.Throttler, *observations) {
	t.Helper()
	obs := &observations{}
	var opts throttler.Options
	if o != nil {
		opts = *o
	}
	if opts.Clock == nil {
		opts.Clock = func() time.Time { return t0 }
	}
	opts.Observe = obs.add
	return newThrottler(t, b, &opts), obs
}

func TestAcquireAndRelease(t *testing.T) {
	f := newFakeLeases()
	th, obs := leaseThrottler(t, f, nil)
	require.True(t, th.SupportsLeases())
	ctx := context.Background()

	l1, d, err := th.Acquire(ctx, "k", conc)
	require.NoError(t, err)
	assert.Equal(t, throttler.Decision{Allowed: true, Limit: 2, Used: 1, Remaining: 1, ResetAt: t0.Add(time.Minute), At: t0}, d)
	assert.NotZero(t, throttler.LeaseIDOf(l1))
	assert.Equal(t, throttler.Observation{Op: throttler.OpAcquire, Key: "k", Concurrency: conc, Decision: d, Source: throttler.SourcePrimary}, withoutLatency(obs.last()))

	l2, _, err := th.Acquire(ctx, "k", conc)
	require.NoError(t, err)
	assert.NotEqual(t, throttler.LeaseIDOf(l1), throttler.LeaseIDOf(l2))
	l3, d, err := th.Acquire(ctx, "k", conc)
	require.NoError(t, err)
	assert.False(t, d.Allowed, "the limit is 2")
	assert.Equal(t, time.Minute, d.RetryAfter)
	assert.Zero(t, l3, "a denied Acquire holds nothing")

	held, _, err := l1.Release(ctx)
	require.NoError(t, err)
	assert.True(t, held)
	assert.Equal(t, throttler.Observation{Op: throttler.OpRelease, Key: "k", Concurrency: conc,
		Decision: throttler.Decision{Allowed: true, Limit: 2, Used: 1, Remaining: 1, ResetAt: t0.Add(time.Minute), At: t0},
		Source:   throttler.SourcePrimary}, withoutLatency(obs.last()))

	// A second Release of the same value is sent again and changes nothing.
	held, _, err = l1.Release(ctx)
	require.NoError(t, err)
	assert.False(t, held, "released already")
	_, releases := f.counts()
	assert.Equal(t, 2, releases)
	_, d, err = th.Acquire(ctx, "k", conc)
	require.NoError(t, err)
	assert.Equal(t, int64(2), d.Used, "l2 and the new one: the second Release freed nothing more")

	// The zero Lease (a denied Acquire's) calls nothing and observes nothing.
	n := obs.count()
	held, _, err = l3.Release(ctx)
	assert.NoError(t, err)
	assert.False(t, held)
	_, releases = f.counts()
	assert.Equal(t, 2, releases)
	assert.Equal(t, n, obs.count())
}

func TestLeasesOnABackendWithoutThem(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    throttler.Backend
	}{
		{"no lease methods", acceptAll{}},
		{"a wrapper over a backend without leases", wrapperWithoutLeases{newFakeLeases()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Fail open with a fallback that holds leases: neither may
			// answer a configuration error.
			th, obs := leaseThrottler(t, tc.b, &throttler.Options{FailClosed: false, Fallback: newFakeLeases()})
			assert.False(t, th.SupportsLeases())
			l, d, err := th.Acquire(context.Background(), "k", conc)
			assert.ErrorIs(t, err, throttler.ErrLeasesUnsupported)
			assert.True(t, throttler.IsInputError(err))
			assert.Zero(t, l)
			assert.Zero(t, d)
			o := obs.last()
			assert.Equal(t, throttler.SourceNone, o.Source)
			assert.ErrorIs(t, o.Err, throttler.ErrLeasesUnsupported)
		})
	}
}

// A lease operation goes through the failure handling Take gets: the
// fallback if it holds leases, else the failure mode; a lease is released
// to whoever granted it, and one the failure mode granted nowhere.
func TestLeaseFailureHandling(t *testing.T) {
	tests := []struct {
		name     string
		mode     bool
		fallback throttler.Backend // nil: none
		// The Acquire while the primary is down.
		wantAllowed bool
		wantErr     error
		wantSource  throttler.Source
		wantID      bool // the lease is held by a store
	}{
		{"fail open", failOpen, nil, true, nil, throttler.SourceFailureMode, false},
		{"fail closed", failClosed, nil, false, throttler.ErrUnavailable, throttler.SourceFailureMode, false},
		{"a fallback with leases", failClosed, newFakeLeases(), true, nil, throttler.SourceFallback, true},
		{"a fallback without leases, fail open", failOpen, acceptAll{}, true, nil, throttler.SourceFailureMode, false},
		{"a fallback without leases, fail closed", failClosed, acceptAll{}, false, throttler.ErrUnavailable, throttler.SourceFailureMode, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			primary := newFakeLeases()
			primary.set(errDown)
			th, obs := leaseThrottler(t, primary, &throttler.Options{FailClosed: tc.mode, Fallback: tc.fallback})
			ctx := context.Background()
			l, d, err := th.Acquire(ctx, "k", conc)
			if tc.wantErr != nil {
				assert.ErrorIs(t, err, tc.wantErr)
				assert.ErrorIs(t, err, errDown, "the cause is kept")
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.wantAllowed, d.Allowed)
			assert.True(t, d.Degraded)
			assert.Equal(t, conc.Limit, d.Limit)
			assert.Equal(t, tc.wantID, throttler.LeaseIDOf(l) != 0)
			assert.Equal(t, tc.wantAllowed, l != throttler.Lease{}, "a denied Acquire returns the zero Lease")
			o := obs.last()
			assert.Equal(t, tc.wantSource, o.Source)
			assert.ErrorIs(t, o.Err, errDown, "the hook sees the failure even when it is hidden from the caller")
			assert.Equal(t, throttler.OpAcquire, o.Op)
			assert.Equal(t, conc, o.Concurrency)

			// The primary is back: the lease still goes back to whoever
			// granted it, never to the primary.
			primary.set(nil)
			n := obs.count()
			held, _, err := l.Release(ctx)
			require.NoError(t, err)
			assert.Equal(t, tc.wantID, held)
			_, releases := primary.counts()
			assert.Zero(t, releases, "the primary never granted it")
			if !tc.wantAllowed {
				assert.Equal(t, n, obs.count(), "the zero Lease releases nothing")
				return
			}
			o = obs.last()
			assert.Equal(t, throttler.OpRelease, o.Op)
			assert.Equal(t, tc.wantSource, o.Source)
			assert.NoError(t, o.Err)
			assert.True(t, o.Decision.Degraded)
			if fb, ok := tc.fallback.(*fakeLeases); ok {
				_, releases := fb.counts()
				assert.Equal(t, 1, releases)
			}
		})
	}
}

// The primary granted the lease and fails to take it back: the fallback,
// which never held it, is not asked, and the failure mode answers.
func TestReleaseThePrimaryFailsToTakeBack(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mode    bool
		wantErr error
	}{
		{"fail open", failOpen, nil},
		{"fail closed", failClosed, throttler.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			primary, fallback := newFakeLeases(), newFakeLeases()
			th, obs := leaseThrottler(t, primary, &throttler.Options{FailClosed: tc.mode, Fallback: fallback})
			ctx := context.Background()
			l, d, err := th.Acquire(ctx, "k", conc)
			require.NoError(t, err)
			require.True(t, d.Allowed && !d.Degraded)

			primary.set(errDown)
			held, _, err := l.Release(ctx)
			if tc.wantErr != nil {
				assert.ErrorIs(t, err, tc.wantErr)
			} else {
				assert.NoError(t, err)
			}
			assert.False(t, held)
			acquires, releases := fallback.counts()
			assert.Zero(t, acquires+releases, "the fallback never held the lease")
			o := obs.last()
			assert.Equal(t, throttler.SourceFailureMode, o.Source)
			assert.ErrorIs(t, o.Err, errDown)
		})
	}
}

// Lease calls have breakers per store, named by LeaseStore; a Release is
// covered by the breaker of the store that granted its lease, whatever the
// backend names for its key by then.
func TestLeaseBreakersPerStore(t *testing.T) {
	clock := &monoClock{}
	nl := &namedLeases{fakeLeases: newFakeLeases()}
	th, obs := leaseThrottler(t, nl, &throttler.Options{BreakerThreshold: 2, BreakerCooldown: time.Second})
	throttler.SetMonotonic(th, clock.Now)
	ctx := context.Background()

	held, _, err := th.Acquire(ctx, "b:1", conc)
	require.NoError(t, err)
	assert.Equal(t, "store b", obs.last().Store)

	nl.set(errDown)
	for range 2 {
		_, d, err := th.Acquire(ctx, "a:1", conc)
		require.NoError(t, err)
		assert.True(t, d.Degraded)
	}
	nl.set(nil)
	acquires, _ := nl.counts()
	_, d, err := th.Acquire(ctx, "a:2", conc)
	require.NoError(t, err)
	assert.True(t, d.Degraded, "store a's breaker is open")
	after, _ := nl.counts()
	assert.Equal(t, acquires, after, "store a was skipped")
	assert.Equal(t, "store a", obs.last().Store)
	assert.ErrorIs(t, obs.last().Err, throttler.ErrUnavailable)

	_, d, err = th.Acquire(ctx, "b:2", conc)
	require.NoError(t, err)
	assert.False(t, d.Degraded, "store b's breaker is closed")

	// Every key now names store a, whose breaker is open; the lease of b
	// still goes to store b, as its breaker allows.
	a := "store a"
	nl.rename.Store(&a)
	ok, _, err := held.Release(ctx)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, "store b", obs.last().Store)
	assert.Equal(t, throttler.SourcePrimary, obs.last().Source)

	clock.Add(time.Second)
	_, d, err = th.Acquire(ctx, "a:3", conc)
	require.NoError(t, err)
	assert.False(t, d.Degraded, "the probe closed store a's breaker")
}

func TestLeaseCallsAreBoundedByTheTimeout(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    func(*fakeLeases) throttler.Backend
	}{
		{"honours its context", func(f *fakeLeases) throttler.Backend { return f }},
		{"ignores its context", func(f *fakeLeases) throttler.Backend { return blindLeases{&deafLeases{f}} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeLeases()
			f.hang = true
			th, obs := leaseThrottler(t, tc.b(f), &throttler.Options{Timeout: 20 * time.Millisecond})
			l, d, err := th.Acquire(context.Background(), "k", conc)
			require.NoError(t, err)
			assert.True(t, d.Allowed && d.Degraded, "a hung store fails open")
			assert.Zero(t, throttler.LeaseIDOf(l))
			assert.ErrorIs(t, obs.last().Err, context.DeadlineExceeded)
		})
	}
}

// deafLeases is a lease backend whose calls ignore their context: each
// waits until its store is unpaused, well past any timeout.
type deafLeases struct{ *fakeLeases }

func (d *deafLeases) Acquire(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (throttler.Decision, error) {
	// Hangs for good: ctx is not passed on.
	return d.fakeLeases.Acquire(context.Background(), key, p, id, now)
}

// blindLeases says that its calls may outlive their context (package
// Traits.IgnoresContext), so the Throttler detaches them.
type blindLeases struct{ *deafLeases }

func (blindLeases) Traits() throttler.Traits {
	return throttler.Traits{IgnoresContext: true, Leases: true}
}

// Bad input is an input error, also while the store is down: validated
// once, by the store, or by the Throttler when the store did not answer;
// never a failure mode.
func TestLeaseBadInput(t *testing.T) {
	tests := []struct {
		name string
		key  string
		p    throttler.ConcurrencyPolicy
		want error
	}{
		{"empty key", "", conc, throttler.ErrInvalidKey},
		{"zero limit", "k", throttler.Concurrent(0, time.Second), throttler.ErrInvalidPolicy},
		{"limit too high", "k", throttler.Concurrent(throttler.MaxConcurrencyLimit+1, time.Second), throttler.ErrInvalidPolicy},
		{"sub-millisecond TTL", "k", throttler.Concurrent(1, 1500*time.Microsecond), throttler.ErrInvalidPolicy},
		{"name with a space", "k", throttler.ConcurrencyPolicy{Name: "a b", Limit: 2, TTL: time.Minute}, throttler.ErrInvalidPolicy},
	}
	for _, tc := range tests {
		for _, down := range []bool{false, true} {
			f := newFakeLeases()
			if down {
				f.set(errDown)
			}
			th, obs := leaseThrottler(t, f, &throttler.Options{FailClosed: false, Fallback: newFakeLeases()})
			l, _, err := th.Acquire(context.Background(), tc.key, tc.p)
			assert.ErrorIs(t, err, tc.want, "%s (down: %v)", tc.name, down)
			assert.Zero(t, l, tc.name)
			assert.Equal(t, throttler.SourceNone, obs.last().Source, tc.name)
		}
	}
}

func TestLeaseCallerCancellationIsNotAnOutage(t *testing.T) {
	f := newFakeLeases()
	f.hang = true
	th, obs := leaseThrottler(t, f, &throttler.Options{FailClosed: false})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l, _, err := th.Acquire(ctx, "k", conc)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Zero(t, l)
	assert.Equal(t, throttler.SourceNone, obs.last().Source)
}

// A lease the failure mode granted holds nothing, so its Release calls no
// store (the primary is back by then) and is observed as the failure
// mode's.
func TestReleaseOfAFailureModeLease(t *testing.T) {
	f := newFakeLeases()
	f.set(errDown)
	th, obs := leaseThrottler(t, f, &throttler.Options{FailClosed: false})
	l, _, err := th.Acquire(context.Background(), "k", conc)
	require.NoError(t, err)
	f.set(nil)
	held, _, err := l.Release(context.Background())
	require.NoError(t, err)
	assert.False(t, held)
	_, releases := f.counts()
	assert.Zero(t, releases)
	assert.Equal(t, throttler.Observation{Op: throttler.OpRelease, Key: "k", Concurrency: conc,
		Decision: throttler.Decision{Allowed: true, Limit: conc.Limit, Degraded: true, At: t0},
		Source:   throttler.SourceFailureMode}, withoutLatency(obs.last()))
}

// Never more than Limit leases held at once, whatever the concurrency.
func TestLeasesExactUnderConcurrency(t *testing.T) {
	f := newFakeLeases()
	// A Timeout no scheduling delay reaches: a call that timed out would be
	// answered by the failure mode, which this test is not about (a loaded
	// CI machine under -race took over 100 ms).
	th := newThrottler(t, f, &throttler.Options{Clock: func() time.Time { return t0 }, Timeout: time.Minute, FailClosed: true})
	p := throttler.Concurrent(3, time.Minute)
	var inFlight, most atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				l, d, err := th.Acquire(context.Background(), "k", p)
				if err != nil {
					t.Error(err)
					return
				}
				if !d.Allowed {
					continue
				}
				n := inFlight.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				inFlight.Add(-1)
				if held, _, err := l.Release(context.Background()); err != nil || !held {
					t.Error("release:", held, err)
				}
			}
		}()
	}
	wg.Wait()
	assert.LessOrEqual(t, most.Load(), p.Limit)
	assert.Positive(t, most.Load())
}

func TestErrInvalidLeaseIsAnInputError(t *testing.T) {
	err := throttler.ValidateLease("k", conc, 0)
	assert.ErrorIs(t, err, throttler.ErrInvalidLease)
	assert.True(t, throttler.IsInputError(err))
	assert.False(t, throttler.IsInputError(errors.New("other")))
	assert.True(t, strings.HasPrefix(err.Error(), "throttler: "))
}

func (o *observations) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.all)
}

func withoutLatency(o throttler.Observation) throttler.Observation {
	o.Latency = 0
	return o
}

// A request's context is often cancelled by the time its work ends: the
// Release still reaches the store.
func TestReleaseWithACancelledContext(t *testing.T) {
	f := newFakeLeases()
	th, obs := leaseThrottler(t, f, nil)
	l, _, err := th.Acquire(context.Background(), "k", conc)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	held, _, err := l.Release(ctx)
	require.NoError(t, err)
	assert.True(t, held)
	assert.Equal(t, throttler.SourcePrimary, obs.last().Source)
	_, releases := f.counts()
	assert.Equal(t, 1, releases)
}

// TestReleaseReturnsItsDecision: Lease.Release has LeaseBackend.Release's
// shape, the held flag and the key's state after it, whoever answered.
func TestReleaseReturnsItsDecision(t *testing.T) {
	ctx := context.Background()
	f := newFakeLeases()
	th, obs := leaseThrottler(t, f, nil)
	l, _, err := th.Acquire(ctx, "k", conc)
	require.NoError(t, err)
	held, d, err := l.Release(ctx)
	require.NoError(t, err)
	assert.True(t, held)
	assert.Equal(t, throttler.Decision{Allowed: true, Limit: 2, Remaining: 2, ResetAt: t0.Add(time.Minute), At: t0}, d,
		"no lease held after it")
	assert.Equal(t, obs.last().Decision, d, "the decision it observed")

	// A lease the failure mode granted is released to no store, and its
	// Decision is the failure mode's.
	f.err = errors.New("connection refused")
	l, _, err = th.Acquire(ctx, "k", conc)
	require.NoError(t, err)
	require.Zero(t, throttler.LeaseIDOf(l))
	f.err = nil
	held, d, err = l.Release(ctx)
	require.NoError(t, err)
	assert.False(t, held)
	assert.Equal(t, throttler.Decision{Allowed: true, Limit: 2, Degraded: true, At: t0}, d)
	assert.Equal(t, obs.last().Decision, d)

	// The zero Lease (a denied Acquire's) returns the zero Decision.
	held, d, err = throttler.Lease{}.Release(ctx)
	assert.NoError(t, err)
	assert.False(t, held)
	assert.Zero(t, d)
}

func TestConcurrencyPolicyValidate(t *testing.T) {
	tests := []struct {
		p    throttler.ConcurrencyPolicy
		want error
	}{
		{throttler.Concurrent(1, time.Millisecond), nil},
		{throttler.Concurrent(throttler.MaxConcurrencyLimit, time.Hour), nil},
		{throttler.Concurrent(0, time.Minute), throttler.ErrInvalidPolicy},
		{throttler.Concurrent(throttler.MaxConcurrencyLimit+1, time.Minute), throttler.ErrInvalidPolicy},
		{throttler.Concurrent(1, 0), throttler.ErrInvalidPolicy},
		{throttler.Concurrent(1, 1500*time.Microsecond), throttler.ErrInvalidPolicy},
		{throttler.ConcurrencyPolicy{Name: "has space", Limit: 1, TTL: time.Minute}, throttler.ErrInvalidPolicy},
		// Names of at most 128 bytes, as ConcurrencyPolicy.Name's doc says.
		{throttler.ConcurrencyPolicy{Name: strings.Repeat("n", 128), Limit: 1, TTL: time.Minute}, nil},
		{throttler.ConcurrencyPolicy{Name: strings.Repeat("n", 129), Limit: 1, TTL: time.Minute}, throttler.ErrInvalidPolicy},
	}
	for _, tc := range tests {
		if err := tc.p.Validate(); tc.want == nil {
			assert.NoError(t, err, "%v", tc.p)
		} else {
			assert.ErrorIs(t, err, tc.want, "%v", tc.p)
		}
	}
}
