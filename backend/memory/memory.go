// Package memory is the embedded, in-process throttler.Backend: the default
// for a single process, and the fallback while a network store is down.
//
// Windows live in a fixed number of shards, each a map behind its own mutex,
// so goroutines working on different keys rarely contend and every operation
// on one key is atomic. Ended windows are reclaimed by sweeps judged by the
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
	// power of two. default: 256
	Shards int
	// MaxKeys bounds the number of open windows. When a shard is full,
	// Take first reclaims its ended windows, then fails a new key with
	// ErrFull. default: 0, no bound
	MaxKeys int
}

func (o *Options) withDefaults() Options {
	var out Options
	if o != nil {
		out = *o
	}
	if out.Shards <= 0 {
		out.Shards = 256
	}
	n := 1
	for n < out.Shards {
		n <<= 1
	}
	out.Shards = n
	return out
}

// Backend is the in-process store. It is safe for concurrent use. Create it
// with New.
type Backend struct {
	seed      maphash.Seed
	shards    []shard
	mask      uint64
	shardKeys int // per-shard bound; 0 means none
}

var _ throttler.Backend = (*Backend)(nil)

type windowID struct{ policy, key string }

type window struct {
	used    int64
	resetAt int64 // Unix milliseconds
}

type shard struct {
	mu        sync.Mutex
	windows   map[windowID]window
	latest    int64 // the latest now seen, Unix milliseconds
	sinceScan int   // operations since the last sweep
	_         [40]byte
}

// New returns an empty Backend. Nil options mean defaults.
func New(opts *Options) *Backend {
	o := opts.withDefaults()
	b := &Backend{seed: maphash.MakeSeed(), shards: make([]shard, o.Shards), mask: uint64(o.Shards - 1)}
	if o.MaxKeys > 0 {
		b.shardKeys = (o.MaxKeys + o.Shards - 1) / o.Shards
	}
	for i := range b.shards {
		b.shards[i].windows = make(map[windowID]window)
	}
	return b
}

// Close releases the stored windows. The Backend starts no goroutines, so
// Close only exists to free memory early; it returns nil.
func (b *Backend) Close() error {
	for i := range b.shards {
		s := &b.shards[i]
		s.mu.Lock()
		s.windows = make(map[windowID]window)
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
		n += len(s.windows)
		s.mu.Unlock()
	}
	return n
}

func (b *Backend) shardFor(id windowID) *shard {
	h := maphash.String(b.seed, id.key) ^ maphash.String(b.seed, id.policy)*31
	return &b.shards[h&b.mask]
}

// Take counts cost against the key's window if it fits.
func (b *Backend) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	if err := throttler.ValidateCall(key, p, cost); err != nil {
		return throttler.Decision{}, err
	}
	id := windowID{p.Name, key}
	ms := now.UnixMilli()
	s := b.shardFor(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.observe(ms)
	w, ok := s.windows[id]
	if !ok || w.resetAt <= ms {
		if cost > p.Limit {
			return throttler.WindowState(p, 0, time.Time{}, now, false), nil
		}
		if !ok && b.shardKeys > 0 && len(s.windows) >= b.shardKeys {
			s.sweep()
			if len(s.windows) >= b.shardKeys {
				return throttler.Decision{}, fmt.Errorf("%w: %d windows open in the shard of key %q", ErrFull, len(s.windows), key)
			}
		}
		w = window{resetAt: ms + p.Window.Milliseconds()}
	} else if w.used+cost > p.Limit {
		return throttler.WindowState(p, w.used, time.UnixMilli(w.resetAt), now, false), nil
	}
	w.used += cost
	s.windows[id] = w
	return throttler.WindowState(p, w.used, time.UnixMilli(w.resetAt), now, true), nil
}

// Peek reports the key's window without counting.
func (b *Backend) Peek(ctx context.Context, key string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	if err := throttler.ValidateCall(key, p, 1); err != nil {
		return throttler.Decision{}, err
	}
	id := windowID{p.Name, key}
	s := b.shardFor(id)
	s.mu.Lock()
	w := s.windows[id]
	s.mu.Unlock()
	return state(p, w, now), nil
}

// Refund gives cost back to the key's open window, never below zero.
func (b *Backend) Refund(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	if err := throttler.ValidateCall(key, p, cost); err != nil {
		return throttler.Decision{}, err
	}
	id := windowID{p.Name, key}
	ms := now.UnixMilli()
	s := b.shardFor(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.observe(ms)
	w, ok := s.windows[id]
	if ok && w.resetAt > ms {
		w.used = max(0, w.used-cost)
		s.windows[id] = w
	}
	return state(p, w, now), nil
}

// state is the Decision for a stored window (zero when absent).
func state(p throttler.Policy, w window, now time.Time) throttler.Decision {
	var resetAt time.Time
	if w.resetAt != 0 {
		resetAt = time.UnixMilli(w.resetAt)
	}
	return throttler.PeekState(p, w.used, resetAt, now)
}

// observe records now and sweeps once enough operations have passed to pay
// for it: at least as many as there are windows, so a sweep costs O(1) per
// operation amortised.
func (s *shard) observe(ms int64) {
	if ms > s.latest {
		s.latest = ms
	}
	s.sinceScan++
	if s.sinceScan >= 1024 && s.sinceScan >= len(s.windows) {
		s.sweep()
	}
}

// sweep deletes the windows that ended by the latest now the shard has seen.
func (s *shard) sweep() {
	s.sinceScan = 0
	for id, w := range s.windows {
		if w.resetAt <= s.latest {
			delete(s.windows, id)
		}
	}
}
