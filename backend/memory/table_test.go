package memory

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Keys whose hashes collide, and one key under several policies, probe past
// each other; growing and sweeping keep every live window findable.
func TestTableCollisionsGrowthAndRebuild(t *testing.T) {
	var tb table
	const n = 300
	for i := 0; i < n; i++ {
		h := uint64(i % 3) // three hashes for 300 windows: long probe runs
		s := tb.insert(h, fmt.Sprint("key", i/2), policyID{name: fmt.Sprint("policy", i%2)}, 0)
		s.used, s.resetAt, s.end = int64(i), int64(1000+i), int64(1000+i)
	}
	require.Equal(t, n, tb.live)
	assert.LessOrEqual(t, tb.live*4, len(tb.slots)*3, "load factor")
	for i := 0; i < n; i++ {
		s := tb.find(uint64(i%3), fmt.Sprint("key", i/2), policyID{name: fmt.Sprint("policy", i%2)})
		require.NotNil(t, s, "window %d", i)
		assert.Equal(t, int64(i), s.used)
	}
	assert.Nil(t, tb.find(0, "key0", policyID{name: "policy9"}), "another policy of a stored key")
	assert.Nil(t, tb.find(1, "key0", policyID{name: "policy0"}), "the right key under another hash")
	assert.Nil(t, (&table{}).find(0, "k", policyID{name: "p"}), "an empty table")

	// The windows ending by 1000+149 go; the rest stay findable.
	tb.rebuild(1000+149, false)
	assert.Equal(t, n-150, tb.live)
	for i := 0; i < n; i++ {
		s := tb.find(uint64(i%3), fmt.Sprint("key", i/2), policyID{name: fmt.Sprint("policy", i%2)})
		if i < 150 {
			assert.Nil(t, s, "window %d ended", i)
		} else {
			require.NotNil(t, s, "window %d", i)
			assert.Equal(t, int64(i), s.used)
		}
	}
	// Everything ended: the table shrinks back.
	tb.rebuild(1<<40, false)
	assert.Equal(t, 0, tb.live)
	assert.Equal(t, minSlots, len(tb.slots))
}

func TestTableRebuildWithNothingEndedKeepsTheSlots(t *testing.T) {
	var tb table
	s := tb.insert(7, "k", policyID{name: "p"}, 0)
	s.resetAt, s.end = 100, 100
	before := &tb.slots[0]
	tb.rebuild(50, false)
	assert.Same(t, before, &tb.slots[0], "no new table when nothing ended")
}

// Keys at the edge of the inline size, and long ones, are told apart even
// when they share a hash and a prefix.
func TestTableInlineAndLongKeys(t *testing.T) {
	var tb table
	keys := []string{
		strings.Repeat("a", shortKey-1), strings.Repeat("a", shortKey), strings.Repeat("a", shortKey+1),
		strings.Repeat("a", shortKey) + "b", strings.Repeat("a", 100), "a", "\x00",
	}
	for i, k := range keys {
		s := tb.insert(42, k, policyID{name: "p"}, 0)
		s.used, s.resetAt, s.end = int64(i), 1000, 1000
	}
	for i, k := range keys {
		s := tb.find(42, k, policyID{name: "p"})
		require.NotNil(t, s, "%q", k)
		assert.Equal(t, int64(i), s.used, "%q", k)
	}
	assert.Nil(t, tb.find(42, strings.Repeat("a", shortKey-2), policyID{name: "p"}))
	assert.Nil(t, tb.find(42, strings.Repeat("a", 99), policyID{name: "p"}))
}
