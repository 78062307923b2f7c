// Package leasetest helps the tests of wrappers that pass leases on (a
// router, a shadow, a migration) see which store holds what.
package leasetest

import (
	"context"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// T is what Holds needs of a test (*testing.T and *testing.B have it):
// taking it rather than testing.TB keeps package testing out of non-test
// code.
type T interface {
	Helper()
	Fatalf(format string, args ...any)
}

// probeLease is the ID Holds acquires with: one no test grants, so its
// Acquire adds a lease rather than renewing one.
const probeLease = throttler.LeaseID(1<<63 + 77)

// Holds returns how many leases b holds on key under p at now, for tests
// of what reaches which store (a router's, a shadow's, a migration's): an
// Acquire of a new lease, taken back when it is granted, so the store is
// left as it was. At p's limit the count is p.Limit.
func Holds(t T, b throttler.LeaseBackend, key string, p throttler.ConcurrencyPolicy, now time.Time) int64 {
	t.Helper()
	d, err := b.Acquire(context.Background(), key, p, probeLease, now)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if !d.Allowed {
		return d.Used
	}
	if _, _, err := b.Release(context.Background(), key, p, probeLease, now); err != nil {
		t.Fatalf("%v", err)
	}
	return d.Used - 1
}
