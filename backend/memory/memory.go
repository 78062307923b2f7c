// Package memory is the embedded, in-process throttler.Backend: the default
// for a single process, and the fallback while a network store is down.
//
// State lives in a fixed number of shards, each a hash table behind its own
// mutex, so goroutines working on different keys rarely contend and every
// operation on one key is atomic.
//
// # Bound and eviction
//
// The table holds at most Options.MaxKeys (key, policy) states
// (DefaultMaxKeys unless set), each shard its share. A full shard never
// refuses a rate limit's key and never hands one a fresh window: it drops
// what has ended, else evicts a seldom used live state into its second
// tier, a fixed array of cells keyed by a hash of (key, policy) that keeps
// what the state counted and until when. A cell that two states share
// keeps the stricter of each (more units, later end), so the second tier
// may over-count, never under-count: a key that returns after eviction is
// answered at least as strictly as its state would have been, and a new key
// only in the rare case that its fingerprint matches a shared cell (see
// evict.go for each algorithm's rule). Stats counts evictions and the
// calls the second tier answered.
//
// The bound is one of bytes, keys included: a state costs its 64-byte slot
// whatever its key's length, as a key longer than 22 bytes is held as a
// 128-bit hash of it under two random seeds, never as its bytes. Two long
// keys would share a state only if both hashes collided (for a million
// keys, about one chance in 2^88), which over-counts, never under-counts.
// At DefaultMaxKeys the tables hold about 62 MiB, and the second tier 48
// MiB more once shards evict; a sliding log's entries (16 bytes each) and
// a lease set's leases add to that, up to the policy's Limit per state.
// Stats.Bytes reports what the tables hold.
//
// # Cleanup
//
// State ends by the now values callers pass (a fixed window at its ResetAt, a bucket when full
// again, a log when its newest entry ends, a counter pair two windows on), and sweeps drop it:
// sweeps made by the calls themselves, and while the backend holds anything, a sweep of every shard
// each Options.SweepEvery by a timer (no goroutine between sweeps; Close stops it), so under a
// clock that keeps pace with real time (below) memory returns to its baseline within SweepEvery of
// the end of the last state plus Lag, without calls to drive it: a sweep without a call that empties a shard releases its table's arrays, and a table
// shrinks once the states it held for a sweep's span fit in an eighth of it. Dropped state answers
// like none only for a now at or after its end, so what matters is
// which nows the backend will still be asked about. A sweep drops the state that ended Options.Lag
// before the callers' clock as the backend trusts it: the monotonic clock plus the lowest offset
// (now − monotonic time) that its clock guard recorded in the last ClockHold to 2·ClockHold of real
// time, and the last one of the newest spell before that which recorded any. The guard records
//
//   - the now of each call that sweeps, and
//   - before any sweep of a shard, the lowest now of the shard's calls
//     since its last sweep, forgiven Lag, with the monotonic time of the
//     call that showed it (read only by a call that lowers it: about once
//     per sweep under a clock that moves on, never per call).
//
// So every call's now, a new backend's first call included, reaches the
// guard before a sweep of its shard can drop the state it made: the
// trusted clock never runs ahead of what the calls showed, moved on by
// real time. A call whose now trails the clock by up to Lag (a goroutine
// that read the clock and called later, a shadow's mirrored call) finds
// its state, and two backends given the same calls for a key answer alike
// whatever other keys' calls do. One call with a now far in the future
// moves cleanup nowhere. A clock that steps forward moves cleanup only as
// fast as real time passes, so if it comes back within ClockHold no state
// was lost, on a new backend or after any idle spell; one that stays
// stepped for ClockHold to 2·ClockHold is trusted from then on. A clock
// that steps back makes cleanup later, never earlier. Under a steady
// clock, state goes about Lag after it ends, plus the time its shard takes
// to make a sweep's worth of calls.
//
// A sweep without a call (the timer's, or one that makes room in another
// shard) may reclaim only what is ended by the callers' own clock: it moves
// that clock on past the latest now the calls showed by the real time since,
// but only at the pace the calls showed it advancing with real time (their
// latest now against two earlier ones at least max(Lag, SweepEvery) of real
// time apart): none unless it kept up with real time to within Lag over
// that span and since the later sample, and never faster than it ran. So a
// clock that stands still (a test's fixed instant) or runs slow keeps every
// state live by it, however much real time passes, while a real clock has
// its ended state reclaimed with no call, once calls spanning max(Lag,
// SweepEvery) of real time have shown its pace. A clock that kept pace and
// then stops with no call to show it is taken to move on.
package memory

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/throttlekit/throttlekit/internal/algo"
	"github.com/throttlekit/throttlekit/throttler"
)

// ErrFull is returned by Acquire for a key the table has no room for: its
// shard holds its share of Options.MaxKeys states and all of them are
// concurrency limits' leases, which are never evicted. Rate limits never
// get it: a full shard evicts (see Eviction).
var ErrFull = errors.New("memory: full")

// DefaultMaxKeys is Options.MaxKeys' default: 786,432 states, 3,072 in each
// of the default 256 shards; about 62 MiB of tables, keys included, and 48
// MiB more of second tier while shards evict (110 MiB of heap under a flood
// of 10 million keys). See Bound and eviction.
const DefaultMaxKeys = 3 << 18

// Options configure a Backend. The zero value (or nil) means defaults.
type Options struct {
	// Shards is the number of independently locked maps, rounded up to a
	// power of two, at most 65536. default: 256
	Shards int
	// MaxKeys bounds the (key, policy) states the whole table holds: each
	// shard holds at most MaxKeys/Shards (at least one). A full shard
	// makes room by dropping ended state or evicting the least recently
	// used live state to its second tier, which keeps what it counted
	// (see Eviction). default: DefaultMaxKeys
	MaxKeys int
	// Lag is how far behind the other calls a call's now may be and still
	// find its state: cleanup keeps ended state this long (see Cleanup).
	// Longer keeps more ended state. default: 1s
	Lag time.Duration
	// ClockHold is how long cleanup keeps to the clock it saw before a step
	// forward, advancing only as fast as real time: a clock that steps
	// forward and back within it costs no key its state. Longer keeps the
	// state made after a lasting step longer. default: 10m
	ClockHold time.Duration
	// SweepEvery is how often, while the backend holds any state, a
	// timer sweeps every shard for ended state, with no call to drive it;
	// Close stops it. A timer sweep moves the callers' clock on only at
	// the pace their calls showed (see Cleanup), so a clock that stands
	// still while real time passes (a test at a fixed instant) keeps its
	// state. default: 1s
	SweepEvery time.Duration
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
		return out, fmt.Errorf("memory: Options.MaxKeys must be >= 0 (0: the default, %d), got %d", DefaultMaxKeys, out.MaxKeys)
	}
	if out.SweepEvery < 0 {
		return out, fmt.Errorf("memory: Options.SweepEvery must be >= 0 (0: the default, 1s), got %v", out.SweepEvery)
	}
	if out.Lag < 0 {
		return out, fmt.Errorf("memory: Options.Lag must be >= 0 (0: the default, 1s), got %v", out.Lag)
	}
	if out.ClockHold < 0 {
		return out, fmt.Errorf("memory: Options.ClockHold must be >= 0 (0: the default, 10m), got %v", out.ClockHold)
	}
	if out.Shards == 0 {
		out.Shards = 256
	}
	if out.MaxKeys == 0 {
		out.MaxKeys = DefaultMaxKeys
	}
	if out.SweepEvery == 0 {
		out.SweepEvery = time.Second
	}
	if out.Lag == 0 {
		out.Lag = time.Second
	}
	if out.ClockHold == 0 {
		out.ClockHold = 10 * time.Minute
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

	lag   int64      // Options.Lag in ms
	guard clockGuard // how far cleanup may follow the callers' clock
	// mono reads the monotonic clock: the time since New. Tests replace it
	// (export_test.go).
	mono func() time.Duration

	maxKeys int64        // Options.MaxKeys
	quota   int          // the states a shard may hold: its share of MaxKeys, rounded up
	keys    atomic.Int64 // states held
	// elsewhere picks where evictElsewhere starts looking.
	elsewhere atomic.Uint32
	errFull   error // ErrFull, saying what the bound is

	sweeper sweeper
	// called is set by a call that brings its shard a new low (the first
	// since the shard's last sweep), and cleared by the sweeper's sweep:
	// whether any call came since (see sweepAll).
	called atomic.Bool
	idle   idleSweep
	ids    idents
	alls   allMemos // composites' memos, per shard (composite.go)
}

var _ throttler.LeaseBackend = (*Backend)(nil)

// Traits says that calls answer from memory without blocking, so a
// Throttler needs no timeout context for them, that leases are held, and
// that composites are taken (atomically: see composite.go).
func (b *Backend) Traits() throttler.Traits {
	return throttler.Traits{InProcess: true, Leases: true, Composites: true}
}

// New returns an empty Backend. Nil options mean defaults; a negative
// number is an error naming the field.
func New(opts *Options) (*Backend, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	b := &Backend{
		seed:       maphash.MakeSeed(),
		shards:     make([]shard, o.Shards),
		shardShift: 64,
		lag:        o.Lag.Milliseconds(),
		guard:      clockGuard{hold: max(1, o.ClockHold.Milliseconds()), pace: newPace(o.Lag, o.SweepEvery)},
		mono:       func() time.Duration { return time.Since(start) },
		maxKeys:    int64(o.MaxKeys),
		quota:      (o.MaxKeys + o.Shards - 1) / o.Shards,
		errFull: fmt.Errorf("%w: a shard holds its share of Options.MaxKeys (%d), all of them leases; "+
			"a new key's lease is refused until one ends", ErrFull, o.MaxKeys),
	}
	b.sweeper.every = o.SweepEvery
	b.sweeper.sweep = b.sweepAll
	b.sweeper.holding = func() bool { return b.keys.Load() > 0 }
	for n := o.Shards; n > 1; n >>= 1 {
		b.shardShift--
	}
	wide := maphash.MakeSeed()
	for i := range b.shards {
		b.shards[i].reset()
		b.shards[i].table.wide = wide
	}
	return b, nil
}

// Close stops the sweeper and releases the stored state; it returns nil.
// A Backend must not be used after Close.
func (b *Backend) Close() error {
	b.sweeper.stop()
	for i := range b.shards {
		s := &b.shards[i]
		s.mu.Lock()
		b.keys.Add(-int64(s.table.live))
		s.table.clear()
		s.tier = tier{}
		s.mu.Unlock()
	}
	return nil
}

// Stats are a Backend's counts: what it holds and what making room cost.
type Stats struct {
	// Keys is how many (key, policy) states are held now, ended ones not
	// yet reclaimed included.
	Keys int
	// Evictions counts live states moved to the second tier to make room
	// in a full shard.
	Evictions uint64
	// SecondTierHits counts calls that found no state but answered from
	// one the second tier remembered.
	SecondTierHits uint64
	// Bytes is the heap the tables hold: slots (keys included), second
	// tier, logs' entries and lease sets.
	Bytes int64
}

// Stats reads the counts, locking each shard in turn.
func (b *Backend) Stats() Stats {
	var st Stats
	for i := range b.shards {
		s := &b.shards[i]
		s.mu.Lock()
		st.Keys += s.table.live
		st.Evictions += s.evictions
		st.SecondTierHits += s.tierHits
		st.Bytes += s.table.bytes() + int64(len(s.tier.cells))*int64(unsafe.Sizeof(cell{}))
		s.mu.Unlock()
	}
	return st
}

// Len reports how many (key, policy) states are stored, ended ones not yet
// reclaimed included.
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

// begin validates a call as throttler.ValidateCall does, in its order (the
// key, the policy, the cost), records its now (ms) for cleanup, sweeping
// the shard when one is due, and returns the key's shard, locked, the
// key's hash, the shard's memo of the policy (valid while the shard is
// locked) and the key's slot under it, nil for none. A caller that passes
// the same Policy call after call has it validated once per shard; then
// only the key's length and the cost are checked, against numbers, and the
// validators run only to say what is wrong.
func (b *Backend) begin(op throttler.Op, key string, p *throttler.Policy, cost, ms int64) (*shard, uint64, *lastPolicy, *slot, error) {
	if uint(len(key)-1) >= throttler.MaxKeyLen { // empty or too long
		return nil, 0, nil, nil, throttler.ValidateCall(op, key, *p, cost, time.Time{}) // the key's error
	}
	s, h := b.lock(key)
	m, err := b.policy(s, p)
	if err == nil && !m.fits(op, cost) {
		err = throttler.ValidateCall(op, key, *p, cost, time.Time{}) // the cost's error
	}
	if err != nil {
		s.mu.Unlock()
		return nil, 0, nil, nil, err
	}
	if b.observe(s, ms) {
		b.sweep(s, ms, true)
	}
	return s, h, m, s.table.find(h, key, m.id), nil
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
	if p.Composite() {
		return b.composite(throttler.OpTake, key, &p, cost, now)
	}
	ms := now.UnixMilli()
	s, h, m, w, err := b.begin(throttler.OpTake, key, &p, cost, ms)
	if err != nil {
		return throttler.Decision{}, err
	}
	if w != nil {
		w.used1()
		// The common case, stored state that admits the Take: each
		// algorithm's arithmetic for it alone (fast.go), and the
		// Decision that the general path would build for it.
		var used, resetAt int64
		ok := false
		c := m.capacity
		switch p.Algorithm {
		case throttler.FixedWindow:
			used, resetAt, ok = w.takeFixed(p.Limit, cost, ms)
		case throttler.TokenBucket:
			used, resetAt, ok = w.takeBucket(p.Limit, c, p.Window.Milliseconds(), cost, ms)
		case throttler.SlidingWindow:
			used, resetAt, ok = w.takeCounter(p.Limit, p.Window.Milliseconds(), cost, ms)
		case throttler.SlidingLog:
			if used, resetAt, ok = s.table.extraOf(w).log.Take(p, cost, ms); ok {
				w.end = resetAt // the log's End: its newest entry's
			}
		}
		if ok {
			s.mu.Unlock()
			return throttler.Decision{Allowed: true, Limit: c, Used: used, Remaining: max(c-used, 0), ResetAt: time.UnixMilli(resetAt)}, nil
		}
	}
	return b.answer(s, h, w, m.id, throttler.OpTake, key, &p, cost, 0, ms, now)
}

// Peek reports the key's state without counting.
func (b *Backend) Peek(ctx context.Context, key string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	if p.Composite() {
		return b.composite(throttler.OpPeek, key, &p, 1, now)
	}
	ms := now.UnixMilli()
	s, h, m, w, err := b.begin(throttler.OpPeek, key, &p, 1, ms)
	if err != nil {
		return throttler.Decision{}, err
	}
	return b.answer(s, h, w, m.id, throttler.OpPeek, key, &p, 1, 0, ms, now)
}

// Refund gives cost back to the key's state that the Take of receipt
// counted them in (see throttler.Backend), never below zero.
func (b *Backend) Refund(ctx context.Context, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
	if p.Composite() {
		return throttler.Decision{}, throttler.ValidateCall(throttler.OpRefund, key, p, cost, receipt) // never nil
	}
	if receipt.IsZero() {
		// The call's error, else the receipt's.
		return throttler.Decision{}, throttler.ValidateCall(throttler.OpRefund, key, p, cost, receipt)
	}
	ms := now.UnixMilli()
	s, h, m, w, err := b.begin(throttler.OpRefund, key, &p, cost, ms)
	if err != nil {
		return throttler.Decision{}, err
	}
	return b.answer(s, h, w, m.id, throttler.OpRefund, key, &p, cost, receipt.UnixMilli(), ms, now)
}

// answer runs op on the slot w of (key, p), whose identity number is id,
// in the locked shard s, and unlocks it. With no state in the table (w
// nil) it answers from the state the second tier remembers, if any: a
// Peek reads it in place, and a Take or Refund brings it back into the
// table first.
func (b *Backend) answer(s *shard, h uint64, w *slot, id uint32, op throttler.Op, key string, p *throttler.Policy, cost, r, ms int64, now time.Time) (throttler.Decision, error) {
	defer s.mu.Unlock()
	return b.answerLocked(s, h, w, id, op, key, p, cost, r, ms, now)
}

// answerLocked is answer, leaving s locked: a composite's members are
// answered under one lock (composite.go).
func (b *Backend) answerLocked(s *shard, h uint64, w *slot, id uint32, op throttler.Op, key string, p *throttler.Policy, cost, r, ms int64, now time.Time) (throttler.Decision, error) {
	var lg *algo.LogBuffer
	if w != nil {
		w.used1()
		if w.kind() == kindLog {
			lg = s.table.extraOf(w).log
		}
	} else if old, oldLog, ok := b.recall(s, h, id, p, ms, op != throttler.OpPeek); ok {
		w, lg = &old, oldLog
		if op != throttler.OpPeek {
			n, err := b.make(s, h, nil, key, p, id, ms)
			if err != nil {
				return throttler.Decision{}, err
			}
			n.used, n.resetAt, n.end = old.used, old.resetAt, old.end
			n.used1() // a client that returns
			if n.kind() == kindLog {
				s.table.extraOf(n).log = lg
			} else {
				n.prev = old.prev
			}
			w = n
		}
	}
	return b.apply(s, h, w, lg, id, op, key, p, cost, r, ms, now)
}

// apply runs op at ms (now in Unix ms; r a Refund's receipt) on the slot w
// of (key, p), nil when none is stored, and a log's buffer lg, in the
// locked shard s. It makes a slot only when the call writes: a Peek and a
// denied Take store nothing. Each algorithm keeps its state in the slot's
// fields as the slot's doc says.
func (b *Backend) apply(s *shard, h uint64, w *slot, lg *algo.LogBuffer, id uint32, op throttler.Op, key string, p *throttler.Policy, cost, r, ms int64, now time.Time) (d throttler.Decision, err error) {
	write := false
	switch p.Algorithm {
	case throttler.FixedWindow:
		return b.fixed(s, h, w, id, op, key, p, cost, r, ms, now)
	case throttler.TokenBucket:
		var st, next algo.TokenBucketState
		if w != nil {
			st = algo.TokenBucketState{Tokens: w.used, At: w.resetAt, Window: w.window()}
		}
		if d, next, write = algo.TokenBucket(*p, st, w != nil, op, cost, r, ms); write {
			if w, err = b.make(s, h, w, key, p, id, ms); err == nil {
				// The bucket is full again at its ResetAt: that is
				// algo.TokenBucketEnd, without computing it twice.
				w.used, w.resetAt, w.prev, w.end = next.Tokens, next.At, next.Window, d.ResetAt.UnixMilli()
			}
		}
	case throttler.SlidingWindow:
		var st, next algo.CounterState
		if w != nil {
			st = algo.CounterState{K: w.resetAt, Curr: w.used, Prev: w.prev, Window: w.window()}
		}
		if d, next, write = algo.Counter(*p, st, w != nil, op, cost, r, ms); write {
			if w, err = b.make(s, h, w, key, p, id, ms); err == nil {
				w.resetAt, w.used, w.prev, w.end = next.K, next.Curr, next.Prev, next.Window // end: the window (slot)
			}
		}
	case throttler.SlidingLog:
		if w != nil {
			if d, write = lg.Apply(*p, op, cost, r, ms); write {
				w.end = lg.End(*p)
			}
			break
		}
		// No log: answer from an empty one, kept only if the call wrote.
		var l algo.LogBuffer
		if d, write = l.Apply(*p, op, cost, r, ms); write {
			if w, err = b.make(s, h, nil, key, p, id, ms); err == nil {
				x := s.table.extraOf(w)
				x.log = new(algo.LogBuffer)
				*x.log = l
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
func (b *Backend) fixed(s *shard, h uint64, w *slot, id uint32, op throttler.Op, key string, p *throttler.Policy, cost, r, ms int64, now time.Time) (throttler.Decision, error) {
	open := w != nil && w.resetAt > ms
	switch op {
	case throttler.OpTake:
		if !open {
			var err error
			if w, err = b.make(s, h, w, key, p, id, ms); err != nil {
				return throttler.Decision{}, err
			}
			w.used, w.resetAt = 0, ms+p.Window.Milliseconds()
			w.end = w.resetAt
		} else if w.used+cost > p.Limit {
			return algo.WindowState(*p, w.used, time.UnixMilli(w.resetAt), now, false), nil
		}
		w.used += cost
		return algo.WindowState(*p, w.used, time.UnixMilli(w.resetAt), now, true), nil
	case throttler.OpRefund:
		if open && w.resetAt == r { // the Take's window, not a later one
			w.used = max(0, w.used-cost)
		}
	}
	if !open {
		return state(*p, 0, 0, now), nil
	}
	return state(*p, w.used, w.resetAt, now), nil
}

// make returns w, or when it is nil a new slot for (key, p), whose
// identity number is id, in the locked shard s, for a call at ms.
func (b *Backend) make(s *shard, h uint64, w *slot, key string, p *throttler.Policy, id uint32, ms int64) (*slot, error) {
	if w != nil {
		return w, nil
	}
	return b.makeSlot(s, h, key, id, kindOf(p.Algorithm), ms)
}

// makeSlot returns a new slot of kind for (key, policy id) in the locked
// shard s, for a call at ms (see room).
func (b *Backend) makeSlot(s *shard, h uint64, key string, id uint32, kind uint8, ms int64) (*slot, error) {
	if !b.room(s, ms, kind == kindLease) {
		return nil, b.errFull
	}
	if s.table.crowded() {
		b.makeRoom(s, ms)
	}
	s.peak = max(s.peak, s.table.live+1)
	b.sweeper.arm()
	return s.table.insert(h, key, id, kind), nil
}

// state is the Peek/Refund Decision for a window that counted used units and
// ends at resetAt (Unix ms; 0 when no window is stored).
func state(p throttler.Policy, used, resetAt int64, now time.Time) throttler.Decision {
	var at time.Time
	if resetAt != 0 {
		at = time.UnixMilli(resetAt)
	}
	return algo.PeekState(p, used, at, now)
}
