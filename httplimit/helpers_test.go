package httplimit_test

import (
	"context"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

var t0 = time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)

// stubBackend answers every call with err (or delegates to next when err is
// nil) and counts the calls.
type stubBackend struct {
	mu    sync.Mutex
	err   error
	next  throttler.Backend
	calls int
}

func (s *stubBackend) do(f func() (throttler.Decision, error)) (throttler.Decision, error) {
	s.mu.Lock()
	s.calls++
	err := s.err
	s.mu.Unlock()
	if err != nil {
		return throttler.Decision{}, err
	}
	return f()
}

func (s *stubBackend) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	return s.do(func() (throttler.Decision, error) { return s.next.Take(ctx, key, p, cost, now) })
}

func (s *stubBackend) Peek(ctx context.Context, key string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	return s.do(func() (throttler.Decision, error) { return s.next.Peek(ctx, key, p, now) })
}

func (s *stubBackend) Refund(ctx context.Context, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
	return s.do(func() (throttler.Decision, error) { return s.next.Refund(ctx, key, p, cost, receipt, now) })
}

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

// netLeases is the memory backend's leases as a network store holds them:
// not in process (so the Throttler gives its calls the Timeout's context),
// failing every lease call whose context is done (or with failWith, when
// set). It counts the releases that reached it, and whether the last one's
// context had a deadline.
type netLeases struct {
	throttler.Backend // rate calls: the memory backend's, its InProcess hidden
	m                 *memory.Backend
	mu                sync.Mutex
	releases          int
	bounded           bool
	failWith          error
}

var _ throttler.LeaseBackend = (*netLeases)(nil)

func newNetLeases(t testing.TB) *netLeases {
	m := newMemory(t)
	return &netLeases{Backend: m, m: m}
}

func (s *netLeases) fail(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failWith != nil {
		return s.failWith
	}
	return ctx.Err()
}

func (s *netLeases) setFail(err error) { s.mu.Lock(); s.failWith = err; s.mu.Unlock() }

func (s *netLeases) Acquire(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (throttler.Decision, error) {
	if err := s.fail(ctx); err != nil {
		return throttler.Decision{}, err
	}
	return s.m.Acquire(ctx, key, p, id, now)
}

func (s *netLeases) Release(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (bool, throttler.Decision, error) {
	s.mu.Lock()
	s.releases++
	_, s.bounded = ctx.Deadline()
	s.mu.Unlock()
	if err := s.fail(ctx); err != nil {
		return false, throttler.Decision{}, err
	}
	return s.m.Release(ctx, key, p, id, now)
}

// rateOnly is a backend that holds no leases: its embedded interface hides
// the memory backend's Acquire and Release.
type rateOnly struct{ throttler.Backend }
