package throttler_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/internal/sleep"
	"github.com/throttlekit/throttlekit/throttler"
)

func TestCompositeValidate(t *testing.T) {
	s, h := throttler.PerSecond(1).Named("login-s"), throttler.PerHour(100).Named("login-h")
	for _, tt := range []struct {
		name string
		p    throttler.Policy
		ok   bool
	}{
		{"two named policies", throttler.All(s, h), true},
		{"four, every algorithm", throttler.All(s, h.WithAlgorithm(throttler.TokenBucket), h.WithAlgorithm(throttler.SlidingLog),
			h.WithAlgorithm(throttler.SlidingWindow)), true},
		{"two unnamed policies of different definitions", throttler.All(throttler.PerSecond(1), throttler.PerSecond(2)), true},
		{"five", throttler.All(s, h, s.Named("a"), s.Named("b"), s.Named("c")), false},
		{"none", throttler.All(), false},
		{"one name, one algorithm, twice", throttler.All(s, throttler.PerMinute(7).Named("login-s")), false},
		{"one unnamed definition twice", throttler.All(throttler.PerSecond(1), throttler.PerSecond(1), h), false},
		{"nested", throttler.All(throttler.All(s, h), throttler.PerMinute(1)), false},
		{"an invalid member", throttler.All(s, throttler.PerHour(0)), false},
		{"a name on the composite", throttler.All(s, h).Named("login"), false},
		{"an algorithm on the composite", throttler.All(s, h).WithAlgorithm(throttler.SlidingLog), false},
	} {
		err := tt.p.Validate()
		if tt.ok {
			assert.NoError(t, err, tt.name)
		} else {
			assert.ErrorIs(t, err, throttler.ErrInvalidPolicy, tt.name)
		}
	}
	assert.Equal(t, s, throttler.All(s), "All of one policy is that policy")
	c := throttler.All(s, h)
	copied := c
	assert.True(t, copied == c, "copies of one composite compare equal")
	assert.False(t, c == throttler.All(s, h), "composites built apart do not")
	assert.Equal(t, "all(login-s: 1 per 1s; login-h: 100 per 1h0m0s)", c.String())
	assert.Equal(t, int64(1), c.Capacity(), "the least member's capacity")
	assert.ErrorIs(t, throttler.ValidateCall(throttler.OpTake, "k", c, 2, time.Time{}), throttler.ErrInvalidCost)
	assert.ErrorIs(t, throttler.ValidateCall(throttler.OpRefund, "k", c, 1, t0), throttler.ErrInvalidPolicy,
		"a composite is refunded member by member")
}

// TestCombine: the composite Decision's fields by the contract's rules,
// and the binding member, ties included.
func TestCombine(t *testing.T) {
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	ok := func(limit, used int64, reset int) throttler.Decision {
		return throttler.Decision{Allowed: true, Limit: limit, Used: used, Remaining: max(0, limit-used), ResetAt: at(reset)}
	}
	no := func(limit, used int64, reset int, retry time.Duration) throttler.Decision {
		d := ok(limit, used, reset)
		d.Allowed, d.RetryAfter = false, retry
		return d
	}
	for _, tt := range []struct {
		name    string
		members []throttler.Decision
		binding int
		want    throttler.Decision
	}{
		{"admitted: the least Remaining binds", []throttler.Decision{ok(10, 2, 1), ok(100, 95, 3600)}, 1,
			ok(100, 95, 3600)},
		{"admitted, tied Remaining: the latest ResetAt", []throttler.Decision{ok(1, 1, 1), ok(5, 5, 60), ok(2, 2, 30)}, 1,
			ok(5, 5, 60)},
		{"admitted, tied throughout: the first", []throttler.Decision{ok(3, 1, 9), ok(4, 2, 9)}, 0, ok(3, 1, 9)},
		{"denied: the longest RetryAfter among the denying; Remaining the least of all",
			[]throttler.Decision{no(5, 5, 1, time.Second), ok(10, 9, 60), no(3, 3, 30, 30*time.Second)}, 2,
			throttler.Decision{Limit: 3, Used: 3, Remaining: 0, ResetAt: at(30), RetryAfter: 30 * time.Second}},
		{"denied while an admitting member has less left", []throttler.Decision{ok(10, 10, 5), no(6, 4, 50, 50*time.Second)}, 1,
			throttler.Decision{Limit: 6, Used: 4, Remaining: 0, ResetAt: at(50), RetryAfter: 50 * time.Second}},
		{"denied, tied RetryAfter: the latest ResetAt", []throttler.Decision{no(1, 1, 5, 5*time.Second), no(2, 2, 9, 5*time.Second)}, 1,
			throttler.Decision{Limit: 2, Used: 2, ResetAt: at(9), RetryAfter: 5 * time.Second}},
	} {
		d := throttler.Combine(tt.members)
		assert.Equal(t, tt.binding, d.Binding(), tt.name)
		got := throttler.Decision{Allowed: d.Allowed, Limit: d.Limit, Used: d.Used, Remaining: d.Remaining,
			ResetAt: d.ResetAt, RetryAfter: d.RetryAfter, Degraded: d.Degraded}
		assert.Equal(t, tt.want, got, tt.name)
		var ms []throttler.Decision
		for _, m := range d.Members() {
			m.ResetAt = m.ResetAt.UTC()
			ms = append(ms, m)
		}
		assert.Equal(t, tt.members, ms, "%s: the members' Decisions, kept", tt.name)
	}
	assert.Equal(t, throttler.Decision{}, throttler.Combine(nil))
	assert.Equal(t, -1, ok(1, 1, 1).Binding(), "a single policy's Decision has no binding member")
}

// noComposites is a store that takes composites in no call.
type noComposites struct{ throttler.Backend }

// TestCompositeOnABackendWithoutThem: an input error, before any store
// call, whatever the failure mode; the fallback must take them too.
func TestCompositeOnABackendWithoutThem(t *testing.T) {
	ctx := context.Background()
	c := throttler.All(throttler.PerSecond(1).Named("a"), throttler.PerHour(9).Named("b"))
	stub := &stubBackend{next: newMemory(t)}
	var seen []error
	observe := func(o throttler.Observation) { seen = append(seen, o.Err) }
	for _, th := range []*throttler.Throttler{
		newThrottler(t, stub, &throttler.Options{Observe: observe}), // fails open by default
		newThrottler(t, newMemory(t), &throttler.Options{Fallback: noComposites{newMemory(t)}, Observe: observe}),
	} {
		assert.False(t, th.SupportsComposites())
		for _, call := range []func() (throttler.Decision, error){
			func() (throttler.Decision, error) { return th.Allow(ctx, "k", c) },
			func() (throttler.Decision, error) { return th.Peek(ctx, "k", c) },
			func() (throttler.Decision, error) { return th.Wait(ctx, "k", c) },
		} {
			d, err := call()
			assert.ErrorIs(t, err, throttler.ErrInvalidPolicy)
			assert.True(t, throttler.IsInputError(err))
			assert.False(t, d.Allowed, "never fails open")
		}
	}
	assert.Zero(t, stub.count(), "no store call")
	require.NotEmpty(t, seen)
	assert.ErrorIs(t, seen[0], throttler.ErrInvalidPolicy, "observed")
	assert.True(t, newThrottler(t, newMemory(t), &throttler.Options{Fallback: newMemory(t)}).SupportsComposites())
}

// TestCompositeThroughAThrottler: Allow, Wait and Refund of a composite over
// the memory backend; a Refund goes back to each member under its own
// receipt, and a denied composite's Decision refunds nothing.
func TestCompositeThroughAThrottler(t *testing.T) {
	ctx := context.Background()
	clock := sleep.NewFake(t0)
	s, h := throttler.PerSecond(2).Named("s"), throttler.PerHour(3).Named("h")
	c := throttler.All(s, h)
	th := newThrottler(t, newMemory(t), &throttler.Options{Clock: clock.Now})
	require.True(t, th.SupportsComposites())
	first, err := th.AllowN(ctx, "k", c, 2)
	require.NoError(t, err)
	require.True(t, first.Allowed)
	clock.Add(500 * time.Millisecond)
	denied, err := th.Allow(ctx, "k", c)
	require.NoError(t, err)
	require.False(t, denied.Allowed)
	assert.Equal(t, 500*time.Millisecond, denied.RetryAfter, "the second's window binds")
	_, err = th.Refund(ctx, "k", c, 1, denied)
	assert.ErrorIs(t, err, throttler.ErrNotRefunded, "a denied composite counted nothing")
	// The second's window ends at 1s, the hour's at 1h: at 1s only the hour
	// still holds the first Take's units.
	clock.Add(500 * time.Millisecond)
	r, err := th.Refund(ctx, "k", c, 2, first)
	require.NoError(t, err)
	var used []int64
	for _, m := range r.Members() {
		used = append(used, m.Used)
	}
	assert.Equal(t, []int64{0, 0}, used, "the second's window ended (nothing to refund), the hour got its 2 back")
	hour, err := th.Peek(ctx, "k", h)
	require.NoError(t, err)
	assert.Zero(t, hour.Used)
	_, err = th.Refund(ctx, "k", c, 2, first)
	assert.NoError(t, err, "the hour's window is open and its count clamps at zero")
	clock.Add(time.Hour)
	_, err = th.Refund(ctx, "k", c, 2, first)
	assert.ErrorIs(t, err, throttler.ErrNotRefunded, "every member's window has ended")
	w, err := th.WaitN(ctx, "k", c, 2)
	require.NoError(t, err)
	assert.True(t, w.Allowed)
}

// compositeStub is a stubBackend that says it takes composites.
type compositeStub struct{ *stubBackend }

func (compositeStub) Traits() throttler.Traits { return throttler.Traits{Composites: true} }

// TestCompositeFallback: while the primary fails, the fallback answers a
// composite, its Decision and each member's marked Degraded.
func TestCompositeFallback(t *testing.T) {
	stub := &stubBackend{err: errDown}
	th := newThrottler(t, compositeStub{stub}, &throttler.Options{Fallback: newMemory(t)})
	d, err := th.Allow(context.Background(), "k", throttler.All(throttler.PerSecond(1).Named("a"), throttler.PerHour(9).Named("b")))
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	assert.True(t, d.Degraded)
	n := 0
	for _, m := range d.Members() {
		assert.True(t, m.Degraded)
		n++
	}
	assert.Equal(t, 2, n)
	assert.False(t, errors.Is(err, throttler.ErrUnavailable))
}
