package memory

import (
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// newTable is an empty table as a Backend's shard has it: seeded for long
// keys' hashes.
func newTable() table { return table{wide: maphash.MakeSeed()} }

// put inserts like a shard does: room first, then the slot.
func (t *table) put(h uint64, key string, policy uint32) *slot {
	if t.crowded() {
		t.sweep(-1 << 63)
		if n := len(t.slots); n == 0 {
			t.resize(minSlots)
		} else if t.live*100 > n*64 {
			t.resize(grown(n))
		}
	}
	return t.insert(h, key, policy, kindFixed)
}

// Keys whose hashes collide, and one key under several policies, probe past
// each other; growing and sweeping keep every live window findable.
func TestTableCollisionsGrowthAndSweep(t *testing.T) {
	tb := newTable()
	const n = 300
	for i := 0; i < n; i++ {
		h := uint64(i % 3) // three hashes for 300 windows: long probe runs
		s := tb.put(h, fmt.Sprint("key", i/2), uint32(1+i%2))
		s.used, s.resetAt, s.end = int64(i), int64(1000+i), int64(1000+i)
	}
	require.Equal(t, n, tb.live)
	assert.LessOrEqual(t, tb.live*5, len(tb.slots)*4, "load factor")
	for i := 0; i < n; i++ {
		s := tb.find(uint64(i%3), fmt.Sprint("key", i/2), uint32(1+i%2))
		require.NotNil(t, s, "window %d", i)
		assert.Equal(t, int64(i), s.used)
	}
	assert.Nil(t, tb.find(0, "key0", uint32(9)), "another policy of a stored key")
	assert.Nil(t, tb.find(1, "key0", uint32(1)), "the right key under another hash")
	assert.Nil(t, (&table{}).find(0, "k", uint32(1)), "an empty table")

	// The windows ending by 1000+149 go; the rest stay findable.
	before := &tb.slots[0]
	assert.Equal(t, 150, tb.sweep(1000+149))
	assert.Same(t, before, &tb.slots[0], "swept in place")
	assert.Equal(t, n-150, tb.live)
	for i := 0; i < n; i++ {
		s := tb.find(uint64(i%3), fmt.Sprint("key", i/2), uint32(1+i%2))
		if i < 150 {
			assert.Nil(t, s, "window %d ended", i)
		} else {
			require.NotNil(t, s, "window %d", i)
			assert.Equal(t, int64(i), s.used)
		}
	}
	assert.Equal(t, n-150, tb.sweep(1<<40))
	assert.Equal(t, 0, tb.live)
	for i := range tb.slots {
		assert.True(t, tb.slots[i].empty())
	}
}

// Random inserts and sweeps on a small table whose probe runs wrap past its
// end: after each sweep exactly the live slots are findable, and every run
// is unbroken (each slot is reachable from its home without an empty slot).
func TestTableSweepKeepsRunsIntact(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 200; round++ {
		tb := newTable()
		tb.slots = make([]slot, 16)
		want := map[string]int64{}
		for i := 0; i < 12; i++ {
			k := fmt.Sprint("k", i)
			h := uint64(12+rng.IntN(4)) << 28 // homes near the end: runs wrap
			s := tb.insert(h, k, uint32(1), kindFixed)
			s.end = int64(rng.IntN(10))
			want[k] = s.end
		}
		ref := int64(rng.IntN(10))
		dropped := tb.sweep(ref)
		kept := 0
		for i := range tb.slots {
			s := &tb.slots[i]
			if s.empty() {
				continue
			}
			kept++
			for j := home(s.hash, 16); j != i; j = (j + 1) & 15 {
				require.False(t, tb.slots[j].empty(), "round %d: a hole between slot %d and its home", round, i)
			}
		}
		require.Equal(t, tb.live, kept)
		for k, end := range want {
			found := false
			for i := range tb.slots {
				var wide uint64
				if !tb.slots[i].empty() && tb.equal(&tb.slots[i], uint64(tb.slots[i].hash), k, &wide) {
					found = true
					require.Same(t, &tb.slots[i], tb.find(uint64(tb.slots[i].hash), k, uint32(1)))
				}
			}
			require.Equal(t, end > ref, found, "round %d: %s ends at %d, swept by %d", round, k, end, ref)
			if end <= ref {
				dropped--
			}
		}
		require.Zero(t, dropped)
	}
}

// Keys at the edge of the inline size, and long ones, are told apart even
// when they share a hash and a prefix.
func TestTableInlineAndLongKeys(t *testing.T) {
	tb := newTable()
	keys := []string{
		strings.Repeat("a", shortKey-1), strings.Repeat("a", shortKey), strings.Repeat("a", shortKey+1),
		strings.Repeat("a", shortKey) + "b", strings.Repeat("a", 100), "a", "\x00",
		strings.Repeat("a", 4095) + "b", strings.Repeat("a", 4095) + "c",
	}
	for i, k := range keys {
		s := tb.put(42, k, uint32(1))
		s.used, s.resetAt, s.end = int64(i), 1000, 1000
	}
	for i, k := range keys {
		s := tb.find(42, k, uint32(1))
		require.NotNil(t, s, "%q", k)
		assert.Equal(t, int64(i), s.used, "%q", k)
	}
	assert.Nil(t, tb.find(42, strings.Repeat("a", shortKey-2), uint32(1)))
	assert.Nil(t, tb.find(42, strings.Repeat("a", 99), uint32(1)))
	assert.Nil(t, tb.find(43, strings.Repeat("a", 100), uint32(1)), "a long key under another hash")
	assert.Empty(t, tb.extras, "long keys are held in their slots, as hashes")
}

func TestSizeFor(t *testing.T) {
	for _, tc := range []struct{ live, want int }{{0, minSlots}, {2, minSlots}, {3, 12}, {100, 400}, {129, 516}} {
		assert.Equal(t, tc.want, sizeFor(tc.live), "live %d", tc.live)
	}
}

// Shards sit side by side in one array: each must fill whole cache lines,
// or a busy shard's lock would slow its neighbours. What every call reads
// and writes sits in the first two.
func TestShardSize(t *testing.T) {
	var s shard
	assert.Equal(t, uintptr(384), unsafe.Sizeof(s))
	assert.Equal(t, uintptr(0), unsafe.Offsetof(s.last)/64, "the policy memo beside the lock")
	for name, off := range map[string]uintptr{
		"low":         unsafe.Offsetof(s.low),
		"high":        unsafe.Offsetof(s.high),
		"sinceScan":   unsafe.Offsetof(s.sinceScan),
		"table.slots": unsafe.Offsetof(s.table) + unsafe.Offsetof(s.table.slots),
		"table.live":  unsafe.Offsetof(s.table) + unsafe.Offsetof(s.table.live),
	} {
		assert.Equal(t, uintptr(1), off/64, "%s in the second line", name)
	}
}

// A slot is one cache line: finding a state reads one line, and a full
// shard's table (three quarters full) holds a state in 64/0.75 = 85 bytes.
func TestSlotSize(t *testing.T) {
	assert.Equal(t, uintptr(64), unsafe.Sizeof(slot{}))
}
