package memcached

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/throttlekit/throttlekit/internal/algo"
	"github.com/throttlekit/throttlekit/throttler"
)

// Composites (throttler.All).
//
// Memcached has no transaction over several items, and a composite's
// members are items of their own, each where a single policy keeps it (a
// member alone and inside a composite counts one state), possibly on
// several servers. So a composite's Take is a check, then ordered takes with
// compensating undos:
//
//  1. One multi-key gets reads every member: a fixed window's head and
//     counter (the counter alone when the head is cached), another
//     algorithm's state item. A Peek of a composite is this read alone.
//  2. If a member would deny the cost, the composite is denied from what
//     was read: nothing is written anywhere.
//  3. Otherwise each member takes, by its own atomic Take (incr, or cas
//     over the state read in 1), the member with the least to spare
//     first, so that a race is usually lost before anything was taken.
//  4. If a member's Take is denied after all (another caller spent in
//     between) or fails, the members already taken are undone, each by the
//     exact inverse of its Take (undo), and the composite is denied (or
//     the failure returned).
//
// What this promises, and the bound of what it does not:
//   - No member ever admits past its limit: each member's Take is atomic,
//     and a composite is admitted only when every member's was.
//   - A denial found in 1 writes nothing: every denial of calls made one
//     after another, and the common denial under load.
//   - A race lost in 3 counts cost in the members taken before it until
//     their undo, one round trip later each: meanwhile a concurrent caller
//     can be denied although its units would have fit (an under-admission
//     of at most cost per member, for those round trips), never admitted
//     past a limit. After the undo each member counts what it would have
//     counted without the Take, but for a sliding log whose Take's entry
//     a concurrent Refund has already emptied, or a token bucket refilled
//     in between (see undo): then less is undone, and more stays counted,
//     never less. A fixed window the undone Take opened stays open, empty,
//     until its reset, as after a Take and its Refund: its head is kept,
//     since another caller may already count in that window.
//   - A failure, or the process's end, between a member's Take and its
//     undo leaves cost counted without admission in each member taken
//     before (at most MaxMembers-1), and in the failing one if its write
//     reached the server, until that member forgets it: a fixed window
//     when it ends, a token bucket once cost tokens have refilled
//     (cost·Window/Limit), a sliding log when the Take's entry ends
//     (Window), a sliding-window counter within two windows. A failed
//     undo is returned as an error.
//
// The read reaches every server that holds a member's item, so a composite
// fails while any of them does; its Store is its first member's (see
// homeItem), and a failure is blamed on the server it came from.

// member is what a composite's call knows of one member.
type member struct {
	p     throttler.Policy
	k     itemKeys
	fixed bool
	// A fixed window's head (from the cache or read) and its count.
	w window
	n int64
	// Another algorithm's state item as read; nil: missing. wrote is the
	// state its Take wrote.
	it    *memcache.Item
	wrote []byte
}

// firstMember is a composite's first member.
func firstMember(p throttler.Policy) throttler.Policy {
	for _, m := range p.Members() {
		return m
	}
	return p
}

// composite runs op (OpTake or OpPeek) of cost under the composite p.
func (b *Backend) composite(ctx context.Context, op throttler.Op, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	if err := throttler.ValidateCall(op, key, p, cost, time.Time{}); err != nil {
		return throttler.Decision{}, err
	}
	var all [throttler.MaxMembers]member
	n := 0
	for i, mp := range p.Members() {
		all[i] = member{p: mp, k: newItemKeys(b.opts.Prefix, mp, key), fixed: mp.Algorithm == throttler.FixedWindow}
		n = i + 1
	}
	ms := all[:n]
	if err := b.readMembers(ctx, ms, now); err != nil {
		return throttler.Decision{}, err
	}
	var ds [throttler.MaxMembers]throttler.Decision
	admit := true
	for i := range ms {
		d, err := ms[i].decide(throttler.OpPeek, 1, now)
		if err != nil {
			return throttler.Decision{}, err
		}
		if op == throttler.OpTake {
			// A member admits cost iff a Peek leaves it that many.
			d.Allowed, d.RetryAfter = d.Remaining >= cost, 0
		}
		ds[i], admit = d, admit && d.Allowed
	}
	if op == throttler.OpTake && !admit {
		for i := range ms {
			if !ds[i].Allowed {
				// What its own denied Take answers, from the same read.
				d, err := ms[i].decide(throttler.OpTake, cost, now)
				if err != nil {
					return throttler.Decision{}, err
				}
				ds[i] = d
			}
		}
	}
	if op == throttler.OpTake && admit {
		return b.takeMembers(ctx, key, ms, cost, now, &ds)
	}
	return throttler.Combine(ds[:n]), nil
}

// readMembers fills in what the members' items hold at now, in one
// multi-key gets (two when a fixed window's head names a window whose
// counter was not fetched with it).
func (b *Backend) readMembers(ctx context.Context, ms []member, now time.Time) error {
	nowMs := now.UnixMilli()
	keys := make([]string, 0, 2*len(ms))
	var hints [throttler.MaxMembers]int64
	var hinted [throttler.MaxMembers]bool
	for i := range ms {
		m := &ms[i]
		if !m.fixed {
			keys = append(keys, m.k.state())
			continue
		}
		h, known := b.cache.get(m.k.head())
		if known && b.cache.trusted(h, nowMs) {
			m.w = window{open: true, resetAt: h.resetAt, found: true, cached: true}
			keys = append(keys, m.k.counter(h.resetAt))
			continue
		}
		keys = append(keys, m.k.head())
		if known {
			hints[i], hinted[i] = h.resetAt, true
			keys = append(keys, m.k.counter(h.resetAt))
		}
	}
	items, err := b.getMulti(ctx, ms, keys)
	if err != nil {
		return err
	}
	var more []string
	for i := range ms {
		m := &ms[i]
		switch {
		case !m.fixed:
			m.it = items[m.k.state()]
			continue
		case !m.w.cached:
			if m.w, err = parseHead(m.k, items[m.k.head()], now); err != nil {
				return err
			}
			if !m.w.open {
				continue
			}
			counted := hinted[i] && hints[i] == m.w.resetAt
			b.cache.put(m.k.head(), m.w.resetAt, nowMs, counted)
			if !counted {
				more = append(more, m.k.counter(m.w.resetAt))
				continue
			}
		}
		if m.n, err = countOf(m.k, items[m.k.counter(m.w.resetAt)]); err != nil {
			return err
		}
	}
	if len(more) == 0 {
		return nil
	}
	if items, err = b.getMulti(ctx, ms, more); err != nil {
		return err
	}
	for i := range ms {
		if m := &ms[i]; m.fixed && m.w.open && !m.w.cached {
			if it, ok := items[m.k.counter(m.w.resetAt)]; ok {
				if m.n, err = countOf(m.k, it); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// getMulti fetches keys, the members' items, in one multi-key gets.
func (b *Backend) getMulti(ctx context.Context, ms []member, keys []string) (map[string]*memcache.Item, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("memcached: %w", err)
	}
	items, err := b.c.GetMulti(keys)
	if err != nil {
		return nil, fmt.Errorf("memcached: get the %d members of %q: %w", len(ms), ms[0].k.id, err)
	}
	return items, nil
}

// countOf reads a counter item; a missing one (nil) counts 0.
func countOf(k itemKeys, it *memcache.Item) (int64, error) {
	if it == nil {
		return 0, nil
	}
	return parseCount(k, it)
}

// decide answers op (OpPeek, or a Take that would be denied) of cost from
// what readMembers read, writing nothing.
func (m *member) decide(op throttler.Op, cost int64, now time.Time) (throttler.Decision, error) {
	if m.fixed {
		var resetAt time.Time
		if m.w.open {
			resetAt = resetTime(m.w.resetAt, now)
		}
		if op == throttler.OpTake {
			return algo.WindowState(m.p, m.n, resetAt, now, false), nil
		}
		return algo.PeekState(m.p, m.n, resetAt, now), nil
	}
	d, _, _, _, err := compute(m.p, m.it, op, cost, 0, now.UnixMilli())
	if errors.Is(err, errDecode) {
		return d, fmt.Errorf("memcached: state of %q (%d bytes): %w", m.k.id, len(m.it.Value), ErrBadItem)
	}
	return d, err
}

// takeMembers takes cost from every member, which each admitted it when
// read (ds holds those Decisions), the tightest first; if one denies or
// fails, it undoes those taken before it.
func (b *Backend) takeMembers(ctx context.Context, key string, ms []member, cost int64, now time.Time, ds *[throttler.MaxMembers]throttler.Decision) (throttler.Decision, error) {
	var order [throttler.MaxMembers]int
	for i := range ms {
		// Insertion by Remaining, stable: the composite's order breaks ties.
		j := i
		for ; j > 0 && ds[order[j-1]].Remaining > ds[i].Remaining; j-- {
			order[j] = order[j-1]
		}
		order[j] = i
	}
	for pos, i := range order[:len(ms)] {
		d, err := b.takeMember(ctx, key, &ms[i], cost, now)
		if err == nil && d.Allowed {
			ds[i] = d
			continue
		}
		// Undo even when ctx is done: skipping it would leave units
		// counted that nobody took.
		uerr := b.undoMembers(context.WithoutCancel(ctx), ms, order[:pos], cost, now, ds)
		switch {
		case err != nil && uerr != nil:
			return throttler.Decision{}, fmt.Errorf("%w (and undoing the members taken before it: %v)", err, uerr)
		case err != nil:
			return throttler.Decision{}, err
		case uerr != nil:
			return throttler.Decision{}, uerr
		}
		ds[i] = d
		return throttler.Combine(ds[:len(ms)]), nil
	}
	return throttler.Combine(ds[:len(ms)]), nil
}

// takeMember is member m's own Take of cost, from what readMembers read.
func (b *Backend) takeMember(ctx context.Context, key string, m *member, cost int64, now time.Time) (throttler.Decision, error) {
	if !m.fixed {
		var d throttler.Decision
		t := now.UnixMilli()
		err := b.update(ctx, m.k.state(), m.k.id, "state", b.opts.MaxAttempts, now, &readItem{m.it}, func(it *memcache.Item) (value []byte, end int64, write bool, err error) {
			d, value, end, write, err = compute(m.p, it, throttler.OpTake, cost, 0, t)
			m.wrote = value
			return value, end, write, err
		})
		return d, err
	}
	if m.w.open {
		d, err := b.count(ctx, m.k, m.p, cost, now, m.w.resetAt, false, false)
		if !errors.Is(err, errStale) {
			return d, err
		}
		b.forget(m.k)
	}
	return b.take(ctx, key, m.p, cost, now)
}

// undoMembers undoes the Takes of cost of the members at the indexes
// taken, whose Decisions are in ds; each member's Decision becomes its state
// after the undo, Allowed (it admitted). The first failure is returned,
// after every undo was tried.
func (b *Backend) undoMembers(ctx context.Context, ms []member, taken []int, cost int64, now time.Time, ds *[throttler.MaxMembers]throttler.Decision) error {
	var first error
	for _, i := range taken {
		d, err := b.undo(ctx, &ms[i], cost, ds[i], now)
		if err != nil {
			first = cmp.Or(first, err)
			continue
		}
		d.Allowed, d.RetryAfter = true, 0
		ds[i] = d
	}
	return first
}

// undo is the exact inverse of member m's admitted Take of cost, whose
// Decision was taken: it gives the units back to what counted them, and
// returns the member's state after it as a Peek at now.
//
//   - fixed window: decr of the counter the Take incremented (its reset-at
//     is taken's ResetAt), which stops at zero as a Refund's does.
//   - token bucket: cost tokens back, up to the capacity, when no refill
//     has happened since the Take (the stored last refill is the Take's):
//     exactly the bucket the Take's absence would have left. After a
//     refill of R scaled units, the bucket without the Take may have been
//     full in between, and lost up to R of the refill to the cap: only
//     cost·w − R go back, so an undo never credits a token the Take's
//     absence would not have left (it may credit less: more stays
//     counted, until refilled).
//   - sliding-window counter: cost off the window the Take counted in (its
//     index is taken's ResetAt/w - 1), whether that is still the current
//     one (curr) or now the previous one (prev); older, it weighs nothing.
//   - sliding log: cost off the entry of the Take's ms, now, which holds
//     the Take's units (entries of one ms merge).
//
// Unlike a Refund, it needs no receipt check: it names the very item and
// entry the Take wrote, which the call made a round trip ago.
func (b *Backend) undo(ctx context.Context, m *member, cost int64, taken throttler.Decision, now time.Time) (throttler.Decision, error) {
	r := taken.ResetAt.UnixMilli()
	if m.fixed {
		var n int64
		v, err := b.c.Decrement(m.k.counter(r), uint64(cost))
		switch {
		case errors.Is(err, memcache.ErrCacheMiss):
			// Evicted in between: nothing is counted any more.
		case err != nil:
			return throttler.Decision{}, fmt.Errorf("memcached: undo the composite's count of %q (the window keeps %d units too many until it ends): %w", m.k.id, cost, err)
		default:
			if n, err = used(m.k, v); err != nil {
				return throttler.Decision{}, err
			}
		}
		return algo.PeekState(m.p, n, taken.ResetAt, now), nil
	}
	var d throttler.Decision
	t := now.UnixMilli()
	err := b.update(ctx, m.k.state(), m.k.id, "state", b.opts.MaxAttempts, now, nil, func(it *memcache.Item) ([]byte, int64, bool, error) {
		value, end, write, err := inverse(m.p, it, m.wrote, cost, r, t)
		if err != nil {
			return nil, 0, false, err
		}
		if write {
			it = &memcache.Item{Value: value}
		}
		d, _, _, _, err = compute(m.p, it, throttler.OpPeek, 1, 0, t)
		return value, end, write, err
	})
	if err != nil {
		return throttler.Decision{}, fmt.Errorf("%w (undoing the composite's take of %d units)", err, cost)
	}
	return d, nil
}

// inverse computes, from the state item it (nil: none), the state without
// an admitted Take of cost made at t whose ResetAt was r and which wrote
// the state wrote (see undo), and whether there is anything to write.
func inverse(p throttler.Policy, it *memcache.Item, wrote []byte, cost, r, t int64) (value []byte, end int64, write bool, err error) {
	if it == nil {
		return nil, 0, false, nil // expired or evicted: nothing counts the units
	}
	w := p.Window.Milliseconds()
	switch p.Algorithm {
	case throttler.TokenBucket:
		st, err := decodeBucket(it.Value)
		if err != nil || st.Window != w {
			return nil, 0, false, err
		}
		taken, err := decodeBucket(wrote)
		if err != nil {
			return nil, 0, false, err
		}
		back := cost * w // cost <= capacity: no overflow
		switch {
		case st.At < taken.At:
			// Not the bucket the Take wrote (evicted, and made anew by a
			// clock behind): the units are not in it.
			return nil, 0, false, nil
		case st.At > taken.At:
			// Refilled since: (At − taken.At)·Limit, compared before it
			// is formed.
			if (st.At - taken.At) >= ceilDivInt(back, p.Limit) {
				return nil, 0, false, nil
			}
			back -= (st.At - taken.At) * p.Limit
		}
		full := p.Capacity() * w
		st.Tokens = min(full, min(max(st.Tokens, 0), full)+back)
		return appendBucket(make([]byte, 0, 24), st), algo.TokenBucketEnd(p, st), true, nil
	case throttler.SlidingWindow:
		st, err := decodeCounter(it.Value)
		if err != nil || st.Window != w {
			return nil, 0, false, err
		}
		switch k := r/w - 1; st.K {
		case k:
			st.Curr = max(0, st.Curr-cost)
		case k + 1:
			st.Prev = max(0, st.Prev-cost)
		default:
			return nil, 0, false, nil
		}
		return appendCounter(make([]byte, 0, 32), st), algo.CounterEnd(p, st), true, nil
	case throttler.SlidingLog:
		log, err := decodeLog(it.Value)
		if err != nil {
			return nil, 0, false, err
		}
		for i := range log {
			if log[i].At != t {
				continue
			}
			if log[i].Units -= min(cost, log[i].Units); log[i].Units == 0 {
				log = append(log[:i], log[i+1:]...)
			}
			return appendLog(make([]byte, 0, len(it.Value)), log), algo.LogEnd(p, log), true, nil
		}
	}
	return nil, 0, false, nil
}

// ceilDivInt is ceil(a/b) for a >= 0, b > 0.
func ceilDivInt(a, b int64) int64 { return (a + b - 1) / b }
