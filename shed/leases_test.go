package shed_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

// failOpen and failClosed name the values of throttler.Options.FailClosed.
const failOpen, failClosed = false, true

// leaseStore is a small in-process LeaseBackend by the lease contract of
// throttler/lease.go (the memory backend's leases are built elsewhere), with
// the memory backend for rate limits. It counts the leases held, which the
// tests read.
type leaseStore struct {
	*memory.Backend
	mu     sync.Mutex
	leases map[string]map[throttler.LeaseID]int64 // identity → lease → expiry (Unix ms)
	fail   error                                  // every lease operation fails with it
}

var _ throttler.LeaseBackend = (*leaseStore)(nil)

func newLeaseStore(t testing.TB) *leaseStore {
	t.Helper()
	m, err := memory.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &leaseStore{Backend: m, leases: map[string]map[throttler.LeaseID]int64{}}
}

func identity(key string, p throttler.ConcurrencyPolicy) string {
	if p.Name != "" {
		return p.Name + "\x00" + key
	}
	return p.String() + "\x00" + key
}

// live drops expired leases and returns the key's set.
func (s *leaseStore) live(id string, now int64) map[throttler.LeaseID]int64 {
	set := s.leases[id]
	if set == nil {
		set = map[throttler.LeaseID]int64{}
		s.leases[id] = set
	}
	for l, exp := range set {
		if exp <= now {
			delete(set, l)
		}
	}
	return set
}

func decision(set map[throttler.LeaseID]int64, p throttler.ConcurrencyPolicy, now int64, allowed bool) throttler.Decision {
	used := int64(len(set))
	reset := now + p.TTL.Milliseconds()
	for _, exp := range set {
		reset = min(reset, exp)
	}
	d := throttler.Decision{Allowed: allowed, Limit: p.Limit, Used: used, Remaining: max(p.Limit-used, 0), ResetAt: time.UnixMilli(reset)}
	if !allowed {
		d.RetryAfter = time.Duration(reset-now) * time.Millisecond
	}
	return d
}

func (s *leaseStore) Acquire(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (throttler.Decision, error) {
	if err := throttler.ValidateLease(key, p, id); err != nil {
		return throttler.Decision{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return throttler.Decision{}, s.fail
	}
	ms := now.UnixMilli()
	set := s.live(identity(key, p), ms)
	if _, held := set[id]; !held && int64(len(set)) >= p.Limit {
		return decision(set, p, ms, false), nil
	}
	set[id] = ms + p.TTL.Milliseconds()
	return decision(set, p, ms, true), nil
}

func (s *leaseStore) Release(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (bool, throttler.Decision, error) {
	if err := throttler.ValidateLease(key, p, id); err != nil {
		return false, throttler.Decision{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return false, throttler.Decision{}, s.fail
	}
	ms := now.UnixMilli()
	set := s.live(identity(key, p), ms)
	_, held := set[id]
	delete(set, id)
	return held, decision(set, p, ms, int64(len(set)) < p.Limit), nil
}

// held returns how many leases the named limit holds on key (expired ones
// included: the tests check what was released).
func (s *leaseStore) held(key, name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.leases[name+"\x00"+key])
}

func (s *leaseStore) setFail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = err
}

// newThrottler is a Throttler over b at a fixed instant.
func newThrottler(t testing.TB, b throttler.Backend, mode bool) *throttler.Throttler {
	t.Helper()
	th, err := throttler.New(b, &throttler.Options{Clock: func() time.Time { return t0 }, FailClosed: mode})
	if err != nil {
		t.Fatal(err)
	}
	return th
}

// rateOnly is a backend that holds no leases: its embedded interface hides
// the memory backend's Acquire and Release.
type rateOnly struct{ throttler.Backend }
