package memory

import (
	"sync"
	"sync/atomic"

	"github.com/throttlekit/throttlekit/throttler"
)

// policyID is a policy's storage identity: its name and algorithm, or for
// an unnamed policy its whole definition (see identity.Rate).
type policyID struct {
	name                 string
	limit, window, burst int64 // 0 for a named policy
	alg                  throttler.Algorithm
}

// ident is the storage identity of p, without an allocation.
func ident(p *throttler.Policy) policyID {
	if p.Name != "" {
		return policyID{name: p.Name, alg: p.Algorithm}
	}
	return policyID{limit: p.Limit, window: int64(p.Window), burst: p.Burst, alg: p.Algorithm}
}

// idents numbers the policy identities a Backend has seen, so that a slot
// holds four bytes for its policy instead of the identity. Identities are
// few (they come from configuration), and each costs about 100 bytes for
// the Backend's life: a program that makes a policy per key (an unnamed
// policy whose Limit differs per client) should name it. Safe for
// concurrent use: the map is replaced, never changed, when an identity is
// first seen, so a lookup takes no lock.
type idents struct {
	m  atomic.Pointer[map[policyID]uint32]
	mu sync.Mutex // serialises additions
}

// number returns id's number, 1 or more, numbering it if it is new.
func (n *idents) number(id policyID) uint32 {
	if m := n.m.Load(); m != nil {
		if k, ok := (*m)[id]; ok {
			return k
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	var old map[policyID]uint32
	if m := n.m.Load(); m != nil {
		old = *m
	}
	if k, ok := old[id]; ok {
		return k
	}
	m := make(map[policyID]uint32, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	k := uint32(len(old) + 1)
	m[id] = k
	n.m.Store(&m)
	return k
}

// lastPolicy is a shard's memo of the policy its last call named, which
// was valid, its identity's number, and what the calls' fast paths read of
// it: callers pass the same Policy value call after call, so comparing it
// (the name's bytes are the same string, compared by pointer first) is
// cheaper than validating it and looking its identity up.
type lastPolicy struct {
	name                 string
	limit, window, burst int64
	alg                  throttler.Algorithm
	id                   uint32
	capacity             int64 // Policy.Capacity
}

// policy validates p and returns the locked shard s's memo of it, from the
// memo itself when p is the policy its last call named.
func (b *Backend) policy(s *shard, p *throttler.Policy) (*lastPolicy, error) {
	m := &s.last
	if m.id != 0 && p.Name == m.name && p.Algorithm == m.alg && p.Limit == m.limit &&
		int64(p.Window) == m.window && p.Burst == m.burst {
		return m, nil
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	*m = lastPolicy{
		name: p.Name, limit: p.Limit, window: int64(p.Window), burst: p.Burst, alg: p.Algorithm,
		id: b.ids.number(ident(p)), capacity: p.Capacity(),
	}
	return m, nil
}

// fits reports whether a cost is valid for op under the memo's policy, as
// throttler.ValidateCall does, without its call: 1 to the Capacity for a Take,
// 1 to MaxLimit for a Refund, anything for a Peek.
func (m *lastPolicy) fits(op throttler.Op, cost int64) bool {
	hi := m.capacity
	switch op {
	case throttler.OpPeek:
		return true
	case throttler.OpRefund:
		hi = throttler.MaxLimit
	}
	return uint64(cost-1) < uint64(hi) // cost <= 0 wraps above any hi
}

// kindOf is the kind of state an algorithm keeps.
func kindOf(a throttler.Algorithm) uint8 {
	switch a {
	case throttler.TokenBucket:
		return kindBucket
	case throttler.SlidingWindow:
		return kindCounter
	case throttler.SlidingLog:
		return kindLog
	}
	return kindFixed
}
