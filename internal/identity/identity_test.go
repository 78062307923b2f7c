package identity_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/throttlekit/throttlekit/internal/identity"
	"github.com/throttlekit/throttlekit/throttler"
)

func TestRate(t *testing.T) {
	named := []throttler.Policy{
		throttler.PerHour(3).Named("core"),
		throttler.PerMinute(2).Named("core"),
		throttler.PerSecond(1).Named("~!#$%"),
	}
	for _, p := range named {
		assert.Equal(t, p.Name, identity.Rate(p), "a named policy keeps its Name: stored windows stay where they are")
	}
	assert.Equal(t, identity.Rate(named[0]), identity.Rate(named[1]), "a named policy's Limit and Window may change without a fresh window")

	unnamed := []throttler.Policy{
		throttler.PerHour(3), throttler.PerMinute(2), throttler.PerMinute(3), throttler.PerHour(2),
		{Limit: 3, Window: 61 * time.Minute}, {Limit: throttler.MaxLimit, Window: time.Millisecond},
	}
	seen := map[string]throttler.Policy{}
	for _, p := range unnamed {
		id := identity.Rate(p)
		if prev, ok := seen[id]; ok {
			t.Errorf("%v and %v share the identity %q", prev, p, id)
		}
		seen[id] = p
		assert.True(t, strings.HasPrefix(id, " "), "%q: a space, which no Name may hold", id)
		assert.Error(t, throttler.PerHour(1).Named(id).Validate(), "%q is not a valid Name", id)
		assert.Equal(t, id, identity.Rate(p), "stable")
	}
	assert.Equal(t, " fw 3/3600000", identity.Rate(throttler.PerHour(3)))
}

func TestAppendRate(t *testing.T) {
	for _, p := range []throttler.Policy{throttler.PerHour(3), throttler.PerHour(3).Named("core")} {
		assert.Equal(t, "prefix:"+identity.Rate(p), string(identity.AppendRate([]byte("prefix:"), p)))
		buf := make([]byte, 0, 64)
		allocs := testing.AllocsPerRun(100, func() { buf = identity.AppendRate(buf[:0], p) })
		assert.Zero(t, allocs, "%v: a backend builds its keys without allocating", p)
	}
}

func ExampleRate() {
	fmt.Printf("%q\n", identity.Rate(throttler.PerHour(3).Named("core")))
	fmt.Printf("%q\n", identity.Rate(throttler.PerHour(3)))
	fmt.Printf("%q\n", identity.Rate(throttler.PerMinute(2)))
	// Output:
	// "core"
	// " fw 3/3600000"
	// " fw 2/60000"
}

func TestLease(t *testing.T) {
	for _, tc := range []struct {
		p    throttler.ConcurrencyPolicy
		want string
	}{
		{throttler.ConcurrencyPolicy{Name: "exports", Limit: 20, TTL: time.Minute}, "exports cc"},
		{throttler.ConcurrencyPolicy{Name: "exports", Limit: 3, TTL: time.Hour}, "exports cc"},
		{throttler.Concurrent(20, time.Minute), " cc 20/60000"},
		{throttler.Concurrent(20, 1500*time.Millisecond), " cc 20/1500"},
	} {
		assert.Equal(t, tc.want, identity.Lease(tc.p), "%v", tc.p)
		assert.Equal(t, "x"+tc.want, string(identity.AppendLease([]byte("x"), tc.p)))
	}
	// Never a rate policy's identity, for any algorithm, named or not.
	for _, name := range []string{"exports", ""} {
		c := throttler.ConcurrencyPolicy{Name: name, Limit: 20, TTL: time.Minute}
		for a := throttler.FixedWindow; a <= throttler.SlidingWindow; a++ {
			r := throttler.Policy{Name: name, Limit: 20, Window: time.Minute, Algorithm: a}
			assert.NotEqual(t, identity.Rate(r), identity.Lease(c), "%v and %v", r, c)
		}
	}
}

// FuzzRate: an unnamed policy's identity never equals a valid Name, and
// two unnamed policies share one only when they are the same limit.
func FuzzRate(f *testing.F) {
	f.Add("core", int64(3), int64(3600_000), int64(2), int64(60_000))
	f.Add("fw", int64(1), int64(1), int64(1), int64(1))
	f.Fuzz(func(t *testing.T, name string, limit1, ms1, limit2, ms2 int64) {
		p1 := throttler.Policy{Limit: limit1, Window: time.Duration(ms1) * time.Millisecond}
		p2 := throttler.Policy{Limit: limit2, Window: time.Duration(ms2) * time.Millisecond}
		if p1.Validate() != nil || p2.Validate() != nil {
			return
		}
		if (identity.Rate(p1) == identity.Rate(p2)) != (p1 == p2) {
			t.Fatalf("%v and %v: identities %q and %q", p1, p2, identity.Rate(p1), identity.Rate(p2))
		}
		named := p1.Named(name)
		if named.Validate() == nil && name != "" && identity.Rate(named) == identity.Rate(p2) {
			t.Fatalf("name %q meets the unnamed %v", name, p2)
		}
	})
}
