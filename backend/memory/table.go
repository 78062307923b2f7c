package memory

import (
	"strings"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/throttler"
)

// table is an open-addressing hash table of windows with linear probing,
// keyed by (key, policy) and placed by the hash of the key alone, so a call
// hashes once and the windows of one key under several policies sit side by
// side. A slot holds its window inline, and short keys too: finding a window
// touches only its slot (and a long key's bytes), and an update happens in
// place. Not safe for concurrent use:
// a shard's mutex guards it.
//
// An ended window is reused by its own key, and sweeps drop every ended one
// in place (see sweep); the array grows when three quarters full and shrinks
// when an eighth.
type table struct {
	slots []slot
	live  int // used slots
}

type slot struct {
	hash    uint64
	key     slotKey
	policy  policyID
	used    int64
	resetAt int64              // Unix milliseconds
	prev    int64              // a sliding-window counter's previous count
	window  int64              // a bucket's or counter's window (ms) when written
	end     int64              // Unix ms from which the state answers like none: a sweep may drop it
	log     *backend.LogBuffer // a sliding log's entries, apart so that other algorithms' slots stay small
	leases  *backend.LeaseSet  // a concurrency limit's leases (lease.go), apart likewise
	uses    uint8              // calls since the eviction hand last passed, up to maxUses (evict.go)
}

// policyID is a policy's storage identity: its name and algorithm, or for
// an unnamed policy its whole definition (see backend.Identity).
type policyID struct {
	name                 string
	limit, window, burst int64 // 0 for a named policy
	alg                  throttler.Algorithm
}

// shortKey is the longest key a slot holds inline: IP addresses, user IDs
// and most tokens fit, and comparing them reads no other memory.
const shortKey = 22

// slotKey is a key held inline when short, else as a string of its own. The
// zero value marks an empty slot: keys are never empty.
type slotKey struct {
	n     uint8 // length of an inline key; 0 for a long one
	short [shortKey]byte
	long  string
}

func makeSlotKey(k string) slotKey {
	if len(k) > shortKey {
		// Copied: the table keeps it for the window's life, and a
		// caller's string may share a large buffer, or one it reuses.
		return slotKey{long: strings.Clone(k)}
	}
	sk := slotKey{n: uint8(len(k))}
	copy(sk.short[:], k)
	return sk
}

func (k *slotKey) empty() bool { return k.n == 0 && k.long == "" }

func (k *slotKey) equal(s string) bool {
	if k.n == 0 {
		return k.long == s
	}
	return int(k.n) == len(s) && string(k.short[:k.n]) == s
}

const minSlots = 8

// find returns the slot of (key, policy), or nil.
func (t *table) find(h uint64, key string, policy policyID) *slot {
	if len(t.slots) == 0 {
		return nil
	}
	mask := uint64(len(t.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.key.empty() {
			return nil
		}
		if s.hash == h && s.key.equal(key) && s.policy == policy {
			return s
		}
	}
}

// crowded reports whether one more slot would fill the table past three
// quarters, where probe runs grow long: time to sweep or grow.
func (t *table) crowded() bool { return (t.live+1)*4 > len(t.slots)*3 }

// insert adds an empty slot for (key, policy), which must not be present,
// to a table that is not crowded.
func (t *table) insert(h uint64, key string, policy policyID) *slot {
	mask := uint64(len(t.slots) - 1)
	i := h & mask
	for !t.slots[i].key.empty() {
		i = (i + 1) & mask
	}
	t.live++
	t.slots[i] = slot{hash: h, key: makeSlotKey(key), policy: policy}
	return &t.slots[i]
}

// sweep drops every slot that ended by ref, in place, and returns how many
// it dropped. Each removal moves the later slots of its probe run back
// (backward-shift deletion), so every slot stays reachable without
// tombstones and no new array is made.
func (t *table) sweep(ref int64) int {
	if t.live == 0 {
		return 0
	}
	n := len(t.slots)
	// Start after an empty slot (one exists: the table is at most three
	// quarters full), so that each probe run is visited from its start
	// and removals only move slots the scan has not reached yet.
	start := 0
	for !t.slots[start].key.empty() {
		start++
	}
	mask := n - 1
	dropped := 0
	for k := 1; k <= n; k++ {
		i := (start + k) & mask
		for s := &t.slots[i]; !s.key.empty() && s.end <= ref; {
			t.remove(i) // moves a later slot into i, if any: look again
			dropped++
		}
	}
	t.live -= dropped
	return dropped
}

// remove empties slot i, moving each later slot of its probe run back into
// the hole unless its home slot lies between the hole and it.
func (t *table) remove(i int) {
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; !t.slots[j].key.empty(); j = (j + 1) & mask {
		home := int(t.slots[j].hash) & mask
		stays := i < home && home <= j // the run does not wrap between i and j
		if j < i {
			stays = i < home || home <= j
		}
		if !stays {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = slot{}
}

// resize moves the slots into a new array of n slots, a power of two that
// holds them without crowding.
func (t *table) resize(n int) {
	old := t.slots
	t.slots = make([]slot, n)
	mask := uint64(n - 1)
	for _, s := range old {
		if s.key.empty() {
			continue
		}
		i := s.hash & mask
		for !t.slots[i].key.empty() {
			i = (i + 1) & mask
		}
		t.slots[i] = s
	}
}

// sizeFor is the number of slots for live slots after a shrink: a quarter
// full at most, so that it takes many inserts to grow again.
func sizeFor(live int) int {
	n := minSlots
	for n < live*4 {
		n *= 2
	}
	return n
}
