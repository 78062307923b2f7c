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
// Nothing is deleted in place: an ended window is reused by its own key, and
// rebuild drops every ended window at once (when the table grows, and in the
// sweeps), which keeps probing simple.
type table struct {
	slots []slot
	live  int // used slots
}

type slot struct {
	hash    uint64
	key     slotKey
	policy  policyID
	used    int64
	resetAt int64 // Unix milliseconds
	prev    int64 // a sliding-window counter's previous count
	window  int64 // a bucket's or counter's window (ms) when written
	end     int64 // Unix ms from which the state answers like none: a sweep may drop it
	log     *logBuf
}

// logBuf holds a sliding log's entries, apart from the slot so that other
// algorithms' slots stay small.
type logBuf struct {
	entries []backend.LogEntry
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

// insert adds an empty window for (key, policy), which must not be present,
// growing the table when it is three quarters full. Growing also drops the
// windows that ended by latest.
func (t *table) insert(h uint64, key string, policy policyID, latest int64) *slot {
	if (t.live+1)*4 > len(t.slots)*3 {
		t.rebuild(latest, true)
	}
	mask := uint64(len(t.slots) - 1)
	i := h & mask
	for !t.slots[i].key.empty() {
		i = (i + 1) & mask
	}
	t.live++
	t.slots[i] = slot{hash: h, key: makeSlotKey(key), policy: policy}
	return &t.slots[i]
}

// rebuild drops the windows that ended by latest and rehashes the rest into
// a table sized for them (twice as large if grow is set and they still fill
// it past three quarters).
func (t *table) rebuild(latest int64, grow bool) {
	live := 0
	for i := range t.slots {
		if !t.slots[i].key.empty() && t.slots[i].end > latest {
			live++
		}
	}
	n := minSlots
	for (live+1)*4 > n*3 || (grow && live*2 > n) {
		n *= 2
	}
	if live == t.live && n == len(t.slots) {
		return // nothing ended and the size is right: no new table
	}
	old := t.slots
	t.slots, t.live = make([]slot, n), 0
	mask := uint64(n - 1)
	for _, s := range old {
		if s.key.empty() || s.end <= latest {
			continue
		}
		i := s.hash & mask
		for !t.slots[i].key.empty() {
			i = (i + 1) & mask
		}
		t.slots[i] = s
		t.live++
	}
}
