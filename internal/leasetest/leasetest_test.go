package leasetest_test

import (
	"context"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/leasetest"
	"github.com/throttlekit/throttlekit/throttler"
)

// Holds counts the leases held, up to the limit, and leaves the store as it
// was: the same count twice, and the last slot still free for a lease.
func TestHolds(t *testing.T) {
	t0 := time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)
	p := throttler.Concurrent(3, time.Second)
	m, err := memory.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	for id, want := range []int64{0, 1, 2, 3} {
		if id > 0 {
			if _, err := m.Acquire(context.Background(), "k", p, throttler.LeaseID(id), t0); err != nil {
				t.Fatal(err)
			}
		}
		for range 2 {
			if got := leasetest.Holds(t, m, "k", p, t0); got != want {
				t.Fatalf("%d leases acquired: Holds = %d, want %d", id, got, want)
			}
		}
	}
	if got := leasetest.Holds(t, m, "k", p, t0.Add(time.Second)); got != 0 {
		t.Fatalf("after the TTL: Holds = %d, want 0", got)
	}
}
