// Package leasetest helps the tests of wrappers that pass leases on (a
// router, a shadow, a migration) see which store holds what.
package leasetest

import (
	"context"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// probeLease is the ID Holds acquires with: one no test grants, so its
// Acquire adds a lease rather than renewing one.
const probeLease = throttler.LeaseID(1<<63 + 77)

// Holds returns how many leases b holds on key under p at now, for tests
// of what reaches which store (a router's, a shadow's, a migration's): an
// Acquire of a new lease, taken back when it is granted, so the store is
// left as it was. At p's limit the count is p.Limit.
func Holds(t testing.TB, b throttler.LeaseBackend, key string, p throttler.ConcurrencyPolicy, now time.Time) int64 {
	t.Helper()
	d, err := b.Acquire(context.Background(), key, p, probeLease, now)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed {
		return d.Used
	}
	if _, _, err := b.Release(context.Background(), key, p, probeLease, now); err != nil {
		t.Fatal(err)
	}
	return d.Used - 1
}
