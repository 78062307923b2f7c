package leaseset_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/internal/leaseset"
	"github.com/throttlekit/throttlekit/throttler"
)

// leaseRow is one call on a Set at t (Unix ms) and all it must answer.
type leaseRow struct {
	acquire bool // else Release
	id      throttler.LeaseID
	t       int64
	p       throttler.ConcurrencyPolicy
	held    bool // Release only
	allowed bool
	used    int64
	resetAt int64
	changed bool
	entries int // len after the call
	why     string
}

func TestSetTable(t *testing.T) {
	p := throttler.ConcurrencyPolicy{Name: "cc", Limit: 2, TTL: time.Second}
	lower := p
	lower.Limit = 1
	longer := p
	longer.TTL = 5 * time.Second
	rows := []leaseRow{
		{acquire: true, id: 1, t: 1000, p: p, allowed: true, used: 1, resetAt: 2000, changed: true, entries: 1, why: "first lease: expiry t+TTL"},
		{acquire: true, id: 2, t: 1100, p: p, allowed: true, used: 2, resetAt: 2000, changed: true, entries: 2, why: "ResetAt is the earliest expiry"},
		{acquire: true, id: 3, t: 1200, p: p, allowed: false, used: 2, resetAt: 2000, entries: 2, why: "full: denied, RetryAfter 800"},
		{acquire: true, id: 2, t: 1300, p: p, allowed: true, used: 2, resetAt: 2000, changed: true, entries: 2, why: "re-acquire of a held ID: counted once, expiry moved to 2300"},
		{acquire: true, id: 3, t: 1999, p: p, allowed: false, used: 2, resetAt: 2000, entries: 2, why: "last ms of lease 1"},
		{acquire: true, id: 3, t: 2000, p: p, allowed: true, used: 2, resetAt: 2300, changed: true, entries: 2, why: "lease 1 expired at now == expiry"},
		{acquire: false, id: 1, t: 2000, p: p, held: false, allowed: false, used: 2, resetAt: 2300, entries: 2, why: "releasing an expired lease: not held, full"},
		{acquire: false, id: 2, t: 2001, p: p, held: true, allowed: true, used: 1, resetAt: 3000, changed: true, entries: 1, why: "release frees a slot"},
		{acquire: false, id: 2, t: 2002, p: p, held: false, allowed: true, used: 1, resetAt: 3000, entries: 1, why: "released twice: not held, nothing changes"},
		{acquire: false, id: 99, t: 2003, p: p, held: false, allowed: true, used: 1, resetAt: 3000, entries: 1, why: "unknown ID"},
		{acquire: true, id: 4, t: 2004, p: longer, allowed: true, used: 2, resetAt: 3000, changed: true, entries: 2, why: "a new TTL applies to new leases: 4 until 7004"},
		{acquire: true, id: 5, t: 2005, p: lower, allowed: false, used: 2, resetAt: 3000, entries: 2, why: "a lowered limit: Used above it, Remaining 0"},
		{acquire: true, id: 4, t: 2006, p: lower, allowed: true, used: 2, resetAt: 3000, changed: true, entries: 2, why: "re-acquire is admitted above a lowered limit"},
		{acquire: false, id: 5, t: 3000, p: lower, held: false, allowed: false, used: 1, resetAt: 3006, changed: true, entries: 1, why: "the drop of lease 3 changes the set; 1 held of 1"},
		{acquire: true, id: 6, t: 1000, p: p, allowed: true, used: 2, resetAt: 2000, changed: true, entries: 2, why: "a clock behind: lease 3 is gone for good, 6 until 2000"},
		{acquire: false, id: 4, t: 9000, p: p, held: false, allowed: true, used: 0, resetAt: 10000, changed: true, entries: 0, why: "all expired: empty, ResetAt t+TTL"},
		{acquire: true, id: 7, t: 9000, p: p, allowed: true, used: 1, resetAt: 10000, changed: true, entries: 1, why: "the emptied set takes leases again"},
	}
	var s leaseset.Set
	for i, r := range rows {
		msg := fmt.Sprintf("row %d: %s", i, r.why)
		var d throttler.Decision
		var held, changed bool
		if r.acquire {
			d, changed = s.Acquire(r.p, r.id, r.t)
		} else {
			held, d, changed = s.Release(r.p, r.id, r.t)
		}
		want := throttler.Decision{Allowed: r.allowed, Limit: r.p.Limit, Used: r.used, Remaining: max(0, r.p.Limit-r.used), ResetAt: time.UnixMilli(r.resetAt)}
		if !r.allowed {
			want.RetryAfter = time.Duration(r.resetAt-r.t) * time.Millisecond
		}
		require.Equal(t, want, d, msg)
		require.Equal(t, r.held, held, msg)
		require.Equal(t, r.changed, changed, msg)
		require.Len(t, s, r.entries, msg)
	}
}

// A set far before 1970 and with TTLs that do not fit a second still
// answers by the contract: expiries are any int64 ms, no sentinel value.
func TestSetNegativeInstants(t *testing.T) {
	p := throttler.Concurrent(1, 7*time.Millisecond)
	var s leaseset.Set
	d, _ := s.Acquire(p, 1, -10)
	assert.Equal(t, int64(-3), d.ResetAt.UnixMilli())
	d, _ = s.Acquire(p, 2, -4)
	assert.False(t, d.Allowed)
	assert.Equal(t, time.Millisecond, d.RetryAfter)
	d, _ = s.Acquire(p, 2, -3)
	assert.True(t, d.Allowed, "lease 1 ends at -3")
	assert.Equal(t, int64(4), s.End())
	assert.Equal(t, int64(math.MinInt64), leaseset.Set(nil).End())
}

func TestSetEnd(t *testing.T) {
	p := throttler.Concurrent(3, time.Second)
	var s leaseset.Set
	s.Acquire(p, 1, 5000)
	s.Acquire(p, 2, 1000) // a clock behind
	assert.Equal(t, int64(6000), s.End(), "the latest expiry, not the last written")
}

// A steady Acquire and Release on a set that has room allocate nothing.
func TestSetAllocatesNothing(t *testing.T) {
	p := throttler.Concurrent(8, time.Second)
	s := make(leaseset.Set, 0, 8)
	for id := throttler.LeaseID(1); id < 5; id++ {
		s.Acquire(p, id, 0)
	}
	now := int64(1)
	allocs := testing.AllocsPerRun(1000, func() {
		s.Acquire(p, 100, now)
		s.Release(p, 100, now)
		now++
	})
	assert.Zero(t, allocs)
}
