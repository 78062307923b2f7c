package throttler_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/sleep"
	"github.com/throttlekit/throttlekit/throttler"
)

// countingClock is a clock at a fixed instant that counts its readings.
type countingClock struct {
	now   time.Time
	reads atomic.Int64
}

func (c *countingClock) Now() time.Time { c.reads.Add(1); return c.now }

// TestDecisionAtIsTheCallsClockReading: every Decision a call returns
// carries the one instant the Throttler read for it, whichever part of the
// Throttler answered, so that a caller (the HTTP edge) computes from the
// same instant the store decided at without reading a clock of its own.
func TestDecisionAtIsTheCallsClockReading(t *testing.T) {
	ctx := context.Background()
	p := throttler.PerMinute(5)
	conc := throttler.Concurrent(2, time.Minute)
	store := func(t *testing.T) throttler.Backend {
		m, err := memory.New(nil)
		require.NoError(t, err)
		return m
	}
	down := func(t *testing.T) throttler.Backend { return &stubBackend{err: errDown} }
	tests := []struct {
		name    string
		backend func(*testing.T) throttler.Backend
		opts    throttler.Options
		call    func(th *throttler.Throttler) (throttler.Decision, error)
		wantErr bool
	}{
		{name: "Allow", backend: store, call: func(th *throttler.Throttler) (throttler.Decision, error) {
			return th.Allow(ctx, "k", p)
		}},
		{name: "AllowN", backend: store, call: func(th *throttler.Throttler) (throttler.Decision, error) {
			return th.AllowN(ctx, "k", p, 3)
		}},
		{name: "Peek", backend: store, call: func(th *throttler.Throttler) (throttler.Decision, error) {
			return th.Peek(ctx, "k", p)
		}},
		{name: "Wait", backend: store, call: func(th *throttler.Throttler) (throttler.Decision, error) {
			return th.Wait(ctx, "k", p)
		}},
		{name: "Acquire", backend: store, call: func(th *throttler.Throttler) (throttler.Decision, error) {
			_, d, err := th.Acquire(ctx, "k", conc)
			return d, err
		}},
		{name: "fallback", backend: down, opts: throttler.Options{Fallback: store(t)},
			call: func(th *throttler.Throttler) (throttler.Decision, error) { return th.Allow(ctx, "k", p) }},
		{name: "fail open", backend: down, opts: throttler.Options{FailClosed: false},
			call: func(th *throttler.Throttler) (throttler.Decision, error) { return th.Allow(ctx, "k", p) }},
		{name: "fail closed", backend: down, opts: throttler.Options{FailClosed: true}, wantErr: true,
			call: func(th *throttler.Throttler) (throttler.Decision, error) { return th.Allow(ctx, "k", p) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := &countingClock{now: t0.Add(1234567 * time.Microsecond)}
			opts := tc.opts
			opts.Clock = clock.Now
			th := newThrottler(t, tc.backend(t), &opts)
			d, err := tc.call(th)
			if tc.wantErr {
				require.ErrorIs(t, err, throttler.ErrUnavailable)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, clock.now, d.At)
			assert.Equal(t, int64(1), clock.reads.Load(), "one reading of the clock per call")
		})
	}
}

// TestRefundDecisionAt: a Refund's Decision carries the Refund's instant,
// not the Take's.
func TestRefundDecisionAt(t *testing.T) {
	ctx := context.Background()
	m, err := memory.New(nil)
	require.NoError(t, err)
	clock := sleep.NewFake(t0)
	th := newThrottler(t, m, &throttler.Options{Clock: clock.Now})
	p := throttler.PerMinute(5)
	taken, err := th.Allow(ctx, "k", p)
	require.NoError(t, err)
	assert.Equal(t, t0, taken.At)
	clock.Add(1500 * time.Millisecond)
	d, err := th.Refund(ctx, "k", p, 1, taken)
	require.NoError(t, err)
	assert.Equal(t, t0.Add(1500*time.Millisecond), d.At)
	assert.Equal(t, int64(0), d.Used, "the unit went back")
}

func TestDecisionAtOfAThrottlerNewDidNotBuild(t *testing.T) {
	d, err := new(throttler.Throttler).Allow(context.Background(), "k", throttler.PerMinute(1))
	require.Error(t, err)
	assert.Zero(t, d.At)
}
