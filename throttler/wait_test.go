package throttler_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/internal/sleep"
	"github.com/throttlekit/throttlekit/shadow"
	"github.com/throttlekit/throttlekit/throttler"
)

// waitT0 is far from today, so that a context deadline set on the fake
// clock never passes in real time.
var waitT0 = time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)

// newWaitFakeWorld returns a fake clock at waitT0 that sleeping moves (one
// for a Throttler and for Wait), and has the test's waitThrottler wait in
// it, with the given jitter (nil: none).
func newWaitFakeWorld(t *testing.T, jitter func(time.Duration) time.Duration) *sleep.Fake {
	w := sleep.NewFake(waitT0)
	if jitter == nil {
		jitter = func(time.Duration) time.Duration { return 0 }
	}
	setWaitWorld(t, waitWorld{w.Now, w.Sleep, jitter})
	return w
}

// waitWorld is what a test's Throttlers wait in (see throttler.SetWaitWorld).
type waitWorld struct {
	now    func() time.Time
	sleep  func(context.Context, time.Duration) error
	jitter func(time.Duration) time.Duration
}

// waitWorlds holds each test's waitWorld, for waitThrottler.
var waitWorlds sync.Map // testing.TB → waitWorld

// setWaitWorld has waitThrottler(t, …) build Throttlers that wait in w.
func setWaitWorld(t testing.TB, w waitWorld) {
	waitWorlds.Store(t, w)
	t.Cleanup(func() { waitWorlds.Delete(t) })
}

// waitTakeCounter counts the Takes that reach a backend.
type waitTakeCounter struct {
	throttler.Backend
	takes atomic.Int64
}

func (c *waitTakeCounter) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	c.takes.Add(1)
	return c.Backend.Take(ctx, key, p, cost, now)
}

func waitMemory(t *testing.T) *memory.Backend {
	t.Helper()
	m, err := memory.New(nil)
	require.NoError(t, err)
	return m
}

func waitThrottler(t *testing.T, b throttler.Backend, o *throttler.Options) *throttler.Throttler {
	t.Helper()
	th, err := throttler.New(b, o)
	require.NoError(t, err)
	if w, ok := waitWorlds.Load(t); ok {
		w := w.(waitWorld)
		throttler.SetWaitWorld(th, w.now, w.sleep, w.jitter)
	}
	return th
}

// waitBackends are the stores Wait is proven on: a memory backend, and the
// same behind a router and behind a shadow, which only forward.
var waitBackends = []struct {
	name string
	new  func(t *testing.T) throttler.Backend
}{
	{"memory", func(t *testing.T) throttler.Backend { return waitMemory(t) }},
	{"router", func(t *testing.T) throttler.Backend {
		all, err := flags.NewPercent(100)
		require.NoError(t, err)
		r, err := flags.NewRouter(waitMemory(t), waitMemory(t), all, nil)
		require.NoError(t, err)
		return r
	}},
	{"shadow", func(t *testing.T) throttler.Backend {
		s, err := shadow.New(waitMemory(t), waitMemory(t), nil)
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		return s
	}},
}

// TestWaitSleepsExactlyRetryAfter: on every algorithm, through every
// wrapper, a Wait on a spent key sleeps the denial's RetryAfter once and is
// admitted by the next call: two Takes, no wasted round trip. The waits are
// the algorithms' arithmetic (docs/algorithms.md).
func TestWaitSleepsExactlyRetryAfter(t *testing.T) {
	type step struct {
		at   time.Duration // after waitT0
		cost int64
	}
	tests := []struct {
		name  string
		p     throttler.Policy
		spend []step
		n     int64
		want  time.Duration
	}{
		{"fixed window", throttler.PerMinute(2), []step{{0, 2}}, 1, time.Minute},
		{"fixed window, later", throttler.PerMinute(2), []step{{0, 1}, {15 * time.Second, 1}}, 1, 45 * time.Second},
		{"token bucket", throttler.PerSecond(10).WithAlgorithm(throttler.TokenBucket), []step{{0, 10}}, 1, 100 * time.Millisecond},
		{"token bucket, n=3", throttler.PerSecond(10).WithAlgorithm(throttler.TokenBucket), []step{{0, 10}}, 3, 300 * time.Millisecond},
		{"token bucket, burst", throttler.PerSecond(10).WithBurst(20), []step{{0, 15}}, 8, 300 * time.Millisecond},
		{"sliding log", throttler.PerMinute(3).WithAlgorithm(throttler.SlidingLog), []step{{0, 1}, {10 * time.Second, 1}, {20 * time.Second, 1}}, 1, 40 * time.Second},
		{"sliding log, n=2", throttler.PerMinute(3).WithAlgorithm(throttler.SlidingLog), []step{{0, 1}, {10 * time.Second, 1}, {20 * time.Second, 1}}, 2, 50 * time.Second},
		// waitT0 is 7s into an epoch-aligned minute: the next window starts
		// in 53s, where the previous 10 still weigh ceil(10*54/60) = 9 at
		// 6s into it, so 1 fits 59s after waitT0.
		{"sliding window", throttler.PerMinute(10).WithAlgorithm(throttler.SlidingWindow), []step{{0, 10}}, 1, 59 * time.Second},
	}
	for _, b := range waitBackends {
		for _, tc := range tests {
			t.Run(b.name+"/"+tc.name, func(t *testing.T) {
				w := newWaitFakeWorld(t, nil)
				store := &waitTakeCounter{Backend: b.new(t)}
				th := waitThrottler(t, store, &throttler.Options{Clock: w.Now})
				ctx := context.Background()
				for _, s := range tc.spend {
					w.Add(waitT0.Add(s.at).Sub(w.Now()))
					d, err := th.AllowN(ctx, "k", tc.p, s.cost)
					require.NoError(t, err)
					require.True(t, d.Allowed, "spending %d at %v", s.cost, s.at)
				}
				start, before := w.Now(), store.takes.Load()

				d, err := th.WaitN(ctx, "k", tc.p, tc.n)
				require.NoError(t, err)
				assert.True(t, d.Allowed)
				assert.Equal(t, []time.Duration{tc.want}, w.Sleeps())
				assert.Equal(t, start.Add(tc.want), w.Now())
				assert.Equal(t, int64(2), store.takes.Load()-before, "one denial, one admission")
				assert.Zero(t, throttler.WaitLanes(th), "a lane outlived its waiters")
			})
		}
	}
}

func TestWaitAdmitsAtOnceWhenThereIsRoom(t *testing.T) {
	w := newWaitFakeWorld(t, nil)
	store := &waitTakeCounter{Backend: waitMemory(t)}
	th := waitThrottler(t, store, &throttler.Options{Clock: w.Now})
	d, err := th.Wait(context.Background(), "k", throttler.PerMinute(2))
	require.NoError(t, err)
	assert.True(t, d.ResetAt.Equal(waitT0.Add(time.Minute)), "ResetAt %v", d.ResetAt)
	d.ResetAt = time.Time{}
	assert.Equal(t, throttler.Decision{Allowed: true, Limit: 2, Used: 1, Remaining: 1, At: waitT0}, d)
	assert.Empty(t, w.Sleeps())
	assert.Equal(t, int64(1), store.takes.Load())
}

// TestWaitJitter: the extra is drawn up to a tenth of the wait (1ms to 100ms),
// is never negative, so a retry is never early, and never takes the retry
// past half the time left before the deadline.
func TestWaitJitter(t *testing.T) {
	for _, tc := range []struct{ wait, bound time.Duration }{
		{500 * time.Microsecond, time.Millisecond},
		{5 * time.Millisecond, time.Millisecond},
		{100 * time.Millisecond, 10 * time.Millisecond},
		{time.Second, 100 * time.Millisecond},
		{time.Minute, 100 * time.Millisecond},
	} {
		assert.Equal(t, tc.bound, throttler.WaitJitterBound(tc.wait), "bound of %v", tc.wait)
	}
	seen := map[time.Duration]bool{}
	for range 1000 {
		j := throttler.WaitRandomJitter(10 * time.Millisecond)
		require.True(t, j >= 0 && j <= 10*time.Millisecond, "jitter %v", j)
		seen[j] = true
	}
	assert.Greater(t, len(seen), 100, "the jitter hardly varies")

	full := func(bound time.Duration) time.Duration { return bound }
	for _, tc := range []struct {
		name     string
		deadline time.Duration // after waitT0; 0: none
		want     time.Duration
	}{
		{"no deadline", 0, time.Minute + 100*time.Millisecond},
		{"far deadline", time.Hour, time.Minute + 100*time.Millisecond},
		// 100ms left after the earliest admission: half of it.
		{"near deadline", time.Minute + 100*time.Millisecond, time.Minute + 50*time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWaitFakeWorld(t, full)
			th := waitThrottler(t, waitMemory(t), &throttler.Options{Clock: w.Now})
			ctx := context.Background()
			if tc.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, waitT0.Add(tc.deadline))
				defer cancel()
			}
			_, err := th.Allow(ctx, "k", throttler.PerMinute(1))
			require.NoError(t, err)
			d, err := th.Wait(ctx, "k", throttler.PerMinute(1))
			require.NoError(t, err)
			assert.True(t, d.Allowed)
			assert.Equal(t, []time.Duration{tc.want}, w.Sleeps())
		})
	}
}

// TestWaitReturnsAtOnceWhenTheDeadlineComesFirst: like x/time/rate, a
// deadline before the earliest admission is an error at once, with the
// denial that says when that would have been.
func TestWaitReturnsAtOnceWhenTheDeadlineComesFirst(t *testing.T) {
	for _, tc := range []struct {
		name     string
		deadline time.Duration // after waitT0
		ok       bool
	}{
		{"deadline well before", 30 * time.Second, false},
		{"deadline at the earliest admission", time.Minute, false},
		{"deadline just after", time.Minute + time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWaitFakeWorld(t, nil)
			store := &waitTakeCounter{Backend: waitMemory(t)}
			th := waitThrottler(t, store, &throttler.Options{Clock: w.Now})
			p := throttler.PerMinute(1)
			_, err := th.Allow(context.Background(), "k", p)
			require.NoError(t, err)
			ctx, cancel := context.WithDeadline(context.Background(), waitT0.Add(tc.deadline))
			defer cancel()

			d, err := th.Wait(ctx, "k", p)
			if tc.ok {
				require.NoError(t, err)
				assert.True(t, d.Allowed)
				assert.Equal(t, []time.Duration{time.Minute}, w.Sleeps())
				return
			}
			require.ErrorIs(t, err, throttler.ErrWouldExceedDeadline)
			assert.NotErrorIs(t, err, context.DeadlineExceeded, "the context has not ended")
			assert.False(t, d.Allowed)
			assert.Equal(t, time.Minute, d.RetryAfter, "the denial says when admission would have come")
			assert.Empty(t, w.Sleeps())
			assert.Equal(t, int64(2), store.takes.Load(), "one Take to spend, one to learn the wait")
		})
	}
}

// waitScripted answers Takes from a list of decisions, then admits.
type waitScripted struct {
	mu      sync.Mutex
	answers []throttler.Decision
}

func (s *waitScripted) Take(context.Context, string, throttler.Policy, int64, time.Time) (throttler.Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.answers) == 0 {
		return throttler.Decision{Allowed: true, Limit: 1}, nil
	}
	d := s.answers[0]
	s.answers = s.answers[1:]
	return d, nil
}

func (s *waitScripted) Peek(context.Context, string, throttler.Policy, time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, errors.New("not used")
}

func (s *waitScripted) Refund(context.Context, string, throttler.Policy, int64, time.Time, time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, errors.New("not used")
}

// TestWaitNeverSpins: a denial without a RetryAfter backs off from 50ms,
// doubling to 1s; a denial that says when resets the back-off.
func TestWaitNeverSpins(t *testing.T) {
	w := newWaitFakeWorld(t, nil)
	denied := throttler.Decision{Limit: 1}
	answers := slices.Repeat([]throttler.Decision{denied}, 7)
	answers = append(answers, throttler.Decision{Limit: 1, RetryAfter: 3 * time.Second}, denied)
	th := waitThrottler(t, &waitScripted{answers: answers}, &throttler.Options{Clock: w.Now})

	d, err := th.Wait(context.Background(), "k", throttler.PerSecond(1))
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	ms := time.Millisecond
	assert.Equal(t, []time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms, 800 * ms, time.Second, time.Second, 3 * time.Second, 50 * ms}, w.Sleeps())
}

type waitDown struct{ calls atomic.Int64 }

func (d *waitDown) Take(context.Context, string, throttler.Policy, int64, time.Time) (throttler.Decision, error) {
	d.calls.Add(1)
	return throttler.Decision{}, errors.New("connection refused")
}

func (d *waitDown) Peek(ctx context.Context, k string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	return d.Take(ctx, k, p, 1, now)
}

func (d *waitDown) Refund(ctx context.Context, k string, p throttler.Policy, n int64, _, now time.Time) (throttler.Decision, error) {
	return d.Take(ctx, k, p, n, now)
}

// TestWaitWhileTheStoreIsDown: failing closed is an error at once, failing
// open an admission at once, and a fallback is waited on like the store.
func TestWaitWhileTheStoreIsDown(t *testing.T) {
	p := throttler.PerMinute(2)
	t.Run("fail closed", func(t *testing.T) {
		w := newWaitFakeWorld(t, nil)
		down := &waitDown{}
		th := waitThrottler(t, down, &throttler.Options{Clock: w.Now, FailClosed: true})
		d, err := th.Wait(context.Background(), "k", p)
		require.ErrorIs(t, err, throttler.ErrUnavailable)
		assert.False(t, d.Allowed)
		assert.Empty(t, w.Sleeps())
		assert.Equal(t, int64(1), down.calls.Load())
	})
	t.Run("fail open", func(t *testing.T) {
		w := newWaitFakeWorld(t, nil)
		th := waitThrottler(t, &waitDown{}, &throttler.Options{Clock: w.Now, FailClosed: false})
		d, err := th.Wait(context.Background(), "k", p)
		require.NoError(t, err)
		assert.True(t, d.Allowed)
		assert.True(t, d.Degraded)
		assert.Empty(t, w.Sleeps())
	})
	t.Run("fallback", func(t *testing.T) {
		w := newWaitFakeWorld(t, nil)
		th := waitThrottler(t, &waitDown{}, &throttler.Options{Clock: w.Now, FailClosed: true, Fallback: waitMemory(t)})
		_, err := th.AllowN(context.Background(), "k", p, 2)
		require.NoError(t, err)
		d, err := th.Wait(context.Background(), "k", p)
		require.NoError(t, err)
		assert.True(t, d.Allowed)
		assert.True(t, d.Degraded)
		assert.Equal(t, []time.Duration{time.Minute}, w.Sleeps())
	})
}

// TestWaitRefusesBadInputAtOnce: a cost above the capacity could never be
// admitted, so it is an error, never a wait.
func TestWaitRefusesBadInputAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		key  string
		p    throttler.Policy
		n    int64
		want error
	}{
		{"zero cost", "k", throttler.PerMinute(3), 0, throttler.ErrInvalidCost},
		{"negative cost", "k", throttler.PerMinute(3), -1, throttler.ErrInvalidCost},
		{"fixed window above limit", "k", throttler.PerMinute(3), 4, throttler.ErrInvalidCost},
		{"token bucket above burst", "k", throttler.PerSecond(10).WithBurst(5), 6, throttler.ErrInvalidCost},
		{"sliding log above limit", "k", throttler.PerMinute(3).WithAlgorithm(throttler.SlidingLog), 4, throttler.ErrInvalidCost},
		{"sliding window above limit", "k", throttler.PerMinute(3).WithAlgorithm(throttler.SlidingWindow), 4, throttler.ErrInvalidCost},
		{"empty key", "", throttler.PerMinute(3), 1, throttler.ErrInvalidKey},
		{"invalid policy", "k", throttler.PerMinute(0), 1, throttler.ErrInvalidPolicy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWaitFakeWorld(t, nil)
			th := waitThrottler(t, waitMemory(t), &throttler.Options{Clock: w.Now})
			_, err := th.WaitN(context.Background(), tc.key, tc.p, tc.n)
			require.ErrorIs(t, err, tc.want)
			assert.Empty(t, w.Sleeps())
		})
	}
}

func TestWaitOnANilThrottlerIsAnError(t *testing.T) {
	var nilTh *throttler.Throttler
	_, err := nilTh.Wait(context.Background(), "k", throttler.PerMinute(1))
	assert.Error(t, err)
	_, err = (&throttler.Throttler{}).Wait(context.Background(), "k", throttler.PerMinute(1))
	assert.Error(t, err)
}

// waitGated is a fake clock whose sleeps block until the test wakes them,
// one at a time: the test sees who sleeps, and when.
type waitGated struct {
	*sleep.Fake
	asleep         chan time.Duration
	wake           chan struct{}
	sleeping, most atomic.Int32
}

func (g *waitGated) Sleep(ctx context.Context, d time.Duration) error {
	n := g.sleeping.Add(1)
	for m := g.most.Load(); n > m && !g.most.CompareAndSwap(m, n); m = g.most.Load() {
	}
	defer g.sleeping.Add(-1)
	g.asleep <- d
	select {
	case <-g.wake:
		return g.Fake.Sleep(ctx, d)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitUntil spins until cond holds (goroutines reaching a state), failing
// after a generous real-time bound; it moves no clock.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}

// TestWaitersOfAKeyQueue: many goroutines waiting on one spent key in one
// process: one at a time asks the store and sleeps, the others queue, and
// each is admitted in its own window, in turn.
func TestWaitersOfAKeyQueue(t *testing.T) {
	const waiters = 8
	g := &waitGated{Fake: sleep.NewFake(waitT0), asleep: make(chan time.Duration), wake: make(chan struct{})}
	setWaitWorld(t, waitWorld{g.Now, g.Sleep, func(time.Duration) time.Duration { return 0 }})
	store := &waitTakeCounter{Backend: waitMemory(t)}
	th := waitThrottler(t, store, &throttler.Options{Clock: g.Now})
	p := throttler.PerMinute(1)
	_, err := th.Allow(context.Background(), "k", p)
	require.NoError(t, err)

	results := make(chan throttler.Decision, waiters)
	var wg sync.WaitGroup
	for range waiters {
		wg.Go(func() {
			d, err := th.Wait(context.Background(), "k", p)
			assert.NoError(t, err)
			results <- d
		})
	}
	first := <-g.asleep
	assert.Equal(t, time.Minute, first)
	waitUntil(t, "every waiter queues", func() bool { return throttler.WaitLaneWaiters(th, "k", p) == waiters })

	// A bad cost is refused at once, not after a turn behind the queue.
	_, err = th.WaitN(context.Background(), "k", p, 2)
	require.ErrorIs(t, err, throttler.ErrInvalidCost)

	for i := range waiters {
		if i > 0 {
			assert.Equal(t, time.Minute, <-g.asleep, "waiter %d sleeps a window", i)
		}
		g.wake <- struct{}{}
	}
	wg.Wait()
	close(results)

	var resets []time.Time
	for d := range results {
		assert.True(t, d.Allowed)
		resets = append(resets, d.ResetAt)
	}
	slices.SortFunc(resets, time.Time.Compare)
	for i, r := range resets {
		assert.True(t, waitT0.Add(time.Duration(i+2)*time.Minute).Equal(r), "admission %d ends at %v, not in its own window", i, r)
	}
	assert.Equal(t, int32(1), g.most.Load(), "more than one waiter slept at once")
	// Each waiter: at most one Take on arrival, one as the head (the first
	// slept on its arrival's denial), one after its sleep.
	assert.LessOrEqual(t, store.takes.Load()-1, int64(3*waiters-1))
	assert.Zero(t, throttler.WaitLanes(th))
}

// TestWaitEndsWithItsContext runs on the real clock: a Wait whose context
// ends returns its error within a small bound, and leaves no goroutine and
// no lane behind.
func TestWaitEndsWithItsContext(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	// Scheduling under -race on a busy machine; typically well under 1ms.
	const bound = 250 * time.Millisecond
	th := waitThrottler(t, waitMemory(t), nil)
	p := throttler.PerMinute(1)
	_, err := th.Allow(context.Background(), "k", p)
	require.NoError(t, err)

	t.Run("already done", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := th.Wait(ctx, "fresh", p)
		require.ErrorIs(t, err, context.Canceled)
		d, err := th.Peek(context.Background(), "fresh", p)
		require.NoError(t, err)
		assert.Zero(t, d.Used, "a done context still took a unit")
	})

	t.Run("canceled while sleeping", func(t *testing.T) {
		ctx, cancel := context.WithCancelCause(context.Background())
		cause := errors.New("worker stopping")
		done := make(chan error, 1)
		go func() { _, err := th.Wait(ctx, "k", p); done <- err }()
		waitUntil(t, "the waiter sleeps", func() bool { return throttler.WaitLaneWaiters(th, "k", p) == 1 })
		canceled := time.Now()
		cancel(cause)
		err := <-done
		took := time.Since(canceled)
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorIs(t, err, cause)
		assert.Less(t, took, bound)
		t.Logf("returned %v after the cancellation", took)
	})

	t.Run("deadline while queued", func(t *testing.T) {
		// The head waits for 2 of 2 with 1 spent; a waiter of 1 behind it
		// could fit at once if the head left, so only its deadline ends it.
		p2 := throttler.PerMinute(2)
		_, err := th.Allow(context.Background(), "k2", p2)
		require.NoError(t, err)
		head, stopHead := context.WithCancel(context.Background())
		defer stopHead()
		headDone := make(chan error, 1)
		go func() { _, err := th.WaitN(head, "k2", p2, 2); headDone <- err }()
		waitUntil(t, "the head sleeps", func() bool { return throttler.WaitLaneWaiters(th, "k2", p2) == 1 })

		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		deadline, _ := ctx.Deadline()
		_, err = th.Wait(ctx, "k2", p2)
		late := time.Since(deadline)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.GreaterOrEqual(t, late, time.Duration(0))
		assert.Less(t, late, bound)
		t.Logf("returned %v after the deadline", late)

		stopHead()
		require.ErrorIs(t, <-headDone, context.Canceled)
	})

	t.Run("queued, the deadline before the head's admission", func(t *testing.T) {
		head, stopHead := context.WithCancel(context.Background())
		defer stopHead()
		headDone := make(chan error, 1)
		go func() { _, err := th.Wait(head, "k", p); headDone <- err }()
		waitUntil(t, "the head sleeps", func() bool { return throttler.WaitLaneWaiters(th, "k", p) == 1 })

		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		d, err := th.Wait(ctx, "k", p)
		took := time.Since(start)
		require.ErrorIs(t, err, throttler.ErrWouldExceedDeadline)
		assert.False(t, d.Allowed)
		assert.Greater(t, d.RetryAfter, 50*time.Second, "the head's denial, counted from now")
		assert.Less(t, took, bound)
		t.Logf("returned after %v", took)

		stopHead()
		require.ErrorIs(t, <-headDone, context.Canceled)
	})
	assert.Zero(t, throttler.WaitLanes(th))
}

// waitResult is what a Wait run on a goroutine returned, and the fake
// instant it returned at.
type waitResult struct {
	d   throttler.Decision
	err error
	at  time.Time
}

// goWait runs WaitN on a goroutine.
func goWait(ctx context.Context, th *throttler.Throttler, key string, p throttler.Policy, n int64, now func() time.Time) <-chan waitResult {
	ch := make(chan waitResult, 1)
	go func() {
		d, err := th.WaitN(ctx, key, p, n)
		ch <- waitResult{d, err, now()}
	}()
	return ch
}

// receive returns what a goroutine sends on ch, failing after a generous
// real-time bound (a Wait that blocks where it should return).
func receive[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func newWaitGated(t *testing.T) *waitGated {
	g := &waitGated{Fake: sleep.NewFake(waitT0), asleep: make(chan time.Duration), wake: make(chan struct{})}
	setWaitWorld(t, waitWorld{g.Now, g.Sleep, func(time.Duration) time.Duration { return 0 }})
	return g
}

// goHead starts a waiter of n on key and returns once it sleeps, with how
// long, and a stop that cancels it and returns what it returned.
func (g *waitGated) goHead(t *testing.T, th *throttler.Throttler, key string, p throttler.Policy, n int64) (time.Duration, func() waitResult) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := goWait(ctx, th, key, p, n, g.Now)
	slept := receive(t, "the head's sleep", g.asleep)
	return slept, func() waitResult { cancel(); return receive(t, "the head", ch) }
}

// goQueued starts a waiter of n on key whose deadline is the given time
// after waitT0, and returns once it queues behind the head.
func (g *waitGated) goQueued(t *testing.T, th *throttler.Throttler, key string, p throttler.Policy, n int64, deadline time.Duration) <-chan waitResult {
	t.Helper()
	ctx, cancel := context.WithDeadline(context.Background(), waitT0.Add(deadline))
	t.Cleanup(cancel)
	ch := goWait(ctx, th, key, p, n, g.Now)
	waitUntil(t, "the waiter queues", func() bool { return throttler.WaitLaneWaiters(th, key, p) == 2 })
	return ch
}

// TestQueuedWaitReturnsAtOnceWhenTheDeadlineComesFirst: a waiter queued
// behind a head denied until an instant A returns ErrWouldExceedDeadline at
// once, without a store call, when its deadline is at or before A and its
// cost at least the head's: no Take of that cost can be admitted before A,
// whether the head stays or leaves. The Decision is the head's denial, its
// RetryAfter counted from now.
func TestQueuedWaitReturnsAtOnceWhenTheDeadlineComesFirst(t *testing.T) {
	for _, tc := range []struct {
		name     string
		deadline time.Duration // after waitT0
		n        int64
	}{
		{"deadline well before the head's admission", 30 * time.Second, 1},
		{"deadline at the head's admission", time.Minute, 1},
		{"a larger cost than the head's", 30 * time.Second, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newWaitGated(t)
			store := &waitTakeCounter{Backend: waitMemory(t)}
			th := waitThrottler(t, store, &throttler.Options{Clock: g.Now})
			p := throttler.PerMinute(2)
			_, err := th.AllowN(context.Background(), "k", p, 2)
			require.NoError(t, err)
			slept, stopHead := g.goHead(t, th, "k", p, 1)
			require.Equal(t, time.Minute, slept)
			before := store.takes.Load()

			ctx, cancel := context.WithDeadline(context.Background(), waitT0.Add(tc.deadline))
			defer cancel()
			r := receive(t, "the queued waiter", goWait(ctx, th, "k", p, tc.n, g.Now))
			require.ErrorIs(t, r.err, throttler.ErrWouldExceedDeadline)
			assert.NotErrorIs(t, r.err, context.DeadlineExceeded, "the context has not ended")
			assert.Equal(t, waitT0, r.at, "at once")
			assert.False(t, r.d.Allowed)
			assert.Equal(t, time.Minute, r.d.RetryAfter, "the head's denial says when")
			assert.Equal(t, int64(2), r.d.Used, "the head's denial")
			assert.Equal(t, before, store.takes.Load(), "the queued waiter asked the store")
			assert.Equal(t, 1, throttler.WaitLaneWaiters(th, "k", p), "the refused waiter left the lane")

			require.ErrorIs(t, stopHead().err, context.Canceled)
			assert.Zero(t, throttler.WaitLanes(th))
		})
	}
}

// TestQueuedWaitNeverRefusedWhenItCouldFit: a queued waiter is refused only
// when it could not be admitted before its deadline. A cost smaller than
// the head's may fit while the head's does not, and a store whose fallback
// denied the head may be back: such a waiter waits for its turn and, the
// head gone, is admitted at once; a deadline after the head's admission
// waits for its turn, and is refused only by its own denial.
func TestQueuedWaitNeverRefusedWhenItCouldFit(t *testing.T) {
	t.Run("a smaller cost than the head's", func(t *testing.T) {
		g := newWaitGated(t)
		th := waitThrottler(t, waitMemory(t), &throttler.Options{Clock: g.Now})
		p := throttler.PerMinute(2)
		_, err := th.Allow(context.Background(), "k", p)
		require.NoError(t, err)
		_, stopHead := g.goHead(t, th, "k", p, 2)

		queued := g.goQueued(t, th, "k", p, 1, 30*time.Second)
		require.ErrorIs(t, stopHead().err, context.Canceled)

		r := receive(t, "the queued waiter", queued)
		require.NoError(t, r.err)
		assert.True(t, r.d.Allowed)
		assert.Equal(t, waitT0, r.at)
	})
	t.Run("the head denied by the fallback", func(t *testing.T) {
		// The fallback's denial says nothing of the store, which admits
		// as soon as it is back.
		g := newWaitGated(t)
		primary := &stubBackend{next: waitMemory(t), err: errDown}
		th := waitThrottler(t, primary, &throttler.Options{Clock: g.Now, Fallback: waitMemory(t)})
		p := throttler.PerMinute(1)
		_, err := th.Allow(context.Background(), "k", p)
		require.NoError(t, err)
		slept, stopHead := g.goHead(t, th, "k", p, 1)
		require.Equal(t, time.Minute, slept)

		queued := g.goQueued(t, th, "k", p, 1, 30*time.Second)
		primary.set(nil)
		require.ErrorIs(t, stopHead().err, context.Canceled)

		// Not refused on the head's denial: at its turn it asks, and the
		// fallback, which answers the key until its window ends (the store
		// back or not), denies it past its deadline.
		r := receive(t, "the queued waiter", queued)
		require.ErrorIs(t, r.err, throttler.ErrWouldExceedDeadline)
		assert.NotContains(t, r.err.Error(), "queued behind")
		assert.True(t, r.d.Degraded)
		assert.Equal(t, waitT0, r.at)
	})
	t.Run("a deadline after the head's admission", func(t *testing.T) {
		g := newWaitGated(t)
		store := &waitTakeCounter{Backend: waitMemory(t)}
		th := waitThrottler(t, store, &throttler.Options{Clock: g.Now})
		p := throttler.PerMinute(1)
		_, err := th.Allow(context.Background(), "k", p)
		require.NoError(t, err)
		head := goWait(context.Background(), th, "k", p, 1, g.Now)
		require.Equal(t, time.Minute, receive(t, "the head's sleep", g.asleep))

		queued := g.goQueued(t, th, "k", p, 1, time.Minute+time.Millisecond)
		g.wake <- struct{}{}
		h := receive(t, "the head", head)
		require.NoError(t, h.err)
		require.True(t, h.d.Allowed)

		// Its turn came at the head's admission, which took the unit: its
		// own denial, a window later, is what refuses it.
		r := receive(t, "the queued waiter", queued)
		require.ErrorIs(t, r.err, throttler.ErrWouldExceedDeadline)
		assert.Equal(t, waitT0.Add(time.Minute), r.at)
		assert.Equal(t, time.Minute, r.d.RetryAfter)
		assert.Equal(t, int64(4), store.takes.Load(), "the spend, the head's denial and admission, the waiter's own denial")
	})
}

// TestQueuedWaitLearnsFromTheHeadsNextDenial: a waiter whose deadline
// came after the head's first denial returns as soon as the head is denied
// again, for longer (another process spent in between), at the instant of
// that denial.
func TestQueuedWaitLearnsFromTheHeadsNextDenial(t *testing.T) {
	g := newWaitGated(t)
	denied := throttler.Decision{Limit: 1, Used: 1, RetryAfter: time.Minute}
	th := waitThrottler(t, &waitScripted{answers: []throttler.Decision{denied, denied}}, &throttler.Options{Clock: g.Now})
	p := throttler.PerMinute(1)
	slept, stopHead := g.goHead(t, th, "k", p, 1)
	require.Equal(t, time.Minute, slept)

	queued := g.goQueued(t, th, "k", p, 1, 100*time.Second)
	g.wake <- struct{}{}
	assert.Equal(t, time.Minute, receive(t, "the head's second sleep", g.asleep))

	r := receive(t, "the queued waiter", queued)
	require.ErrorIs(t, r.err, throttler.ErrWouldExceedDeadline)
	assert.Equal(t, waitT0.Add(time.Minute), r.at, "at the head's second denial")
	assert.Equal(t, time.Minute, r.d.RetryAfter)
	require.ErrorIs(t, stopHead().err, context.Canceled)
}

// TestEachThrottlerQueuesItsOwnWaiters: the lanes are a Throttler's own.
// Two Throttlers on one store each have a head waiter on the same spent key
// asleep at once: neither queues behind the other's, and each one's lanes
// are gone when its waiters leave.
func TestEachThrottlerQueuesItsOwnWaiters(t *testing.T) {
	g := newWaitGated(t)
	store := waitMemory(t)
	p := throttler.PerMinute(1)
	var ths [2]*throttler.Throttler
	var stops [2]func() waitResult
	for i := range ths {
		ths[i] = waitThrottler(t, store, &throttler.Options{Clock: g.Now})
		if i == 0 {
			_, err := ths[i].Allow(context.Background(), "k", p)
			require.NoError(t, err)
		}
		var slept time.Duration
		slept, stops[i] = g.goHead(t, ths[i], "k", p, 1)
		assert.Equal(t, time.Minute, slept, "Throttler %d's head sleeps", i)
	}
	assert.Equal(t, int32(2), g.most.Load(), "one head asleep per Throttler")
	for i, th := range ths {
		assert.Equal(t, 1, throttler.WaitLaneWaiters(th, "k", p), "Throttler %d", i)
		assert.Equal(t, 1, throttler.WaitLanes(th), "Throttler %d", i)
	}

	require.ErrorIs(t, stops[0]().err, context.Canceled)
	assert.Zero(t, throttler.WaitLanes(ths[0]))
	assert.Equal(t, 1, throttler.WaitLanes(ths[1]), "the other Throttler's waiter stays")
	require.ErrorIs(t, stops[1]().err, context.Canceled)
	assert.Zero(t, throttler.WaitLanes(ths[1]))
}

// waitHook runs hook on the first Take after it is armed, before the Take
// reaches the store; Takes made meanwhile (by the hook) go straight on.
type waitHook struct {
	throttler.Backend
	hook  func()
	armed atomic.Bool
}

func (h *waitHook) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	if h.armed.CompareAndSwap(true, false) {
		h.hook()
	}
	return h.Backend.Take(ctx, key, p, cost, now)
}

// TestWaitQueuedAfterItsOwnDenial: a waiter that asked the store and was
// denied, and found someone queued when it joined the queue, is bounded by
// its own denial as a waiter alone is.
func TestWaitQueuedAfterItsOwnDenial(t *testing.T) {
	g := newWaitGated(t)
	store := &waitHook{Backend: waitMemory(t)}
	th := waitThrottler(t, store, &throttler.Options{Clock: g.Now, Timeout: time.Minute})
	p := throttler.PerMinute(1)
	_, err := th.Allow(context.Background(), "k", p)
	require.NoError(t, err)
	var stopHead func() waitResult
	// The head queues while the waiter asks.
	store.hook = func() { _, stopHead = g.goHead(t, th, "k", p, 1) }
	store.armed.Store(true)

	ctx, cancel := context.WithDeadline(context.Background(), waitT0.Add(30*time.Second))
	defer cancel()
	r := receive(t, "the waiter", goWait(ctx, th, "k", p, 1, g.Now))
	require.NotNil(t, stopHead)
	require.ErrorIs(t, r.err, throttler.ErrWouldExceedDeadline)
	assert.Equal(t, waitT0, r.at, "at once")
	assert.Equal(t, time.Minute, r.d.RetryAfter, "its own denial")
	require.ErrorIs(t, stopHead().err, context.Canceled)
}

// TestALargerCostNeverFitsSooner is what a queued waiter's refusal rests
// on, on random traces of every algorithm: after a Take of c denied at t
// with RetryAfter r, a Take of c or more at any instant before t + r (with
// nothing else spent) is denied too.
func TestALargerCostNeverFitsSooner(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 5))
	ctx := context.Background()
	type take struct {
		at   time.Time
		cost int64
	}
	checked := 0
	for trace := range 400 {
		alg := throttler.Algorithm(trace % 4)
		p := throttler.Policy{Limit: 1 + r.Int64N(5), Window: time.Duration(5+r.Int64N(20)) * time.Millisecond, Algorithm: alg}
		if alg == throttler.TokenBucket && r.IntN(2) == 0 {
			p.Burst = 1 + r.Int64N(6)
		}
		ms := func(n int64) time.Duration { return time.Duration(n) * time.Millisecond }
		var takes []take
		at := waitT0
		for range 10 {
			if r.IntN(6) == 0 {
				at = at.Add(-ms(r.Int64N(p.Window.Milliseconds())))
			} else {
				at = at.Add(ms(r.Int64N(p.Window.Milliseconds() + 1)))
			}
			takes = append(takes, take{at, 1 + r.Int64N(p.Capacity())})
		}
		m := waitMemory(t)
		for i, tk := range takes {
			d, err := m.Take(ctx, "k", p, tk.cost, tk.at)
			require.NoError(t, err)
			if d.Allowed {
				continue
			}
			require.Positive(t, d.RetryAfter, "a denial says when")
			// Replay the trace before this Take, then try a cost of at
			// least its own, at an instant before its admission.
			n := tk.cost + r.Int64N(p.Capacity()-tk.cost+1)
			try := tk.at.Add(ms(r.Int64N(d.RetryAfter.Milliseconds())))
			replay := waitMemory(t)
			for _, prev := range takes[:i] {
				_, err := replay.Take(ctx, "k", p, prev.cost, prev.at)
				require.NoError(t, err)
			}
			got, err := replay.Take(ctx, "k", p, n, try)
			require.NoError(t, err)
			assert.False(t, got.Allowed, "trace %d take %d %v: %d denied at %v until +%v, yet %d admitted at +%v",
				trace, i, p, tk.cost, tk.at.Sub(waitT0), d.RetryAfter, n, try.Sub(tk.at))
			checked++
		}
	}
	t.Logf("%d denials checked", checked)
}
