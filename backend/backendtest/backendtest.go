// Package backendtest is the conformance suite that every throttler.Backend
// runs, in the spirit of net/http/httptest: the memory backend in its unit
// tests, and Redis, Memcached, the router and the shadow against real
// servers in the integration module.
//
// Run checks rate limits: each algorithm in hand-computed tables, and random
// traces compared call by call with a reference model written from
// docs/algorithms.md; RunLeases checks concurrency limits likewise. Every
// case runs at fixed instants from T0, far from today, so nothing sleeps,
// and uses keys unique to the run, so one server can serve many runs.
package backendtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/throttler"
)

// T0 is the instant the suite's windows open at: years from today, so a
// backend that sets expiry as an absolute time from the application's clock
// (instead of a duration) loses its windows on a real server and fails.
var T0 = time.Date(2031, time.March, 4, 5, 6, 7, 250*int(time.Millisecond), time.UTC)

// Run runs the suite. newBackend is called once per case; it may return
// backends sharing one server, since every case uses keys of its own.
func Run(t *testing.T, newBackend func(t *testing.T) throttler.Backend) {
	t.Helper()
	run := runID()
	cases := []struct {
		name string
		f    func(t *testing.T, b throttler.Backend, key func(string) string)
	}{
		{"Sequences", testSequences},
		{"ResetAtStableInsideWindow", testResetAtStable},
		{"CostAboveLimit", testCostAboveLimit},
		{"IndependentKeysAndPolicies", testIndependent},
		{"UnnamedPoliciesApart", testUnnamedPolicies},
		{"KeysWithAnyBytes", testAnyBytes},
		{"LimitChangeKeepsCount", testLimitChange},
		{"WindowChangeAppliesNextWindow", testWindowChange},
		{"InvalidInput", testInvalidInput},
		{"ExactUnderConcurrency", testConcurrency},
		{"TokenBucket", testTokenBucket},
		{"SlidingLog", testSlidingLog},
		{"SlidingWindow", testSlidingWindow},
		{"AlgorithmsApart", testAlgorithmsApart},
		{"AlgorithmWindowChange", testAlgorithmWindowChange},
		{"AlgorithmsExactUnderConcurrency", testAlgorithmsConcurrent},
		{"RefundReceipts", testRefundReceipts},
		{"DifferentialTraces", testDifferentialTraces},
	}
	cases = append(cases, compositeCases...)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := newBackend(t)
			key := func(s string) string { return run + "/" + t.Name() + "/" + s }
			c.f(t, b, key)
		})
	}
}

func runID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

const (
	take   = throttler.OpTake
	peek   = throttler.OpPeek
	refund = throttler.OpRefund
)

// step is one call at T0+at and what it must answer.
type step struct {
	op          throttler.Op
	at          time.Duration
	cost        int64
	allowed     bool
	used        int64
	resetAt     time.Duration // offset from T0
	description string
}

// checkDecision asserts what every decision must satisfy, whatever the case.
func checkDecision(t *testing.T, p throttler.Policy, d throttler.Decision, now time.Time, msg string) {
	t.Helper()
	assert.Equal(t, p.Limit, d.Limit, "%s: Limit", msg)
	assert.False(t, d.Degraded, "%s: a backend's decision is never degraded", msg)
	assert.GreaterOrEqual(t, d.Used, int64(0), "%s: Used", msg)
	assert.Equal(t, max(0, p.Limit-d.Used), d.Remaining, "%s: Remaining == Limit - Used", msg)
	assert.True(t, d.ResetAt.After(now), "%s: ResetAt %v must be after now %v", msg, d.ResetAt, now)
	assert.False(t, d.ResetAt.After(now.Add(p.Window)), "%s: ResetAt %v beyond now+Window", msg, d.ResetAt)
	if d.Allowed {
		assert.Zero(t, d.RetryAfter, "%s: RetryAfter when allowed", msg)
	} else {
		assert.Equal(t, d.ResetAt.Sub(now), d.RetryAfter, "%s: RetryAfter == ResetAt - now when denied", msg)
	}
}

// runSteps runs steps; a Refund's receipt is the ResetAt of the latest
// admitted Take of steps (T0+Window before any, a Take this key never saw).
func runSteps(t *testing.T, b throttler.Backend, key string, p throttler.Policy, steps []step) {
	t.Helper()
	ctx := context.Background()
	receipt := T0.Add(p.Window)
	for i, s := range steps {
		now := T0.Add(s.at)
		msg := fmt.Sprintf("step %d %v at +%v cost %d", i, s.op, s.at, s.cost)
		if s.description != "" {
			msg += " (" + s.description + ")"
		}
		d, err := backend.Do(ctx, b, s.op, key, p, s.cost, receipt, now)
		require.NoError(t, err, msg)
		if s.op == take && d.Allowed {
			receipt = d.ResetAt
		}
		checkDecision(t, p, d, now, msg)
		assert.Equal(t, s.allowed, d.Allowed, "%s: Allowed", msg)
		assert.Equal(t, s.used, d.Used, "%s: Used", msg)
		assert.Equal(t, T0.Add(s.resetAt).UnixMilli(), d.ResetAt.UnixMilli(), "%s: ResetAt", msg)
	}
}

func testSequences(t *testing.T, b throttler.Backend, key func(string) string) {
	p := throttler.Policy{Name: "seq", Limit: 3, Window: time.Minute}
	const ms = time.Millisecond
	m := time.Minute
	tests := []struct {
		name  string
		steps []step
	}{
		{"window opens at first counted request", []step{
			{op: peek, at: 0, allowed: true, used: 0, resetAt: m, description: "no window: ResetAt is now+Window"},
			{op: peek, at: 10 * time.Second, allowed: true, used: 0, resetAt: 10*time.Second + m, description: "Peek opened nothing"},
			{op: take, at: 20 * time.Second, cost: 1, allowed: true, used: 1, resetAt: 20*time.Second + m},
			{op: take, at: 30 * time.Second, cost: 1, allowed: true, used: 2, resetAt: 20*time.Second + m},
		}},
		{"denied take counts nothing", []step{
			{op: take, at: 0, cost: 1, allowed: true, used: 1, resetAt: m},
			{op: take, at: 1 * ms, cost: 1, allowed: true, used: 2, resetAt: m},
			{op: take, at: 2 * ms, cost: 1, allowed: true, used: 3, resetAt: m},
			{op: take, at: 3 * ms, cost: 1, allowed: false, used: 3, resetAt: m},
			{op: take, at: 4 * ms, cost: 1, allowed: false, used: 3, resetAt: m},
			{op: peek, at: 5 * ms, allowed: false, used: 3, resetAt: m},
		}},
		{"window ends at now == ResetAt", []step{
			{op: take, at: 0, cost: 3, allowed: true, used: 3, resetAt: m},
			{op: take, at: m - ms, cost: 1, allowed: false, used: 3, resetAt: m, description: "last millisecond of the window"},
			{op: peek, at: m, allowed: true, used: 0, resetAt: 2 * m, description: "ended window reads as empty"},
			{op: take, at: m, cost: 1, allowed: true, used: 1, resetAt: 2 * m, description: "new window opens at ResetAt"},
		}},
		{"peek never counts", []step{
			{op: take, at: 0, cost: 1, allowed: true, used: 1, resetAt: m},
			{op: peek, at: 1 * ms, allowed: true, used: 1, resetAt: m},
			{op: peek, at: 2 * ms, allowed: true, used: 1, resetAt: m},
			{op: peek, at: 3 * ms, allowed: true, used: 1, resetAt: m},
			{op: take, at: 4 * ms, cost: 2, allowed: true, used: 3, resetAt: m},
		}},
		{"peek reads an ended window as empty", []step{
			{op: take, at: 0, cost: 2, allowed: true, used: 2, resetAt: m},
			{op: peek, at: m + 5*time.Second, allowed: true, used: 0, resetAt: 2*m + 5*time.Second},
		}},
		{"refund never below zero", []step{
			{op: take, at: 0, cost: 2, allowed: true, used: 2, resetAt: m},
			{op: refund, at: 1 * ms, cost: 1, allowed: true, used: 1, resetAt: m},
			{op: refund, at: 2 * ms, cost: 5, allowed: true, used: 0, resetAt: m},
			{op: peek, at: 3 * ms, allowed: true, used: 0, resetAt: m, description: "the window stays open at zero"},
			{op: take, at: 4 * ms, cost: 3, allowed: true, used: 3, resetAt: m},
		}},
		{"refund frees a unit for a denied caller", []step{
			{op: take, at: 0, cost: 3, allowed: true, used: 3, resetAt: m},
			{op: take, at: 1 * ms, cost: 1, allowed: false, used: 3, resetAt: m},
			{op: refund, at: 2 * ms, cost: 1, allowed: true, used: 2, resetAt: m},
			{op: take, at: 3 * ms, cost: 1, allowed: true, used: 3, resetAt: m},
		}},
		{"refund does nothing to an ended window", []step{
			{op: take, at: 0, cost: 3, allowed: true, used: 3, resetAt: m},
			{op: refund, at: m, cost: 2, allowed: true, used: 0, resetAt: 2 * m},
			{op: take, at: m + ms, cost: 3, allowed: true, used: 3, resetAt: 2*m + ms, description: "the refund opened no window"},
		}},
		{"refund with no window opens nothing", []step{
			{op: refund, at: 0, cost: 1, allowed: true, used: 0, resetAt: m},
			{op: take, at: 10 * time.Second, cost: 1, allowed: true, used: 1, resetAt: 10*time.Second + m},
		}},
		{"cost above one", []step{
			{op: take, at: 0, cost: 2, allowed: true, used: 2, resetAt: m},
			{op: take, at: 1 * ms, cost: 2, allowed: false, used: 2, resetAt: m, description: "2+2 > 3"},
			{op: take, at: 2 * ms, cost: 1, allowed: true, used: 3, resetAt: m, description: "a smaller cost still fits"},
		}},
		{"a new window after a denied one starts from zero", []step{
			{op: take, at: 0, cost: 3, allowed: true, used: 3, resetAt: m},
			{op: take, at: 30 * time.Second, cost: 1, allowed: false, used: 3, resetAt: m},
			{op: take, at: m + 30*time.Second, cost: 3, allowed: true, used: 3, resetAt: 2*m + 30*time.Second},
			{op: take, at: 2*m + 29*time.Second, cost: 1, allowed: false, used: 3, resetAt: 2*m + 30*time.Second},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { runSteps(t, b, key(tc.name), p, tc.steps) })
	}
}

// testResetAtStable is GitHub's wobble: ResetAt must be the stored value, not
// one derived from a TTL, for every call inside a window, across second
// boundaries and between ops.
func testResetAtStable(t *testing.T, b throttler.Backend, key func(string) string) {
	ctx := context.Background()
	p := throttler.Policy{Name: "wobble", Limit: 1000, Window: 10 * time.Second}
	k := key("k")
	want := T0.Add(p.Window).UnixMilli()
	for i := 0; i < 200; i++ {
		now := T0.Add(time.Duration(i) * 49 * time.Millisecond) // crosses second boundaries at uneven offsets
		o := []throttler.Op{take, peek, refund}[i%3]
		d, err := backend.Do(ctx, b, o, k, p, 1, T0.Add(p.Window), now)
		require.NoError(t, err)
		require.Equal(t, want, d.ResetAt.UnixMilli(), "call %d (%v) at +%v", i, o, now.Sub(T0))
	}
}

func testCostAboveLimit(t *testing.T, b throttler.Backend, key func(string) string) {
	// A Take above the capacity could never be admitted: an input error,
	// with no window opened and nothing counted, whatever the state.
	ctx := context.Background()
	p := throttler.Policy{Name: "big", Limit: 5, Window: time.Minute}
	k := key("k")
	_, err := b.Take(ctx, k, p, 6, T0)
	require.ErrorIs(t, err, throttler.ErrInvalidCost, "cost > Limit with no window")
	runSteps(t, b, k, p, []step{
		{op: peek, at: 0, cost: 1, allowed: true, used: 0, resetAt: time.Minute, description: "the refused Take opened no window"},
		{op: take, at: time.Second, cost: 5, allowed: true, used: 5, resetAt: time.Second + time.Minute},
	})
	_, err = b.Take(ctx, k, p, 6, T0.Add(2*time.Second))
	require.ErrorIs(t, err, throttler.ErrInvalidCost, "cost > Limit in an open window")
	d, err := b.Refund(ctx, k, p, throttler.MaxLimit, T0.Add(time.Second+time.Minute), T0.Add(3*time.Second))
	require.NoError(t, err)
	assert.Equal(t, throttler.Decision{Allowed: true, Limit: 5, Remaining: 5, ResetAt: T0.Add(time.Second + time.Minute)},
		throttler.Decision{Allowed: d.Allowed, Limit: d.Limit, Used: d.Used, Remaining: d.Remaining, ResetAt: time.UnixMilli(d.ResetAt.UnixMilli()).UTC()},
		"a Refund above the limit clamps to zero")
}

func testIndependent(t *testing.T, b throttler.Backend, key func(string) string) {
	ctx := context.Background()
	a := throttler.Policy{Name: "a", Limit: 2, Window: time.Minute}
	bp := throttler.Policy{Name: "b", Limit: 2, Window: time.Minute}
	unnamed := throttler.Policy{Limit: 2, Window: time.Minute}
	k1, k2 := key("one"), key("two")
	for _, c := range []struct {
		key string
		p   throttler.Policy
	}{{k1, a}, {k1, bp}, {k2, a}, {k1, unnamed}} {
		for i := int64(1); i <= 2; i++ {
			d, err := b.Take(ctx, c.key, c.p, 1, T0)
			require.NoError(t, err)
			require.True(t, d.Allowed, "%s under %q: take %d", c.key, c.p.Name, i)
			require.Equal(t, i, d.Used, "%s under %q shares a window with another pair", c.key, c.p.Name)
		}
		d, err := b.Take(ctx, c.key, c.p, 1, T0)
		require.NoError(t, err)
		require.False(t, d.Allowed)
	}
	// Names that would collide under naive concatenation stay apart.
	x := throttler.Policy{Name: "x", Limit: 1, Window: time.Minute}
	xy := throttler.Policy{Name: "x:y", Limit: 1, Window: time.Minute}
	d, err := b.Take(ctx, "y:"+key("z"), x, 1, T0)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	d, err = b.Take(ctx, key("z"), xy, 1, T0)
	require.NoError(t, err)
	require.True(t, d.Allowed, `("x", "y:k") and ("x:y", "k") must be different windows`)
}

// testUnnamedPolicies: an unnamed policy's identity is its definition, so
// two different unnamed policies on one key never share a window (the
// hourly limit of 3 must not be spent by a per-minute limit of 2), while
// the same definition is the same limit wherever it is written.
func testUnnamedPolicies(t *testing.T, b throttler.Backend, key func(string) string) {
	ctx := context.Background()
	k := key("k")
	hourly, perMinute := throttler.PerHour(3), throttler.PerMinute(2)
	for i := int64(1); i <= 2; i++ {
		d, err := b.Take(ctx, k, perMinute, 1, T0)
		require.NoError(t, err)
		require.Equal(t, i, d.Used, "per-minute take %d", i)
	}
	d, err := b.Peek(ctx, k, hourly, T0)
	require.NoError(t, err)
	assert.Zero(t, d.Used, "PerHour(3) must not see PerMinute(2)'s count")
	for i := int64(1); i <= 3; i++ {
		d, err := b.Take(ctx, k, hourly, 1, T0.Add(time.Second))
		require.NoError(t, err)
		require.True(t, d.Allowed, "hourly take %d", i)
		require.Equal(t, i, d.Used)
	}
	d, err = b.Take(ctx, k, throttler.Policy{Limit: 3, Window: time.Hour}, 1, T0.Add(2*time.Second))
	require.NoError(t, err)
	assert.False(t, d.Allowed, "the same definition written out is the same limit")
	// Same limit and window, one named: two limits.
	d, err = b.Take(ctx, k, hourly.Named("hourly"), 1, T0.Add(2*time.Second))
	require.NoError(t, err)
	assert.Equal(t, int64(1), d.Used, "a named policy never shares an unnamed one's window")
}

func testAnyBytes(t *testing.T, b throttler.Backend, key func(string) string) {
	ctx := context.Background()
	p := throttler.Policy{Name: "bytes", Limit: 2, Window: time.Minute}
	long := strings.Repeat("k", 1024)
	keys := []string{
		"with space", "new\nline", "tab\tand\r\n", "nul\x00byte", "ünïcødé ключ 鍵 🔑",
		"{braces}", "{", "}", "a:b:c", "%2F/..", "\xff\xfe invalid utf-8",
		long, long + "x", strings.Repeat("é", 512),
	}
	seen := map[string]bool{}
	for _, raw := range keys {
		k := key("") + raw
		require.False(t, seen[k])
		seen[k] = true
		d, err := b.Take(ctx, k, p, 2, T0)
		require.NoError(t, err, "key %q", raw)
		require.True(t, d.Allowed, "key %q got a window another key used", raw)
		d, err = b.Take(ctx, k, p, 1, T0.Add(time.Millisecond))
		require.NoError(t, err, "key %q", raw)
		require.False(t, d.Allowed, "key %q: its window was not kept", raw)
		d, err = b.Peek(ctx, k, p, T0.Add(2*time.Millisecond))
		require.NoError(t, err, "key %q", raw)
		require.Equal(t, int64(2), d.Used, "key %q", raw)
	}
	d, err := b.Take(ctx, key("")+strings.Repeat("k", throttler.MaxKeyLen-len(key(""))), p, 1, T0)
	require.NoError(t, err, "a key of MaxKeyLen bytes")
	require.True(t, d.Allowed)
}

func testLimitChange(t *testing.T, b throttler.Backend, key func(string) string) {
	ctx := context.Background()
	k := key("k")
	p := throttler.Policy{Name: "change", Limit: 5, Window: time.Minute}
	d, err := b.Take(ctx, k, p, 4, T0)
	require.NoError(t, err)
	require.True(t, d.Allowed)

	lower := p
	lower.Limit = 3
	d, err = b.Take(ctx, k, lower, 1, T0.Add(time.Second))
	require.NoError(t, err)
	assert.False(t, d.Allowed, "a lowered limit applies to the open window")
	assert.Equal(t, int64(4), d.Used, "the open window keeps its count")
	assert.Equal(t, int64(0), d.Remaining, "Remaining never below zero")
	assert.Equal(t, int64(3), d.Limit)

	higher := p
	higher.Limit = 10
	d, err = b.Take(ctx, k, higher, 6, T0.Add(2*time.Second))
	require.NoError(t, err)
	assert.True(t, d.Allowed, "a raised limit applies to the open window")
	assert.Equal(t, int64(10), d.Used)
	assert.Equal(t, T0.Add(time.Minute).UnixMilli(), d.ResetAt.UnixMilli())
}

func testWindowChange(t *testing.T, b throttler.Backend, key func(string) string) {
	ctx := context.Background()
	k := key("k")
	p := throttler.Policy{Name: "window", Limit: 5, Window: time.Minute}
	_, err := b.Take(ctx, k, p, 1, T0)
	require.NoError(t, err)

	longer := p
	longer.Window = time.Hour
	d, err := b.Take(ctx, k, longer, 1, T0.Add(time.Second))
	require.NoError(t, err)
	assert.Equal(t, int64(2), d.Used)
	assert.Equal(t, T0.Add(time.Minute).UnixMilli(), d.ResetAt.UnixMilli(), "the open window keeps its ResetAt")

	d, err = b.Take(ctx, k, longer, 1, T0.Add(time.Minute))
	require.NoError(t, err)
	assert.Equal(t, int64(1), d.Used)
	assert.Equal(t, T0.Add(time.Minute+time.Hour).UnixMilli(), d.ResetAt.UnixMilli(), "the next window has the new length")
}

func testInvalidInput(t *testing.T, b throttler.Backend, key func(string) string) {
	ctx := context.Background()
	good := throttler.Policy{Name: "ok", Limit: 1, Window: time.Second}
	tests := []struct {
		name string
		key  string
		p    throttler.Policy
		cost int64
		want error
	}{
		{"empty key", "", good, 1, throttler.ErrInvalidKey},
		{"key too long", strings.Repeat("k", throttler.MaxKeyLen+1), good, 1, throttler.ErrInvalidKey},
		{"zero cost", key("k"), good, 0, throttler.ErrInvalidCost},
		{"negative cost", key("k"), good, -1, throttler.ErrInvalidCost},
		{"cost above MaxLimit", key("k"), good, throttler.MaxLimit + 1, throttler.ErrInvalidCost},
		{"unknown op", key("k"), good, 1, backend.ErrUnknownOp},
		{"limit above MaxLimit", key("k"), throttler.Policy{Limit: throttler.MaxLimit + 1, Window: time.Second}, 1, throttler.ErrInvalidPolicy},
		{"zero limit", key("k"), throttler.Policy{Limit: 0, Window: time.Second}, 1, throttler.ErrInvalidPolicy},
		{"negative limit", key("k"), throttler.Policy{Limit: -5, Window: time.Second}, 1, throttler.ErrInvalidPolicy},
		{"zero window", key("k"), throttler.Policy{Limit: 1}, 1, throttler.ErrInvalidPolicy},
		{"negative window", key("k"), throttler.Policy{Limit: 1, Window: -time.Second}, 1, throttler.ErrInvalidPolicy},
		{"name with space", key("k"), throttler.Policy{Name: "a b", Limit: 1, Window: time.Second}, 1, throttler.ErrInvalidPolicy},
		{"zero receipt", key("k"), good, 1, throttler.ErrInvalidReceipt},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ops, receipt := []throttler.Op{take, peek, refund}, T0.Add(time.Second)
			switch tc.want {
			case backend.ErrUnknownOp:
				ops = []throttler.Op{0, refund + 1}
			case throttler.ErrInvalidReceipt:
				ops, receipt = []throttler.Op{refund}, time.Time{}
			}
			for _, o := range ops {
				if o == peek && tc.want == throttler.ErrInvalidCost {
					continue // Peek takes no cost
				}
				_, err := backend.Do(ctx, b, o, tc.key, tc.p, tc.cost, receipt, T0)
				require.Error(t, err, "%v", o)
				assert.True(t, errors.Is(err, tc.want), "%v: %v is not %v", o, err, tc.want)
			}
		})
	}
}

// testConcurrency: 64 goroutines race on one key; exactly Limit units are
// admitted, never one more, and every admitted call sees the same ResetAt.
func testConcurrency(t *testing.T, b throttler.Backend, key func(string) string) {
	const goroutines, perGoroutine = 64, 4
	p := throttler.Policy{Name: "race", Limit: 100, Window: time.Minute}
	k := key("hot")
	ctx := context.Background()
	var admitted atomic.Int64
	var mu sync.Mutex
	resets := map[int64]int{}
	errs := make(chan error, goroutines*perGoroutine)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			<-start
			for i := 0; i < perGoroutine; i++ {
				now := T0.Add(time.Duration(g*perGoroutine+i) * time.Millisecond)
				d, err := b.Take(ctx, k, p, 1, now)
				if err != nil {
					errs <- err
					continue
				}
				if d.Allowed {
					admitted.Add(1)
					mu.Lock()
					resets[d.ResetAt.UnixMilli()]++
					mu.Unlock()
				}
			}
		}(g)
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Take: %v", err)
	}
	assert.Equal(t, p.Limit, admitted.Load(), "admitted")
	assert.Len(t, resets, 1, "every admitted call sees one ResetAt: %v", resets)
	d, err := b.Peek(ctx, k, p, T0.Add(time.Second))
	require.NoError(t, err)
	assert.Equal(t, p.Limit, d.Used)
}
