// Package memory is the embedded, in-process throttler.Backend: the default
// for a single process, and the fallback while a network store is down.
//
// Windows live in a fixed number of shards, each a hash table behind its own
// mutex, so goroutines working on different keys rarely contend and every
// operation on one key is atomic. Ended windows are reclaimed by sweeps judged by the
// latest now a shard has been given, never by the wall clock: the backend
// starts no goroutines.
package memory

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"time"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/throttler"
)

// ErrFull is returned by Take when a new window would exceed Options.MaxKeys
// after ended windows were reclaimed. The open windows of other keys are
// never evicted to make room, since that would hand their clients a fresh
// window; a Throttler treats ErrFull like any backend failure (fail open by
// default, or the fallback).
var ErrFull = errors.New("memory: full")

// Options configure a Backend. The zero value (or nil) means defaults.
type Options struct {
	// Shards is the number of independently locked maps, rounded up to a
	// power of two, at most 65536. default: 256
	Shards int
	// MaxKeys bounds the number of open windows. When a shard is full,
	// Take first reclaims its ended windows, then fails a new key with
	// ErrFull. default: 0, no bound
	MaxKeys int
}

// maxShards bounds Options.Shards: more locks than this buy nothing on any
// machine and cost memory per Backend.
const maxShards = 1 << 16

func (o *Options) withDefaults() (Options, error) {
	var out Options
	if o != nil {
		out = *o
	}
	if out.Shards < 0 || out.Shards > maxShards {
		return out, fmt.Errorf("memory: Options.Shards must be between 0 (default) and %d, got %d", maxShards, out.Shards)
	}
	if out.MaxKeys < 0 {
		return out, fmt.Errorf("memory: Options.MaxKeys must be >= 0 (0: no bound), got %d", out.MaxKeys)
	}
	if out.Shards == 0 {
		out.Shards = 256
	}
	n := 1
	for n < out.Shards {
		n <<= 1
	}
	out.Shards = n
	return out, nil
}

// Backend is the in-process store. It is safe for concurrent use. Create it
// with New.
type Backend struct {
	seed       maphash.Seed
	shards     []shard
	shardShift uint // the top bits of a key's hash pick its shard; the low bits place it in the shard's table
	shardKeys  int  // per-shard bound on windows; 0 means none
}

var (
	_ throttler.Backend = (*Backend)(nil)
	_ backend.InProcess = (*Backend)(nil)
)

// InProcess reports true: calls answer from memory without blocking, so a
// Throttler needs no timeout context for them.
func (b *Backend) InProcess() bool { return true }

type shard struct {
	mu        sync.Mutex
	table     table
	latest    int64 // the latest now seen, Unix milliseconds
	sinceScan int   // operations since the last sweep
	_         [24]byte
}

// New returns an empty Backend. Nil options mean defaults; a negative
// number is an error naming the field.
func New(opts *Options) (*Backend, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	b := &Backend{seed: maphash.MakeSeed(), shards: make([]shard, o.Shards), shardShift: 64}
	for n := o.Shards; n > 1; n >>= 1 {
		b.shardShift--
	}
	if o.MaxKeys > 0 {
		b.shardKeys = (o.MaxKeys + o.Shards - 1) / o.Shards
	}
	return b, nil
}

// Close releases the stored windows. The Backend starts no goroutines, so
// Close only exists to free memory early; it returns nil.
func (b *Backend) Close() error {
	for i := range b.shards {
		s := &b.shards[i]
		s.mu.Lock()
		s.table = table{}
		s.mu.Unlock()
	}
	return nil
}

// Len reports how many windows are stored, ended ones not yet reclaimed
// included.
func (b *Backend) Len() int {
	n := 0
	for i := range b.shards {
		s := &b.shards[i]
		s.mu.Lock()
		n += s.table.live
		s.mu.Unlock()
	}
	return n
}

// lock returns the key's shard, locked, and the key's hash.
func (b *Backend) lock(key string) (*shard, uint64) {
	h := maphash.String(b.seed, key)
	s := &b.shards[h>>b.shardShift]
	s.mu.Lock()
	return s, h
}

// Take counts cost against the key's state if it fits.
func (b *Backend) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	if err := backend.ValidateCall(throttler.OpTake, key, p, cost); err != nil {
		return throttler.Decision{}, err
	}
	ms := now.UnixMilli()
	s, h := b.lock(key)
	s.observe(ms)
	w := s.table.find(h, key, ident(p))
	if w != nil {
		// The common case, stored state that admits the Take: each
		// algorithm's arithmetic for it alone (fast.go), and the
		// Decision that the general path would build for it.
		var used, resetAt int64
		ok := false
		switch p.Algorithm {
		case throttler.FixedWindow:
			used, resetAt, ok = w.takeFixed(p.Limit, cost, ms)
		case throttler.TokenBucket:
			used, resetAt, ok = w.takeBucket(p.Limit, p.Capacity(), p.Window.Milliseconds(), cost, ms)
		case throttler.SlidingWindow:
			used, resetAt, ok = w.takeCounter(p.Limit, p.Window.Milliseconds(), cost, ms)
		case throttler.SlidingLog:
			if used, resetAt, ok = w.log.Take(p, cost, ms); ok {
				w.end = resetAt // the log's End: its newest entry's
			}
		}
		if ok {
			s.mu.Unlock()
			c := p.Capacity()
			return throttler.Decision{Allowed: true, Limit: c, Used: used, Remaining: max(c-used, 0), ResetAt: time.UnixMilli(resetAt)}, nil
		}
	}
	return b.apply(s, h, w, throttler.OpTake, key, &p, cost, ms, now)
}

// Peek reports the key's state without counting.
func (b *Backend) Peek(ctx context.Context, key string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	if err := backend.ValidateCall(throttler.OpPeek, key, p, 1); err != nil {
		return throttler.Decision{}, err
	}
	s, h := b.lock(key)
	return b.apply(s, h, s.table.find(h, key, ident(p)), throttler.OpPeek, key, &p, 1, now.UnixMilli(), now)
}

// Refund gives cost back to the key's state, never below zero.
func (b *Backend) Refund(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	if err := backend.ValidateCall(throttler.OpRefund, key, p, cost); err != nil {
		return throttler.Decision{}, err
	}
	ms := now.UnixMilli()
	s, h := b.lock(key)
	s.observe(ms)
	return b.apply(s, h, s.table.find(h, key, ident(p)), throttler.OpRefund, key, &p, cost, ms, now)
}

// apply runs op at ms (now in Unix ms) on the slot w of (key, p), nil when
// none is stored, in the locked shard s, and unlocks it. It makes a slot
// only when the call writes: a Peek and a denied Take store nothing.
//
// Each algorithm keeps its state in the slot's fields: a fixed window is
// used and resetAt; a token bucket used = scaled tokens, resetAt = t0; a
// sliding-window counter resetAt = K, used = curr, prev; both with their
// window; a sliding log its own buffer. end is when the state answers like
// none: a sweep may drop it then.
func (b *Backend) apply(s *shard, h uint64, w *slot, op throttler.Op, key string, p *throttler.Policy, cost, ms int64, now time.Time) (d throttler.Decision, err error) {
	defer s.mu.Unlock()
	write := false
	switch p.Algorithm {
	case throttler.FixedWindow:
		return b.fixed(s, h, w, op, key, p, cost, ms, now)
	case throttler.TokenBucket:
		var st, next backend.BucketState
		if w != nil {
			st = backend.BucketState{Tokens: w.used, At: w.resetAt, Window: w.window}
		}
		if d, next, write = backend.Bucket(*p, st, w != nil, op, cost, ms); write {
			if w, err = b.make(s, h, w, key, p); err == nil {
				// The bucket is full again at its ResetAt: that is
				// backend.BucketEnd, without computing it twice.
				w.used, w.resetAt, w.window, w.end = next.Tokens, next.At, next.Window, d.ResetAt.UnixMilli()
			}
		}
	case throttler.SlidingWindow:
		var st, next backend.CounterState
		if w != nil {
			st = backend.CounterState{K: w.resetAt, Curr: w.used, Prev: w.prev, Window: w.window}
		}
		if d, next, write = backend.Counter(*p, st, w != nil, op, cost, ms); write {
			if w, err = b.make(s, h, w, key, p); err == nil {
				w.resetAt, w.used, w.prev, w.window = next.K, next.Curr, next.Prev, next.Window
				w.end = (next.K + 2) * next.Window // backend.CounterEnd
			}
		}
	case throttler.SlidingLog:
		if w != nil {
			if d, write = w.log.Apply(*p, op, cost, ms); write {
				w.end = w.log.End(*p)
			}
			break
		}
		// No log: answer from an empty one, kept only if the call wrote.
		var l backend.LogBuffer
		if d, write = l.Apply(*p, op, cost, ms); write {
			if w, err = b.make(s, h, nil, key, p); err == nil {
				w.log = new(backend.LogBuffer)
				*w.log = l
				w.end = l.End(*p)
			}
		}
	}
	if err != nil {
		return throttler.Decision{}, err
	}
	return d, nil
}

// fixed runs op on a fixed window (see apply).
func (b *Backend) fixed(s *shard, h uint64, w *slot, op throttler.Op, key string, p *throttler.Policy, cost, ms int64, now time.Time) (throttler.Decision, error) {
	open := w != nil && w.resetAt > ms
	switch op {
	case throttler.OpTake:
		if !open {
			var err error
			if w, err = b.make(s, h, w, key, p); err != nil {
				return throttler.Decision{}, err
			}
			w.used, w.resetAt = 0, ms+p.Window.Milliseconds()
			w.end = w.resetAt
		} else if w.used+cost > p.Limit {
			return backend.WindowState(*p, w.used, time.UnixMilli(w.resetAt), now, false), nil
		}
		w.used += cost
		return backend.WindowState(*p, w.used, time.UnixMilli(w.resetAt), now, true), nil
	case throttler.OpRefund:
		if open {
			w.used = max(0, w.used-cost)
		}
	}
	if !open {
		return state(*p, 0, 0, now), nil
	}
	return state(*p, w.used, w.resetAt, now), nil
}

// make returns w, or when it is nil a new slot for (key, p) in the locked
// shard s (see insert).
func (b *Backend) make(s *shard, h uint64, w *slot, key string, p *throttler.Policy) (*slot, error) {
	if w != nil {
		return w, nil
	}
	return b.insert(s, h, key, *p)
}

// insert adds a slot for (key, p) to the locked shard s, first reclaiming
// ended state when the shard is at its bound, and fails with ErrFull when
// that makes no room: live state is never evicted.
func (b *Backend) insert(s *shard, h uint64, key string, p throttler.Policy) (*slot, error) {
	if b.shardKeys > 0 && s.table.live >= b.shardKeys {
		s.sweep()
		if s.table.live >= b.shardKeys {
			return nil, fmt.Errorf("%w: %d keys held in the shard of key %q", ErrFull, s.table.live, key)
		}
	}
	if s.table.crowded() {
		s.makeRoom()
	}
	return s.table.insert(h, key, ident(p)), nil
}

// ident is the storage identity of p in a slot, without an allocation: a
// named policy's Name, or an unnamed policy's Limit and Window (see
// backend.Identity).
func ident(p throttler.Policy) policyID {
	if p.Name != "" {
		return policyID{name: p.Name, alg: p.Algorithm}
	}
	return policyID{limit: p.Limit, window: int64(p.Window), burst: p.Burst, alg: p.Algorithm}
}

// state is the Peek/Refund Decision for a window that counted used units and
// ends at resetAt (Unix ms; 0 when no window is stored).
func state(p throttler.Policy, used, resetAt int64, now time.Time) throttler.Decision {
	var at time.Time
	if resetAt != 0 {
		at = time.UnixMilli(resetAt)
	}
	return backend.PeekState(p, used, at, now)
}

// observe records now and sweeps once enough operations have passed to pay
// for it: at least as many as there are windows, so a sweep costs O(1) per
// operation amortised.
func (s *shard) observe(ms int64) {
	if ms > s.latest {
		s.latest = ms
	}
	s.sinceScan++
	if s.sinceScan >= 1024 && s.sinceScan >= s.table.live {
		s.sweep()
	}
}

// sweep drops the windows that ended by the latest now the shard has seen,
// and shrinks the table when they were most of it.
func (s *shard) sweep() {
	s.sinceScan = 0
	s.table.sweep(s.latest)
	if n := len(s.table.slots); n > minSlots && s.table.live*8 < n {
		s.table.resize(sizeFor(s.table.live))
	}
}

// makeRoom readies a crowded table for an insert: ended windows go first,
// and the array doubles unless that freed a quarter of it, so that
// crowding again takes as many inserts as the sweep cost.
func (s *shard) makeRoom() {
	s.table.sweep(s.latest)
	if n := len(s.table.slots); n == 0 {
		s.table.resize(minSlots)
	} else if s.table.live*2 > n {
		s.table.resize(2 * n)
	}
}
