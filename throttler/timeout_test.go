package throttler_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/throttler"
)

// starvedCall is the context of a backend call whose caller is starved of
// CPU: its deadline passes when the test closes passed, and the caller,
// when it looks at it (Done), gets the CPU back only when the test closes
// cpu. answered is closed once the caller has its answer.
type starvedCall struct {
	context.Context
	passed, cpu, answered chan struct{}
}

func newStarvedCall(parent context.Context) *starvedCall {
	return &starvedCall{Context: parent, passed: make(chan struct{}), cpu: make(chan struct{}), answered: make(chan struct{})}
}

func (c *starvedCall) Deadline() (time.Time, bool) { return t0, true }
func (c *starvedCall) Done() <-chan struct{}       { <-c.cpu; return c.passed }
func (c *starvedCall) Err() error {
	select {
	case <-c.passed:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// lateStore answers a Take with answer once its hook has run: the hook
// lets the deadline pass while the store works, or holds the answer back.
// It says it ignores its context (Traits.IgnoresContext) when blind.
type lateStore struct {
	stubBackend
	blind  bool
	taking chan struct{} // closed when a Take starts
	hook   func(ctx context.Context)
	takes  atomic.Int64
}

var lateAnswer = throttler.Decision{Allowed: true, Limit: 10, Used: 4, Remaining: 6, ResetAt: t0.Add(time.Minute)}

func (s *lateStore) Take(ctx context.Context, _ string, _ throttler.Policy, _ int64, _ time.Time) (throttler.Decision, error) {
	if s.takes.Add(1) == 1 {
		close(s.taking)
	}
	s.hook(ctx)
	return lateAnswer, nil
}

func (s *lateStore) Traits() throttler.Traits { return throttler.Traits{IgnoresContext: s.blind} }

// TestALateAnswerIsAnAnswer: a store's answer that is there when the
// caller looks is used, even when the Timeout has passed by then (a caller
// starved of CPU looks late): not replaced by the failure mode, and no
// failure toward the breaker. Only a call with no answer yet when the
// caller looks is a timeout. A detached call's caller finds both its
// answer and its deadline ready, and must prefer the answer every time:
// it is run many times, since a select between the two picks at random.
func TestALateAnswerIsAnAnswer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		blind bool // detached: the backend ignores its context
		runs  int
		// the store's work, given the call's context; the test's part
		// after the Take started, given the Throttler.
		store func(c *starvedCall)
		test  func(t *testing.T, th *throttler.Throttler, c *starvedCall)
		late  bool // the answer is there when the caller looks
	}{
		{
			name: "detached, answered before the caller looks", blind: true, runs: 64, late: true,
			store: func(*starvedCall) {},
			test: func(t *testing.T, th *throttler.Throttler, c *starvedCall) {
				waitUntil(t, "the answer is handed over", func() bool { return throttler.DetachedCalls(th) == 0 })
				close(c.passed)
				close(c.cpu)
			},
		},
		{
			name: "detached, no answer when the caller looks", blind: true, runs: 1,
			store: func(c *starvedCall) { <-c.answered }, // the store answers once the caller has given up
			test: func(t *testing.T, th *throttler.Throttler, c *starvedCall) {
				close(c.passed)
				close(c.cpu)
			},
		},
		{
			name: "in the caller's goroutine, answered after the deadline", runs: 1, late: true,
			store: func(c *starvedCall) { close(c.passed); close(c.cpu) },
			test:  func(*testing.T, *throttler.Throttler, *starvedCall) {},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range tc.runs {
				var seen []throttler.Observation
				store := &lateStore{blind: tc.blind, taking: make(chan struct{})}
				th := newThrottler(t, store, &throttler.Options{Clock: func() time.Time { return t0 }, FailClosed: true,
					BreakerThreshold: 1, Observe: func(o throttler.Observation) { seen = append(seen, o) }})
				c := newStarvedCall(context.Background())
				store.hook = func(context.Context) { tc.store(c) }
				throttler.SetCallContext(th, func(ctx context.Context, _ time.Duration) (context.Context, context.CancelFunc) {
					return c, func() {}
				})
				type result struct {
					d   throttler.Decision
					err error
				}
				done := make(chan result, 1)
				go func() {
					d, err := th.Allow(context.Background(), "k", throttler.PerMinute(10))
					done <- result{d, err}
				}()
				receive(t, "the Take", store.taking)
				tc.test(t, th, c)
				r := receive(t, "the Allow", done)
				close(c.answered)
				waitUntil(t, "the detached call ends", func() bool { return throttler.DetachedCalls(th) == 0 })
				require.Len(t, seen, 1)
				if !tc.late {
					require.ErrorIs(t, r.err, throttler.ErrUnavailable, "no answer yet: a timeout, the failure mode")
					assert.ErrorIs(t, seen[0].Err, context.DeadlineExceeded)
					assert.Equal(t, throttler.SourceFailureMode, seen[0].Source)
					continue
				}
				require.NoError(t, r.err, "the answer, not the failure mode")
				r.d.At = time.Time{}
				require.Equal(t, lateAnswer, r.d)
				assert.Equal(t, throttler.SourcePrimary, seen[0].Source)
				assert.NoError(t, seen[0].Err)

				// Not a failure of the store: its breaker (threshold 1) is
				// closed, and the next call asks it.
				throttler.SetCallContext(th, context.WithTimeout)
				store.hook = func(context.Context) {}
				_, err := th.Allow(context.Background(), "k", throttler.PerMinute(10))
				require.NoError(t, err)
				assert.Equal(t, int64(2), store.takes.Load())
			}
		})
	}
}
