package memory

import (
	"encoding/binary"
	"hash/maphash"
	"slices"
	"unsafe"

	"github.com/throttlekit/throttlekit/internal/algo"
	"github.com/throttlekit/throttlekit/internal/leaseset"
)

// table is an open-addressing hash table of states with linear probing,
// keyed by (key, policy) and placed by the hash of the key alone, so a call
// hashes once and the states of one key under several policies sit side by
// side. A slot is 64 bytes, one cache line: it holds its state inline, and
// a key of up to shortKey bytes too, so finding a state touches only its
// slot, and an update happens in place. Longer keys, logs and lease sets
// live in extras beside the slots, which hold no pointers, so the garbage
// collector never scans them. Not safe for concurrent use: a shard's mutex
// guards it.
//
// An ended state is reused by its own key, and sweeps drop every ended one
// in place (see sweep). The array grows by a fifth when four fifths full,
// so that it is always two thirds to four fifths full while it grows (80
// to 96 bytes a state), and shrinks when an eighth full. Its size need not
// be a power of two: a hash's home is its 32 bits scaled to the size.
type table struct {
	slots []slot
	live  int // used slots
	// extras hold what a slot cannot: extras[i-1] is slot's extra number
	// i; free lists the numbers of unused ones.
	extras []extra
	free   []uint32
	// wide seeds a long key's second hash (wideKey): independent of the
	// Backend's, so that with the first it makes 128 bits.
	wide maphash.Seed
}

// slot is one (key, policy) state. Its four numbers hold, by kind:
//
//	kind     used          resetAt      prev               end
//	fixed    units         ResetAt      -                  ResetAt
//	bucket   scaled tokens At (t0)      window (ms)        full again
//	counter  Curr          K            Prev               window (ms)
//	log      -             -            extra number       newest entry's end
//	lease    -             -            extra number       latest expiry
//
// A counter pair's end, (K+2)·window, is computed (ends).
type slot struct {
	hash uint32         // the low 32 bits of the key's hash
	id   uint32         // the policy identity's number (see idents); 0: an empty slot
	meta uint8          // kind<<5 | the inline key's length, or longKey
	uses uint8          // calls since the eviction hand last passed (evict.go)
	key  [shortKey]byte // the key, or a long key's wide hash (wideKey)

	used, resetAt, prev, end int64
}

// shortKey is the longest key a slot holds inline: IP addresses, user IDs
// and most tokens fit, and comparing them reads no other memory.
const shortKey = 22

// longKey in a slot's meta marks a key longer than shortKey, held as its
// wide hash: the high 32 bits of the Backend's hash of it in the first four
// key bytes (the low 32 are the slot's hash), and the table's hash of it
// (seeded by wide) in the next eight. Two long keys share a state only if
// both 64-bit hashes, under two random seeds, collide: for a million keys,
// about one chance in 2^88. A collision would make two keys count against
// one state, an over-count, never an under-count.
const longKey = 31

// The kinds of state a slot holds.
const (
	kindFixed uint8 = iota
	kindBucket
	kindCounter
	kindLog
	kindLease
)

type extra struct {
	log    *algo.LogBuffer
	leases *leaseset.Set
}

func (w *slot) empty() bool { return w.id == 0 }
func (w *slot) kind() uint8 { return w.meta >> 5 }
func (w *slot) keyLen() int { return int(w.meta & 31) }
func (w *slot) long() bool  { return w.meta&31 == longKey }
func (w *slot) extraNum() uint32 {
	if k := w.kind(); k == kindLog || k == kindLease {
		return uint32(w.prev)
	}
	return 0
}

// window is the window (ms) a bucket's or counter's state was written
// under.
func (w *slot) window() int64 {
	if w.kind() == kindCounter {
		return w.end
	}
	return w.prev
}

// ends is the Unix ms from which the state answers like none: a sweep may
// drop it then.
func (w *slot) ends() int64 {
	if w.kind() == kindCounter {
		return (w.resetAt + 2) * w.end
	}
	return w.end
}

const minSlots = 8

// home is where a hash's probe run starts in a table of n slots: the hash
// scaled to n (all 32 bits count, with no power-of-two mask).
func home(h uint32, n int) int { return int(uint64(h) * uint64(n) >> 32) }

// extraOf returns w's extra, making one if it has none.
func (t *table) extraOf(w *slot) *extra {
	n := w.extraNum()
	if n == 0 {
		n = t.newExtra()
		w.prev = int64(n) // only logs and lease sets, whose prev is free, get one here
	}
	return &t.extras[n-1]
}

func (t *table) newExtra() uint32 {
	if k := len(t.free); k > 0 {
		n := t.free[k-1]
		t.free = t.free[:k-1]
		return n
	}
	t.extras = append(t.extras, extra{})
	return uint32(len(t.extras))
}

// wideKey is the 64 bits that, beside the Backend's hash h, stand for a key
// longer than shortKey in a slot.
func (t *table) wideKey(key string) uint64 { return maphash.String(t.wide, key) }

// equal reports whether w holds key, whose hash is h; wide is key's
// wideKey once computed, 0 before (a long key computes it at most once).
func (t *table) equal(w *slot, h uint64, key string, wide *uint64) bool {
	if len(key) <= shortKey {
		n := w.keyLen() // longKey for a long one: never a short key's length
		return n == len(key) && string(w.key[:n]) == key
	}
	if !w.long() || binary.LittleEndian.Uint32(w.key[:4]) != uint32(h>>32) {
		return false
	}
	if *wide == 0 {
		*wide = t.wideKey(key) | 1 // never 0: 0 is "not computed"
	}
	return binary.LittleEndian.Uint64(w.key[4:12]) == *wide
}

// find returns the slot of (key, policy id), or nil.
func (t *table) find(h uint64, key string, id uint32) *slot {
	if len(t.slots) == 0 {
		return nil
	}
	n := len(t.slots)
	h32 := uint32(h)
	var wide uint64
	for i := home(h32, n); ; {
		s := &t.slots[i]
		if s.empty() {
			return nil
		}
		if s.hash == h32 && s.id == id && t.equal(s, h, key, &wide) {
			return s
		}
		if i++; i == n {
			i = 0
		}
	}
}

// crowded reports whether one more slot would fill the table past four
// fifths, where probe runs grow long: time to sweep or grow.
func (t *table) crowded() bool { return (t.live+1)*5 > len(t.slots)*4 }

// grown is the size a crowded table of n slots grows to: a fifth more.
func grown(n int) int { return max(minSlots, n+(n+4)/5) }

// insert adds an empty state of kind for (key, policy id), which must not
// be present, to a table that is not crowded.
func (t *table) insert(h uint64, key string, id uint32, kind uint8) *slot {
	n := len(t.slots)
	i := home(uint32(h), n)
	for !t.slots[i].empty() {
		if i++; i == n {
			i = 0
		}
	}
	t.live++
	s := &t.slots[i]
	*s = slot{hash: uint32(h), id: id, meta: kind << 5}
	if len(key) > shortKey {
		// Its hashes, not the key: a state costs its slot, however long
		// the key (up to throttler.MaxKeyLen).
		s.meta |= longKey
		binary.LittleEndian.PutUint32(s.key[:4], uint32(h>>32))
		binary.LittleEndian.PutUint64(s.key[4:12], t.wideKey(key)|1)
	} else {
		s.meta |= uint8(len(key))
		copy(s.key[:], key)
	}
	return s
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
	for !t.slots[start].empty() {
		start++
	}
	dropped := 0
	for k := 1; k <= n; k++ {
		i := start + k
		if i >= n {
			i -= n
		}
		for s := &t.slots[i]; !s.empty() && s.ends() <= ref; {
			t.remove(i) // moves a later slot into i, if any: look again
			dropped++
		}
	}
	t.live -= dropped
	return dropped
}

// remove empties slot i, releasing its extra, and moves each later slot of
// its probe run back into the hole unless its home slot lies between the
// hole and it. The caller counts live.
func (t *table) remove(i int) {
	if n := t.slots[i].extraNum(); n != 0 {
		t.extras[n-1] = extra{}
		t.free = append(t.free, n)
	}
	n := len(t.slots)
	next := func(j int) int {
		if j++; j == n {
			return 0
		}
		return j
	}
	for j := next(i); !t.slots[j].empty(); j = next(j) {
		h := home(t.slots[j].hash, n)
		stays := i < h && h <= j // the run does not wrap between i and j
		if j < i {
			stays = i < h || h <= j
		}
		if !stays {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = slot{}
}

// resize moves the slots into a new array of at least n slots, which holds
// them without crowding: as many as the allocation holds (the allocator
// rounds a size up to its size class, or to whole pages past 32 KiB, and
// the slots use it rather than waste it). With no slot left, the extras go
// too.
func (t *table) resize(n int) {
	old := t.slots
	t.slots = slices.Grow([]slot(nil), n)
	t.slots = t.slots[:cap(t.slots)]
	n = len(t.slots)
	for _, s := range old {
		if s.empty() {
			continue
		}
		i := home(s.hash, n)
		for !t.slots[i].empty() {
			if i++; i == n {
				i = 0
			}
		}
		t.slots[i] = s
	}
	if t.live == 0 {
		t.extras, t.free = nil, nil
	} else if len(t.free)*2 > len(t.extras) {
		t.compactExtras()
	}
}

// compactExtras moves the extras in use to a new array that holds just
// them, renumbering their slots: a table that shrinks after most of its
// logs or lease sets ended gives their array back too.
func (t *table) compactExtras() {
	extras := make([]extra, 0, len(t.extras)-len(t.free))
	for i := range t.slots {
		w := &t.slots[i]
		if n := w.extraNum(); n != 0 {
			extras = append(extras, t.extras[n-1])
			w.prev = int64(len(extras)) // only logs and lease sets have one: their prev is the number
		}
	}
	t.extras, t.free = extras, nil
}

// bytes is the heap the table holds: its arrays, and the entries of its
// logs and lease sets (a log's live entries; its array may hold a few more).
func (t *table) bytes() int64 {
	n := int64(cap(t.slots))*int64(unsafe.Sizeof(slot{})) +
		int64(cap(t.extras))*int64(unsafe.Sizeof(extra{})) + int64(cap(t.free))*4
	for i := range t.extras {
		x := &t.extras[i]
		if x.log != nil {
			n += int64(unsafe.Sizeof(*x.log)) + int64(x.log.Len())*int64(unsafe.Sizeof(algo.LogEntry{}))
		}
		if x.leases != nil {
			n += int64(unsafe.Sizeof(*x.leases)) + int64(cap(*x.leases))*int64(unsafe.Sizeof(leaseset.Entry{}))
		}
	}
	return n
}

// clear drops every slot and the arrays that hold them.
func (t *table) clear() { *t = table{wide: t.wide} }

// sizeFor is the number of slots for live slots after a shrink: a quarter
// full at most, so that it takes many inserts to grow again.
func sizeFor(live int) int { return max(minSlots, live*4) }
