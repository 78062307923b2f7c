package memory

import (
	"sync"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// A composite's call (see throttler.All) runs under one lock: its members'
// states are slots of one key, and the key's hash alone picks the shard
// (and places the slots in its table), so the key's shard lock covers them
// all, whatever their identities. Nothing else is locked, so no lock order
// can deadlock.
//
// A Take whose members all have stored state on a single Take's fast path
// (fast.go) runs each member's Take on a copy of its slot, and stores the
// copies only when every one admitted (takeStored). Any other Take first
// asks every member whether it admits the cost, reading without writing (a
// Take of cost is admitted exactly when a Peek at the same now says
// Remaining >= cost, on every algorithm); only when all do does it take from
// each, through the path a single Take takes. So a denied composite writes
// nothing, and an admitted one leaves each member as that member's own Take
// would have: nothing forks. The one exception, in a full shard, is undone
// by refunds (see undo).

// allMemo is a shard's memo of the composite its last composite call
// named, which was valid, and its members' identity numbers: Policy values
// compare equal only for copies of one composite (they share its members),
// so comparing p costs a few words, not a validation.
type allMemo struct {
	p   throttler.Policy
	n   int
	ms  [throttler.MaxMembers]throttler.Policy
	ids [throttler.MaxMembers]uint32
	cap int64 // the least capacity: the largest cost a Take may have
}

// allMemos are the shards' memos, made at a Backend's first composite call.
type allMemos struct {
	once sync.Once
	m    []allMemo
}

// memo returns the locked shard i's memo of the valid composite p.
func (b *Backend) memo(i int, p *throttler.Policy) (*allMemo, error) {
	b.alls.once.Do(func() { b.alls.m = make([]allMemo, len(b.shards)) })
	m := &b.alls.m[i]
	if m.n != 0 && m.p == *p {
		return m, nil
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	*m = allMemo{p: *p, cap: p.Capacity()}
	for i, mp := range p.Members() {
		m.ms[i], m.ids[i], m.n = mp, b.ids.number(ident(&mp)), i+1
	}
	return m, nil
}

// composite runs op (OpTake or OpPeek) of cost under the composite p.
func (b *Backend) composite(op throttler.Op, key string, p *throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	if key == "" || len(key) > throttler.MaxKeyLen {
		return throttler.Decision{}, throttler.ValidateCall(op, key, *p, cost, time.Time{}) // the key's error
	}
	s, h := b.lock(key)
	m, err := b.memo(int(h>>b.shardShift), p)
	if err == nil && op == throttler.OpTake && (cost < 1 || cost > m.cap) {
		err = throttler.ValidateCall(op, key, *p, cost, time.Time{}) // the cost's error
	}
	if err != nil {
		s.mu.Unlock()
		return throttler.Decision{}, err
	}
	defer s.mu.Unlock()
	ms := now.UnixMilli()
	if b.observe(s, ms) {
		b.sweep(s, ms, true)
	}
	var ds [throttler.MaxMembers]throttler.Decision
	if op == throttler.OpTake && b.takeStored(s, h, m, key, cost, ms, &ds) {
		return throttler.Combine(ds[:m.n]), nil
	}
	all := true
	for i := range m.n {
		d, err := b.memberOp(s, h, m, i, throttler.OpPeek, key, 1, 0, ms, now)
		if err != nil {
			return throttler.Decision{}, err
		}
		if op == throttler.OpTake {
			// A Peek answers for one unit; the member admits cost iff it
			// has that many left.
			d.Allowed, d.RetryAfter = d.Remaining >= cost, 0
		}
		ds[i] = d
		all = all && d.Allowed
	}
	if op == throttler.OpTake {
		for i := range m.n {
			if all || !ds[i].Allowed {
				// Every member takes, or a denying one says why: its own
				// denied Take, which writes nothing.
				if ds[i], err = b.memberOp(s, h, m, i, op, key, cost, 0, ms, now); err != nil {
					return throttler.Decision{}, err
				}
				if all && !ds[i].Allowed {
					return b.undo(s, h, m, i, key, cost, ds, ms, now)
				}
			}
		}
	}
	return throttler.Combine(ds[:m.n]), nil
}

// memberOp runs op on member i of the memo's composite, in the locked s.
func (b *Backend) memberOp(s *shard, h uint64, m *allMemo, i int, op throttler.Op, key string, cost, r, ms int64, now time.Time) (throttler.Decision, error) {
	return b.answerLocked(s, h, s.table.find(h, key, m.ids[i]), m.ids[i], op, key, &m.ms[i], cost, r, ms, now)
}

// undo answers a composite whose member i denied the Take that its Peek had
// admitted, after members 0 to i-1 took: refunding what they took, each
// under its Take's receipt. It happens only in a full shard, when making
// room for one member's new state moved another's into the second tier and
// a cell shared with another state answers for it more strictly than its
// own state would have (see Eviction). The result is a denied composite.
func (b *Backend) undo(s *shard, h uint64, m *allMemo, i int, key string, cost int64, ds [throttler.MaxMembers]throttler.Decision, ms int64, now time.Time) (throttler.Decision, error) {
	for j := range i {
		d, err := b.memberOp(s, h, m, j, throttler.OpRefund, key, cost, ds[j].ResetAt.UnixMilli(), ms, now)
		if err != nil {
			return throttler.Decision{}, err
		}
		ds[j] = d
	}
	return throttler.Combine(ds[:m.n]), nil
}

// takeStored is the common composite Take, done without the Peeks and the
// general path: every member has stored state that a single Take would
// take on its fast path (fast.go; not a log, whose buffer is not a slot's
// value), and each admits. Each member's Take runs first on a copy of its
// slot, and only when all are admitted on the slots themselves, filling ds
// in. Otherwise it changes nothing and reports false.
func (b *Backend) takeStored(s *shard, h uint64, m *allMemo, key string, cost, ms int64, ds *[throttler.MaxMembers]throttler.Decision) bool {
	var slots [throttler.MaxMembers]*slot
	for i := range m.n {
		w := s.table.find(h, key, m.ids[i])
		if w == nil {
			return false
		}
		c := *w // a dry run, on a copy
		if _, _, ok := c.takeFast(&m.ms[i], cost, ms); !ok {
			return false
		}
		slots[i] = w
	}
	for i := range m.n {
		// The same Take again, now on the slot: the same answer.
		w, p := slots[i], &m.ms[i]
		used, resetAt, _ := w.takeFast(p, cost, ms)
		w.used1()
		c := p.Capacity()
		ds[i] = throttler.Decision{Allowed: true, Limit: c, Used: used, Remaining: max(c-used, 0), ResetAt: time.UnixMilli(resetAt)}
	}
	return true
}

// takeFast is a single Take's fast path (fast.go) for p on w, but a log's.
func (w *slot) takeFast(p *throttler.Policy, cost, ms int64) (used, resetAt int64, ok bool) {
	switch p.Algorithm {
	case throttler.FixedWindow:
		return w.takeFixed(p.Limit, cost, ms)
	case throttler.TokenBucket:
		return w.takeBucket(p.Limit, p.Capacity(), p.Window.Milliseconds(), cost, ms)
	case throttler.SlidingWindow:
		return w.takeCounter(p.Limit, p.Window.Milliseconds(), cost, ms)
	}
	return 0, 0, false
}
