package throttler

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// The fallback (Options.Fallback) answers while the primary fails, under
// two rules that keep a fleet in fallback near its limits:
//
//   - A share: the fallback counts each policy at Limit (and a token
//     bucket's Burst) divided by Options.FallbackFleetSize, rounded down,
//     never below 1, so that the fleet's processes together admit about
//     one limit. Its Decisions report the policy's own Limit, and
//     Remaining what this process's share has left.
//   - Stints: once the fallback answers a Take or a Peek of a key under a
//     policy, it answers every Take and Peek of that key under that policy
//     (alone or in a composite) until the state it counted has ended (see
//     stintEnd), without calling the primary. So one store answers a
//     window: a client never sees two stores' windows and headers
//     interleave, nor a fresh window from the primary while the fallback's
//     is open.

// maxStints bounds the keys a Throttler holds in stints. Beyond it, a key
// the fallback answers is not held: its next call may go to the primary
// before its fallback window ends.
const maxStints = 1 << 20

// stintSweepEvery is how often, on the callers' clock, ended stints are
// swept from a table that holds any.
const stintSweepEvery = time.Second

// stintKey is a policy's storage identity on a key (see sameIdentity):
// what one store's state answers. A composite's members each have theirs.
type stintKey struct {
	key       string
	name      string
	algorithm Algorithm
	// limit, window and burst are zero for a named policy.
	limit, burst int64
	window       time.Duration
}

func stintKeyOf(key string, p Policy) stintKey {
	k := stintKey{key: key, name: p.Name, algorithm: p.Algorithm}
	if p.Name == "" {
		k.limit, k.window, k.burst = p.Limit, p.Window, p.Burst
	}
	return k
}

// stints are the keys the fallback holds, each until its stint's end.
type stints struct {
	held atomic.Int64 // len(ends), read without the lock on every call
	mu   sync.Mutex
	ends map[stintKey]time.Time
	// nextSweep is when ended stints are next swept out.
	nextSweep time.Time
}

// holds reports whether r's key is in a stint under r's policy (any of a
// composite's members) at r.now: the fallback answers it. Inlined: a nil
// table (no fallback) and an empty one cost a load on every call.
func (s *stints) holds(r *request) bool {
	return s != nil && s.held.Load() != 0 && s.lookup(r)
}

// lookup is holds for a table that holds keys.
func (s *stints) lookup(r *request) bool {
	if r.op != OpTake && r.op != OpPeek {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweep(r.now)
	if r.p.all == nil {
		return s.open(stintKeyOf(r.key, r.p), r.now)
	}
	held := false
	for _, m := range r.p.all.members {
		held = s.open(stintKeyOf(r.key, m), r.now) || held
	}
	return held
}

// open reports whether k's stint is open at now, and forgets it once it
// has ended.
func (s *stints) open(k stintKey, now time.Time) bool {
	end, ok := s.ends[k]
	if ok && !now.Before(end) {
		s.forget(k)
		return false
	}
	return ok
}

func (s *stints) forget(k stintKey) {
	delete(s.ends, k)
	s.held.Store(int64(len(s.ends)))
}

// sweep forgets the stints ended by now, at most once per stintSweepEvery
// of the callers' clock (and again if that clock steps back).
func (s *stints) sweep(now time.Time) {
	if now.Before(s.nextSweep) && !now.Before(s.nextSweep.Add(-stintSweepEvery)) {
		return
	}
	s.nextSweep = now.Add(stintSweepEvery)
	for k, end := range s.ends {
		if !now.Before(end) {
			delete(s.ends, k)
		}
	}
	s.held.Store(int64(len(s.ends)))
}

// hold starts or extends the stints of r's key under r's policy (p, the
// caller's, unscaled) after the fallback answered d at r.now.
func (s *stints) hold(r *request, p Policy, d Decision) {
	if s == nil || (r.op != OpTake && r.op != OpPeek) {
		return
	}
	opened := r.op == OpTake && d.Allowed // a window the Take counted in
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.all == nil {
		s.extend(stintKeyOf(r.key, p), stintEnd(p, d.ResetAt, r.now), true, opened, d.ResetAt)
		return
	}
	// A composite held by one member's stint starts none for the others:
	// its members' stints, restarting one another, would never all end.
	for i, m := range p.all.members {
		resetAt := d.member(i).ResetAt
		s.extend(stintKeyOf(r.key, m), stintEnd(m, resetAt, r.now), !r.stint, opened, resetAt)
	}
}

// extend starts k's stint, to end, if start says so, or, when one is
// open, keeps its end: only a fixed window's reaches the ResetAt of a
// window that an admitted Take counted in (one a Take opened inside a
// stint a Peek started). Any other extension would never end while a
// client keeps calling.
func (s *stints) extend(k stintKey, end time.Time, start, counted bool, resetAt time.Time) {
	if old, ok := s.ends[k]; ok {
		if counted && k.algorithm == FixedWindow && resetAt.After(old) {
			s.ends[k] = resetAt
		}
		return
	}
	if !start || len(s.ends) >= maxStints {
		return // the key goes unheld
	}
	if s.ends == nil {
		s.ends = make(map[stintKey]time.Time)
	}
	s.ends[k] = end
	s.held.Store(int64(len(s.ends)))
}

// stintEnd is when a stint of p that the fallback started at now with a
// Decision whose ResetAt is resetAt ends: when the fallback's state has
// ended (a fixed window's ResetAt), and no sooner than the primary's state
// has forgotten every unit counted before now (p's span), so that the
// primary, answering again, neither reopens a window the fallback has
// replaced nor hands out a fresh one early.
func stintEnd(p Policy, resetAt, now time.Time) time.Time {
	end := now.Add(span(p))
	if resetAt.After(end) {
		return resetAt
	}
	return end
}

// span is how long after its last counted unit a key's state under p
// holds units: a fixed window's or a sliding log's Window, a sliding-window
// counter's two windows, the time a token bucket takes to refill from
// empty (Capacity·Window/Limit, rounded up to the ms).
func span(p Policy) time.Duration {
	w := p.Window.Milliseconds()
	switch p.Algorithm {
	case SlidingWindow:
		return 2 * p.Window
	case TokenBucket:
		c := p.Capacity()
		return time.Duration((c*w+p.Limit-1)/p.Limit) * time.Millisecond // c·w <= 2^53: validated
	}
	return p.Window
}

// share is p as this process's fallback counts it: Limit and Burst divided
// by the fleet size, rounded down, at least 1. An unnamed policy gets a
// name from its definition, so that its share never shares a state with
// another unnamed policy whose definition is the share's (PerMinute(100)
// over 4 processes, and PerMinute(25)). A composite's members are shared
// each.
func share(p Policy, fleet int64) Policy {
	if fleet <= 1 {
		return p
	}
	if p.all != nil {
		members := make([]Policy, len(p.all.members))
		for i, m := range p.all.members {
			members[i] = share(m, fleet)
		}
		return Policy{all: newComposite(members)}
	}
	if p.Name == "" {
		p.Name = fmt.Sprintf("~%d/%dms/%v/%d", p.Limit, p.Window.Milliseconds(), p.Algorithm, p.Burst)
	}
	p.Limit = max(p.Limit/fleet, 1)
	if p.Burst != 0 {
		p.Burst = max(p.Burst/fleet, 1)
	}
	return p
}

// callFallback makes r on the fallback, at r.now: a rate call under its
// policy's share, its Decision reported under the policy itself and held
// in a stint. Its Decision is Degraded, and so are a composite's members'.
func (t *Throttler) callFallback(ctx context.Context, r *request) (Decision, error) {
	if r.isLease() {
		d, _, err := t.call(ctx, &t.fallback, r, r.now)
		d.Degraded = true
		return d, err
	}
	p := r.p
	r.p = share(p, int64(t.opts.FallbackFleetSize))
	d, err := t.callShare(ctx, r)
	r.p = p
	if err != nil {
		return d, err
	}
	unshare(&d, p)
	t.stints.hold(r, p, d)
	d.Degraded = true
	if d.nMembers != 0 {
		markDegraded(&d)
	}
	return d, nil
}

// callShare makes r, under its share, on the fallback. A Take of more than
// the share's capacity can never be admitted there: it is denied, counting
// nothing, with the key's state as a Peek reads it and a RetryAfter to the
// end of that state's window, when the primary may answer again.
func (t *Throttler) callShare(ctx context.Context, r *request) (Decision, error) {
	if r.op != OpTake || r.n <= r.p.Capacity() {
		d, _, err := t.call(ctx, &t.fallback, r, r.now)
		return d, err
	}
	r.op = OpPeek
	d, _, err := t.call(ctx, &t.fallback, r, r.now)
	r.op = OpTake
	d.Allowed = false
	d.RetryAfter = max(d.ResetAt.Sub(r.now), time.Millisecond)
	return d, err
}

// unshare reports d, the fallback's Decision under p's share, under p: the
// policy's own Limit (what a healthy store reports, so that headers hold
// still), the share's Remaining, and Used = Limit - Remaining (the share's
// use and the other processes' shares).
func unshare(d *Decision, p Policy) {
	if p.all == nil {
		d.Limit = p.Capacity()
		d.Used = d.Limit - min(d.Remaining, d.Limit)
		return
	}
	var ms [MaxMembers]Decision
	n := d.memberCount()
	for i := range n {
		ms[i] = d.member(i)
		unshare(&ms[i], p.all.members[i])
	}
	*d = combine(ms[:n], d.dryMembers())
}
