package memcached

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/throttlekit/throttlekit/internal/algo"
	"github.com/throttlekit/throttlekit/throttler"
)

// Token bucket, sliding log and sliding-window counter.
//
// Each (policy, key) pair of these algorithms is one item, <prefix> "s:"
// <id> (see keys.go; the identity includes the algorithm, so the kinds
// never meet), holding the encoded state (state.go). A call is
//
//  1. gets the item (missing: no state);
//  2. compute with algo.TokenBucket, Counter or Log at now;
//  3. if they say write: cas the new state over the version read, or add it
//     when there was none. Losing (another process wrote first) starts
//     again at 1, at most MaxAttempts times, then ErrContention: never an
//     answer computed from a state that was not the latest.
//
// A Peek, a denied Take and a Refund that changes nothing are one round
// trip (gets); an admitted Take is two.
//
// Callers of one Backend on one pair take turns (a lock per state item
// in use), so a cas loses only to another process, not to a goroutine of
// this one: 64 goroutines on one key then make about no retries instead
// of exhausting MaxAttempts. Between lost rounds the call waits a random
// moment, growing with the attempts, so that processes on one key spread
// out instead of colliding again.
//
// The item expires a little after the state stops mattering (TokenBucketEnd,
// CounterEnd, LogEnd), with the same relative exptime, margin and 30-day
// rule as the fixed-window items: a state that ended reads, before it
// expires, exactly like no state.

// state is the pair's item kind for the algorithms other than FixedWindow.
func (k itemKeys) state() string { return k.prefix + "s:" + k.id }

// contentionBackoff is the least bound of the first wait after a lost cas
// (see backoff); no wait is longer than maxContentionBackoff.
const (
	contentionBackoff    = 100 * time.Microsecond
	maxContentionBackoff = 10 * time.Millisecond
)

// apply runs op (validated) under p's algorithm on the pair's state item.
func (b *Backend) apply(ctx context.Context, op throttler.Op, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
	k := newItemKeys(b.opts.Prefix, p, key)
	var d throttler.Decision
	err := b.update(ctx, k.state(), k.id, "state", b.opts.MaxAttempts, now, nil, func(it *memcache.Item) (value []byte, end int64, write bool, err error) {
		d, value, end, write, err = compute(p, it, op, cost, receipt.UnixMilli(), now.UnixMilli())
		return value, end, write, err
	})
	return d, err
}

// step computes, from the item read (nil: none), the value to write, the
// Unix ms after which it stops mattering (its exptime), and whether to
// write it at all. A value that does not decode is errDecode.
type step func(it *memcache.Item) (value []byte, end int64, write bool, err error)

// update is the read-modify-write of one item (ik, of the pair id) shared
// by the state items and the lease items: gets, step, then cas over the
// version read (add when there was none), from the top again when another
// process wrote first, at most attempts rounds, then ErrContention.
// what names the item in errors. The step's last run is the one whose
// value was written, or whose read needed no write. read, when not nil, is
// the item as a call read it a moment ago (its Item nil: missing): the first
// round starts from it instead of a gets, and a cas that finds the item
// changed since starts again with a gets.
func (b *Backend) update(ctx context.Context, ik, id, what string, attempts int, now time.Time, read *readItem, f step) error {
	unlock, err := b.locks.lock(ctx, ik)
	if err != nil {
		return err
	}
	defer unlock()
	var round time.Duration // how long the last lost round took
	for attempt := 0; attempt < attempts; attempt++ {
		if attempt > 0 {
			if err := backoff(ctx, attempt, round); err != nil {
				return err
			}
		}
		began := time.Now()
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("memcached: %w", err)
		}
		var it *memcache.Item
		var err error
		if attempt == 0 && read != nil {
			if it = read.Item; it == nil {
				err = memcache.ErrCacheMiss
			}
		} else {
			it, err = b.c.Get(ik)
		}
		switch {
		case errors.Is(err, memcache.ErrCacheMiss):
			it = nil
		case err != nil:
			return fmt.Errorf("memcached: get %s of %q: %w", what, id, err)
		case it == nil:
			return fmt.Errorf("memcached: get %s of %q: %w: no item and no error", what, id, ErrBadItem)
		}
		value, end, write, err := f(it)
		if errors.Is(err, errDecode) {
			return fmt.Errorf("memcached: %s of %q (%d bytes): %w", what, id, len(it.Value), ErrBadItem)
		}
		if err != nil || !write {
			return err
		}
		next := &memcache.Item{Key: ik, Value: value, Expiration: exptime(end, now, b.opts.ExpiryMargin)}
		if it == nil {
			err = b.c.Add(next)
		} else {
			next.CasID = it.CasID
			err = b.c.CompareAndSwap(next)
		}
		switch {
		case err == nil:
			return nil
		case errors.Is(err, memcache.ErrNotStored), errors.Is(err, memcache.ErrCASConflict), errors.Is(err, memcache.ErrCacheMiss):
			// Another process wrote (or the item expired) since the gets.
			round = time.Since(began)
		default:
			return fmt.Errorf("memcached: write %s of %q: %w", what, id, err)
		}
	}
	return fmt.Errorf("%w: %s of %q changed under each of %d attempts", ErrContention, what, id, attempts)
}

// readItem is an item read ahead of an update (see update); a nil Item is
// a missing one.
type readItem struct{ *memcache.Item }

// compute decodes the stored state (it nil: none), applies op at t with
// the arithmetic of internal/algo, and returns the decision, the encoded
// next state and its end when it must be written. An item that does not
// decode is errDecode. r is a Refund's receipt in Unix ms.
func compute(p throttler.Policy, it *memcache.Item, op throttler.Op, cost, r, t int64) (d throttler.Decision, value []byte, end int64, write bool, err error) {
	var stored []byte
	if it != nil {
		stored = it.Value
	}
	switch p.Algorithm {
	case throttler.TokenBucket:
		var st algo.TokenBucketState
		if it != nil {
			if st, err = decodeBucket(stored); err != nil {
				return d, nil, 0, false, err
			}
		}
		var next algo.TokenBucketState
		if d, next, write = algo.TokenBucket(p, st, it != nil, op, cost, r, t); write {
			value, end = appendBucket(make([]byte, 0, 24), next), algo.TokenBucketEnd(p, next)
		}
	case throttler.SlidingWindow:
		var st algo.CounterState
		if it != nil {
			if st, err = decodeCounter(stored); err != nil {
				return d, nil, 0, false, err
			}
		}
		var next algo.CounterState
		if d, next, write = algo.Counter(p, st, it != nil, op, cost, r, t); write {
			value, end = appendCounter(make([]byte, 0, 32), next), algo.CounterEnd(p, next)
		}
	case throttler.SlidingLog:
		var log []algo.LogEntry
		if it != nil {
			if log, err = decodeLog(stored); err != nil {
				return d, nil, 0, false, err
			}
		}
		if d, log, write = algo.Log(p, log, op, cost, r, t); write {
			value, end = appendLog(make([]byte, 0, 2+len(stored)+12), log), algo.LogEnd(p, log)
		}
	default:
		// Policy.Validate rejects other algorithms before we get here.
		return d, nil, 0, false, fmt.Errorf("memcached: algorithm %v: %w", p.Algorithm, throttler.ErrInvalidPolicy)
	}
	return d, value, end, write, nil
}

// backoff waits before attempt (>= 1), or until ctx is done: a random
// moment below a bound that starts at the duration of the round just lost
// (at least contentionBackoff), so it scales with the server's latency,
// and doubles with each attempt up to maxContentionBackoff.
func backoff(ctx context.Context, attempt int, round time.Duration) error {
	timer := time.NewTimer(rand.N(backoffLimit(attempt, round)) + 1)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("memcached: %w", ctx.Err())
	}
}

// backoffLimit is the bound of backoff's wait before attempt. It doubles
// step by step: shifted by attempt-1 at once, a bound overflows to a
// negative one once attempts pass the forties (or sooner after a slow
// round), and rand.N panics on it.
func backoffLimit(attempt int, round time.Duration) time.Duration {
	limit := max(round, contentionBackoff)
	for i := 1; i < attempt && limit < maxContentionBackoff; i++ {
		limit <<= 1
	}
	return min(limit, maxContentionBackoff)
}

// stateLocks lets one caller at a time work on a state item. The zero
// value is ready; an item's lock lives while someone holds or awaits it.
type stateLocks struct {
	mu sync.Mutex
	m  map[string]*stateLock
}

type stateLock struct {
	turn chan struct{} // holds a token while the lock is held
	refs int           // holders and waiters
}

// lock waits for key's turn, or until ctx is done, and returns the unlock.
func (l *stateLocks) lock(ctx context.Context, key string) (func(), error) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*stateLock{}
	}
	s := l.m[key]
	if s == nil {
		s = &stateLock{turn: make(chan struct{}, 1)}
		l.m[key] = s
	}
	s.refs++
	l.mu.Unlock()
	release := func() {
		l.mu.Lock()
		if s.refs--; s.refs == 0 {
			delete(l.m, key)
		}
		l.mu.Unlock()
	}
	select {
	case s.turn <- struct{}{}:
		return func() { <-s.turn; release() }, nil
	case <-ctx.Done():
		release()
		return nil, fmt.Errorf("memcached: %w", ctx.Err())
	}
}
