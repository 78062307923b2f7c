package throttler_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/cputime"
	"github.com/throttlekit/throttlekit/internal/sleep"
	"github.com/throttlekit/throttlekit/throttler"
)

// monoClock stands for the monotonic clock that cooldowns run on; tests
// move it, nothing sleeps.
type monoClock struct{ ns atomic.Int64 }

func (c *monoClock) Now() time.Duration  { return time.Duration(c.ns.Load()) }
func (c *monoClock) Add(d time.Duration) { c.ns.Add(int64(d)) }

// storesBackend names a store per key, "store " and the key's part before
// ':' ("a:1" is on store a), and fails or hangs per store or per key as a
// test says; otherwise it answers from next. It counts the calls that
// reached each store.
type storesBackend struct {
	next throttler.Backend

	mu     sync.Mutex
	fail   map[string]error // by store or by key
	hang   map[string]bool  // by store: wait for the call's context to end, like a paused server
	gates  map[string]chan struct{}
	calls  map[string]int
	inside chan string // if set, told each key that reached the backend
}

func newStoresBackend(t testing.TB) *storesBackend {
	return &storesBackend{next: newMemory(t), fail: map[string]error{}, hang: map[string]bool{}, gates: map[string]chan struct{}{}, calls: map[string]int{}}
}

func storeOf(key string) string {
	s, _, _ := strings.Cut(key, ":")
	return "store " + s
}

func (b *storesBackend) Traits() throttler.Traits { return throttler.Traits{Store: b.store} }

func (b *storesBackend) store(_ throttler.Op, key string, _ throttler.Policy) string {
	return storeOf(key)
}

func (b *storesBackend) set(storeOrKey string, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err == nil {
		delete(b.fail, storeOrKey)
	} else {
		b.fail[storeOrKey] = err
	}
}

func (b *storesBackend) setHang(store string, hang bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.hang[store] = hang
}

func (b *storesBackend) count(store string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.calls[store]
}

func (b *storesBackend) do(ctx context.Context, key string, f func() (throttler.Decision, error)) (throttler.Decision, error) {
	store := storeOf(key)
	b.mu.Lock()
	b.calls[store]++
	err := b.fail[key]
	if err == nil {
		err = b.fail[store]
	}
	hang, gate, inside := b.hang[store], b.gates[key], b.inside
	b.mu.Unlock()
	if inside != nil {
		inside <- key
	}
	if gate != nil {
		<-gate
	}
	if hang {
		<-ctx.Done()
		return throttler.Decision{}, fmt.Errorf("fake: %w", ctx.Err())
	}
	if err != nil {
		return throttler.Decision{}, err
	}
	return f()
}

func (b *storesBackend) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	return b.do(ctx, key, func() (throttler.Decision, error) { return b.next.Take(ctx, key, p, cost, now) })
}

func (b *storesBackend) Peek(ctx context.Context, key string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	return b.do(ctx, key, func() (throttler.Decision, error) { return b.next.Peek(ctx, key, p, now) })
}

func (b *storesBackend) Refund(ctx context.Context, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
	return b.do(ctx, key, func() (throttler.Decision, error) { return b.next.Refund(ctx, key, p, cost, receipt, now) })
}

// observations collects what Observe sees.
type observations struct {
	mu  sync.Mutex
	all []throttler.Observation
}

func (o *observations) add(x throttler.Observation) {
	o.mu.Lock()
	o.all = append(o.all, x)
	o.mu.Unlock()
}

func (o *observations) last() throttler.Observation {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.all[len(o.all)-1]
}

// takeN takes one unit n times and counts the admissions and where the
// decisions came from.
func takeN(t *testing.T, th *throttler.Throttler, key string, p throttler.Policy, n int) (admitted int, sources map[throttler.Source]int) {
	t.Helper()
	sources = map[throttler.Source]int{}
	for range n {
		var src throttler.Source
		d, err := th.Allow(context.Background(), key, p)
		require.NoError(t, err, key)
		if d.Allowed {
			admitted++
		}
		src = throttler.SourcePrimary
		if d.Degraded {
			src = throttler.SourceFailureMode // no fallback in these tests
		}
		sources[src]++
	}
	return admitted, sources
}

// Each store has its own breaker: with one of two Memcached servers
// paused, the healthy server's keys are still decided by it.
func TestBreakerCoversOneStore(t *testing.T) {
	b := newStoresBackend(t)
	var obs observations
	th := newThrottler(t, b, &throttler.Options{Clock: func() time.Time { return t0 }, BreakerThreshold: 3, Observe: obs.add})
	throttler.SetMonotonic(th, (&monoClock{}).Now)
	p := throttler.PerMinute(5).Named("api")

	b.set("store a", errDown)
	_, src := takeN(t, th, "a:1", p, 10)
	assert.Equal(t, 10, src[throttler.SourceFailureMode], "store a's keys fail open")
	assert.Equal(t, 3, b.count("store a"), "store a is skipped once its breaker opens")
	assert.Equal(t, "store a", obs.last().Store)
	assert.ErrorIs(t, obs.last().Err, throttler.ErrUnavailable)
	assert.Contains(t, obs.last().Err.Error(), "store a skipped")

	for _, key := range []string{"b:1", "b:2"} {
		admitted, src := takeN(t, th, key, p, 8)
		assert.Equal(t, 5, admitted, "%s on the healthy store is limited exactly", key)
		assert.Equal(t, 8, src[throttler.SourcePrimary], key)
		assert.Equal(t, "store b", obs.last().Store)
		assert.NoError(t, obs.last().Err)
	}
	assert.Equal(t, 16, b.count("store b"))
}

// Only failures of the store itself count toward its breaker: one corrupt
// item or one key that always errors never opens it for every key. Each of
// these calls still gets the failure mode, with its error in the
// observation.
func TestOnlyStoreFailuresTripABreaker(t *testing.T) {
	tests := []struct {
		name  string
		err   error
		trips bool
	}{
		{"a corrupt item", throttler.KeyFailure(errors.New("memcached: window of \"k\" holds \"x\"")), false},
		{"ErrKeyState wrapped", fmt.Errorf("redis: take: %w", throttler.ErrKeyState), false},
		{"a key's failure over a network error", throttler.KeyFailure(errDown), false},
		{"a key's failure marked as the store's too", throttler.StoreFailure("", throttler.KeyFailure(errors.New("x"))), false},
		{"an error nobody classified", errors.New("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{"contention on one key", errors.New("memcached: too much contention on one key"), false},
		{"a refused connection", errDown, true},
		{"a bare ECONNRESET", fmt.Errorf("read: %w", syscall.ECONNRESET), true},
		{"EOF", fmt.Errorf("redis: take: %w", io.EOF), true},
		{"a failure the backend marked", throttler.StoreFailure("", errors.New("LOADING Redis is loading the dataset in memory")), true},
		{"ErrUnavailable", fmt.Errorf("%w: pool timeout", throttler.ErrUnavailable), true},
	}
	p := throttler.PerMinute(3).Named("api")
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newStoresBackend(t)
			var obs observations
			th := newThrottler(t, b, &throttler.Options{Clock: func() time.Time { return t0 }, Observe: obs.add})
			throttler.SetMonotonic(th, (&monoClock{}).Now)
			b.set("a:bad", tc.err)
			for i := range 20 {
				d, err := th.Allow(context.Background(), "a:bad", p)
				require.NoError(t, err)
				require.True(t, d.Allowed && d.Degraded, "the failing key fails open")
				require.Equal(t, throttler.SourceFailureMode, obs.last().Source)
				if i < 5 || !tc.trips {
					require.ErrorIs(t, obs.last().Err, tc.err, "the call's own failure is visible")
				}
			}
			admitted, src := takeN(t, th, "a:good", p, 5)
			if tc.trips {
				assert.Equal(t, 5, src[throttler.SourceFailureMode], "a store failure opens the store's breaker")
				assert.Equal(t, 5, b.count("store a"), "the breaker opened at the 5th failure")
				return
			}
			assert.Equal(t, 3, admitted, "another key on the store is limited exactly")
			assert.Equal(t, 5, src[throttler.SourcePrimary])
			assert.Equal(t, 25, b.count("store a"), "the failing key reached the store every time")
		})
	}
}

// memory.ErrFull used to open the breaker, so a flood of new keys turned
// limiting off for every key already held. A full memory table
// now evicts to its second tier instead: new keys are limited, not failed
// open, and the held key keeps its count.
func TestFullTableNeverTripsABreaker(t *testing.T) {
	full, err := memory.New(&memory.Options{Shards: 1, MaxKeys: 1})
	require.NoError(t, err)
	var obs observations
	th := newThrottler(t, full, &throttler.Options{Clock: func() time.Time { return t0 }, BreakerThreshold: 2, Observe: obs.add})
	p := throttler.PerMinute(3).Named("api")
	admitted, _ := takeN(t, th, "held", p, 1)
	require.Equal(t, 1, admitted)

	for i := range 20 {
		d, err := th.Allow(context.Background(), fmt.Sprint("new-", i), p)
		require.NoError(t, err)
		assert.False(t, d.Degraded, "a full table makes room: the new key is limited, not failed open")
		assert.NoError(t, obs.last().Err)
	}
	// The second tier may over-count the held key (with MaxKeys 1 its two
	// cells hold the merged states of all 21 keys, and a new key can read a
	// shared cell as its own), never under-count: at most 2 more, and every
	// answer from the store, none from the failure mode.
	admitted, src := takeN(t, th, "held", p, 4)
	assert.LessOrEqual(t, admitted, 2, "the held key keeps being limited: 3 in all at most")
	assert.Equal(t, 4, src[throttler.SourcePrimary])
}

// The Throttler's own Timeout is a store failure; a caller's shorter
// deadline is not: a caller that gives up says nothing about the store.
func TestOnlyTheThrottlersOwnTimeoutCounts(t *testing.T) {
	b := newStoresBackend(t)
	b.setHang("store a", true)
	th := newThrottler(t, b, &throttler.Options{Timeout: 20 * time.Millisecond, BreakerThreshold: 2})
	throttler.SetMonotonic(th, (&monoClock{}).Now)
	p := throttler.PerMinute(3)

	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		_, err := th.Allow(ctx, "a:1", p)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, "the caller's deadline is the caller's error")
	}
	assert.Equal(t, 3, b.count("store a"), "never skipped: no store failure yet")

	for range 2 {
		d, err := th.Allow(context.Background(), "a:1", p)
		require.NoError(t, err)
		require.True(t, d.Degraded)
	}
	_, err := th.Allow(context.Background(), "a:1", p)
	require.NoError(t, err)
	assert.Equal(t, 5, b.count("store a"), "two timeouts of its own opened the breaker")
}

// The cooldown runs on the monotonic clock, whatever Options.Clock does: on
// the window clock, a clock stepped back 10 minutes would keep every call
// from a healthy primary for 10 minutes.
func TestCooldownRunsOnTheMonotonicClock(t *testing.T) {
	window := sleep.NewFake(t0)
	mono := &monoClock{}
	b := newStoresBackend(t)
	th := newThrottler(t, b, &throttler.Options{Clock: window.Now, BreakerThreshold: 1, BreakerCooldown: time.Second})
	throttler.SetMonotonic(th, mono.Now)
	p := throttler.PerMinute(100)

	b.set("store a", errDown)
	takeN(t, th, "a:1", p, 1) // opens the breaker
	b.set("store a", nil)

	window.Add(time.Hour) // the window clock jumps: the cooldown does not end
	_, src := takeN(t, th, "a:1", p, 1)
	assert.Equal(t, 1, src[throttler.SourceFailureMode], "still cooling down")

	window.Add(-time.Hour - 10*time.Minute) // and steps back 10 minutes
	mono.Add(time.Second)
	_, src = takeN(t, th, "a:1", p, 3)
	assert.Equal(t, 3, src[throttler.SourcePrimary], "a second later the store is back in use")
	assert.Equal(t, 4, b.count("store a"))
}

// When the cooldown ends exactly one caller probes the store (not 64
// callers paying a timeout each); the others keep skipping the store until
// it answers.
func TestHalfOpenBreakerLetsExactlyOneProbeThrough(t *testing.T) {
	mono := &monoClock{}
	b := newStoresBackend(t)
	var obs observations
	const timeout = 50 * time.Millisecond
	th := newThrottler(t, b, &throttler.Options{Timeout: timeout, BreakerThreshold: 1, BreakerCooldown: time.Second, Observe: obs.add})
	throttler.SetMonotonic(th, mono.Now)
	p := throttler.PerMinute(100)

	b.set("store a", errDown)
	takeN(t, th, "a:0", p, 1)
	b.set("store a", nil)
	b.setHang("store a", true) // a paused server: every call waits for its timeout
	mono.Add(time.Second)

	const callers = 64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			d, err := th.Allow(context.Background(), fmt.Sprint("a:", i), p)
			assert.NoError(t, err)
			assert.True(t, d.Degraded)
		}()
	}
	close(start)
	wg.Wait()
	assert.Equal(t, 2, b.count("store a"), "the first failure, then one probe")
	timedOut := 0
	for _, o := range obs.all[1:] {
		if errors.Is(o.Err, context.DeadlineExceeded) {
			timedOut++
		} else {
			assert.Contains(t, o.Err.Error(), "store a skipped")
		}
	}
	assert.Equal(t, 1, timedOut, "exactly one caller paid the timeout")

	// The probe failed: another whole cooldown.
	mono.Add(time.Second - 1)
	takeN(t, th, "a:x", p, 1)
	assert.Equal(t, 2, b.count("store a"), "reopened for a full cooldown")

	// The store is back: the next probe closes the breaker for everyone.
	b.setHang("store a", false)
	mono.Add(1)
	_, src := takeN(t, th, "a:x", p, 5)
	assert.Equal(t, 5, src[throttler.SourcePrimary])
}

// A probe that ends for a reason other than the store (a key's bad state,
// the caller giving up) passes its turn to the next caller, at once.
func TestInconclusiveProbePassesTheTurn(t *testing.T) {
	mono := &monoClock{}
	b := newStoresBackend(t)
	th := newThrottler(t, b, &throttler.Options{BreakerThreshold: 1, BreakerCooldown: time.Second})
	throttler.SetMonotonic(th, mono.Now)
	p := throttler.PerMinute(100)

	b.set("store a", errDown)
	takeN(t, th, "a:1", p, 1)
	b.set("store a", nil)
	b.set("a:corrupt", throttler.KeyFailure(errors.New("corrupt")))
	mono.Add(time.Second)

	takeN(t, th, "a:corrupt", p, 1) // the probe: the store answered, about one key
	assert.Equal(t, 2, b.count("store a"))
	_, src := takeN(t, th, "a:1", p, 2)
	assert.Equal(t, 2, src[throttler.SourcePrimary], "the next caller probed, and closed the breaker")
}

// A success of a call let through before the breaker opened does not close
// it: only the probe does.
func TestOnlyTheProbeClosesABreaker(t *testing.T) {
	mono := &monoClock{}
	b := newStoresBackend(t)
	th := newThrottler(t, b, &throttler.Options{BreakerThreshold: 1, BreakerCooldown: time.Second})
	throttler.SetMonotonic(th, mono.Now)
	p := throttler.PerMinute(100)

	gate := make(chan struct{})
	b.gates["a:slow"] = gate
	b.inside = make(chan string, 2)
	slow := make(chan throttler.Decision)
	go func() {
		d, err := th.Allow(context.Background(), "a:slow", p)
		assert.NoError(t, err)
		slow <- d
	}()
	require.Equal(t, "a:slow", <-b.inside, "the slow call is in the store")
	b.set("a:fail", errDown)
	takeN(t, th, "a:fail", p, 1) // opens the breaker
	<-b.inside
	close(gate)
	assert.False(t, (<-slow).Degraded, "the slow call succeeded")

	_, src := takeN(t, th, "a:other", p, 1)
	assert.Equal(t, 1, src[throttler.SourceFailureMode], "still open")
	assert.Equal(t, 2, b.count("store a"))
}

// A backend may blame a failure on another of its stores (a Memcached key's
// counter on another server than its head): that store's breaker counts
// it, and the call's own store stays in use.
func TestFailureBlamedOnAnotherStore(t *testing.T) {
	b := newStoresBackend(t)
	th := newThrottler(t, b, &throttler.Options{BreakerThreshold: 2})
	throttler.SetMonotonic(th, (&monoClock{}).Now)
	p := throttler.PerMinute(100)

	b.set("a:split", throttler.StoreFailure("store b", errDown))
	takeN(t, th, "a:split", p, 5)
	assert.Equal(t, 5, b.count("store a"), "store a is not blamed")
	_, src := takeN(t, th, "a:1", p, 1)
	assert.Equal(t, 1, src[throttler.SourcePrimary])
	_, src = takeN(t, th, "b:1", p, 1)
	assert.Equal(t, 1, src[throttler.SourceFailureMode], "store b's breaker opened")
	assert.Zero(t, b.count("store b"))
}

// manyStores names a store per key, which no real backend does: the
// Throttler's map of breakers stays bounded anyway.
type manyStores struct{ *storesBackend }

func (manyStores) Traits() throttler.Traits {
	return throttler.Traits{Store: func(_ throttler.Op, key string, _ throttler.Policy) string { return "store " + key }}
}

func TestBreakersAreBounded(t *testing.T) {
	th := newThrottler(t, manyStores{newStoresBackend(t)}, nil)
	for i := range 3000 {
		_, err := th.Allow(context.Background(), fmt.Sprint(i), throttler.PerMinute(1))
		require.NoError(t, err)
	}
	assert.Equal(t, 1024, throttler.Breakers(th))
}

// BenchmarkBreaker is the healthy path through the breakers: a backend that
// is one store, and one that names its stores (a map lookup per call).
func BenchmarkBreaker(b *testing.B) {
	p := throttler.Policy{Name: "bench", Limit: 1 << 40, Window: time.Hour}
	ctx := context.Background()
	for _, bc := range []struct {
		name string
		b    throttler.Backend
	}{
		{"one store", newMemory(b)},
		{"named stores", namedMemory{newMemory(b)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			th := newThrottler(b, bc.b, nil)
			b.ReportAllocs()
			report := cputime.Measure(b)
			for b.Loop() {
				if _, err := th.Allow(ctx, "a:client", p); err != nil {
					b.Fatal(err)
				}
			}
			report(b.N)
		})
	}
}

// BenchmarkBreakerParallel is the healthy path from every core at once: a
// success must not write a cache line the other cores read.
func BenchmarkBreakerParallel(b *testing.B) {
	p := throttler.Policy{Name: "bench", Limit: 1 << 40, Window: time.Hour}
	th := newThrottler(b, newMemory(b), nil)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			if _, err := th.Allow(ctx, "a:client", p); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// namedMemory is the memory backend naming a store per key prefix, as a
// sharded backend would.
type namedMemory struct{ *memory.Backend }

func (n namedMemory) Traits() throttler.Traits {
	t := n.Backend.Traits()
	t.Store = n.store
	return t
}

func (namedMemory) store(_ throttler.Op, key string, _ throttler.Policy) string {
	if strings.HasPrefix(key, "a:") {
		return "store a"
	}
	return "store b"
}

// Every call in flight fails at once when the store blips, or when this
// process is starved of CPU past every call's deadline: that is one
// failure, not BreakerThreshold of them. The breaker opens only when calls
// made after the run began fail too.
func TestBreakerCallsInFlightFailAsOne(t *testing.T) {
	const inFlight = 16
	for _, stillFailing := range []bool{false, true} {
		t.Run(fmt.Sprint("still failing: ", stillFailing), func(t *testing.T) {
			b := newStoresBackend(t)
			var mono monoClock
			th, err := throttler.New(b, &throttler.Options{BreakerThreshold: 5, Clock: func() time.Time { return t0 }})
			require.NoError(t, err)
			throttler.SetMonotonic(th, mono.Now)
			p := throttler.PerMinute(1000)
			ctx := context.Background()

			b.set("store a", io.ErrUnexpectedEOF)
			gate := make(chan struct{})
			b.inside = make(chan string, inFlight)
			for i := range inFlight {
				b.gates[fmt.Sprint("a:", i)] = gate
			}
			var wg sync.WaitGroup
			for i := range inFlight {
				wg.Add(1)
				go func() {
					defer wg.Done()
					d, err := th.Allow(ctx, fmt.Sprint("a:", i), p)
					assert.NoError(t, err)
					assert.True(t, d.Degraded)
				}()
			}
			for range inFlight {
				<-b.inside
			}
			b.inside = nil
			mono.Add(100 * time.Millisecond) // the calls' deadline passes
			close(gate)
			wg.Wait()

			if !stillFailing {
				b.set("store a", nil)
			}
			for i := range 5 {
				mono.Add(time.Millisecond)
				before := b.count("store a")
				d, err := th.Allow(ctx, "a:next", p)
				require.NoError(t, err)
				reached := b.count("store a") > before
				switch {
				case !stillFailing:
					require.True(t, reached && !d.Degraded, "call %d after the burst: reached %v, Degraded %v", i, reached, d.Degraded)
				case i < 4:
					require.True(t, reached, "failure %d after the burst reaches the store", i+2)
				default:
					require.False(t, reached, "5 failures: the burst's and 4 of calls made after it open the breaker")
				}
			}
		})
	}
}
