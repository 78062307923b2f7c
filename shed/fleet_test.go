package shed_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/shed"
	"github.com/throttlekit/throttlekit/throttler"
)

// TestFleetShare walks a fleet of capacity 10 with the default share (8 for
// non-critical traffic) through a table: every class counts in the same
// set of leases; non-critical requests are refused once 8 leases are held,
// by anyone; critical ones acquire up to 10 and beyond that still go ahead,
// without a lease.
func TestFleetShare(t *testing.T) {
	ctx := context.Background()
	store := newLeaseStore(t)
	f, err := shed.NewFleet(newThrottler(t, store, failOpen), &shed.FleetOptions{Capacity: 10})
	if err != nil {
		t.Fatal(err)
	}
	var leases []throttler.Lease
	steps := []struct {
		c                 shed.Class
		allowed, hasLease bool
		limit, used       int64
	}{
		{shed.Critical, true, true, 10, 1},
		{shed.Critical, true, true, 10, 2},
		{shed.Write, true, true, 8, 3},
		{shed.Read, true, true, 8, 4},
		{shed.TestMode, true, true, 8, 5},
		{shed.Read, true, true, 8, 6},
		{shed.Read, true, true, 8, 7},
		{shed.Write, true, true, 8, 8},
		{shed.Write, false, false, 8, 8}, // 8 held, 2 of them critical: non-critical is full
		{shed.TestMode, false, false, 8, 8},
		{shed.Critical, true, true, 10, 9},
		{shed.Critical, true, true, 10, 10},
		{shed.Critical, true, false, 10, 10}, // over capacity: runs anyway, without a lease
		{shed.Read, false, false, 8, 10},
	}
	for i, s := range steps {
		l, d, err := f.Admit(ctx, s.c)
		if err != nil {
			t.Fatalf("step %d (%v): %v", i, s.c, err)
		}
		if d.Allowed != s.allowed || (l != throttler.Lease{}) != s.hasLease || d.Limit != s.limit || d.Used != s.used {
			t.Fatalf("step %d (%v): allowed %v lease %v limit %d used %d; want %v %v %d %d",
				i, s.c, d.Allowed, l != throttler.Lease{}, d.Limit, d.Used, s.allowed, s.hasLease, s.limit, s.used)
		}
		if d.Allowed && d.RetryAfter != 0 {
			t.Fatalf("step %d (%v): allowed with RetryAfter %v", i, s.c, d.RetryAfter)
		}
		leases = append(leases, l)
	}
	if got := store.held("fleet", "fleet"); got != 10 {
		t.Fatalf("store holds %d leases, want 10", got)
	}
	// Releasing three leases (two critical, one write) leaves 7 held: one
	// non-critical request fits again, a second does not.
	for _, i := range []int{0, 1, 2} {
		if held, _, err := leases[i].Release(ctx); !held || err != nil {
			t.Fatalf("release %d: %v %v", i, held, err)
		}
	}
	for i, want := range []bool{true, false} {
		_, d, err := f.Admit(ctx, shed.Read)
		if err != nil || d.Allowed != want {
			t.Fatalf("read %d after releases: %v %v, want allowed %v", i, d.Allowed, err, want)
		}
	}
}

// TestFleetStoreFailure: a failing store never sheds critical traffic; a
// non-critical request gets the Throttler's error.
func TestFleetStoreFailure(t *testing.T) {
	ctx := context.Background()
	store := newLeaseStore(t)
	f, err := shed.NewFleet(newThrottler(t, store, failClosed), &shed.FleetOptions{Capacity: 4})
	if err != nil {
		t.Fatal(err)
	}
	store.setFail(errors.New("store down"))
	if l, d, err := f.Admit(ctx, shed.Critical); err != nil || !d.Allowed || l != (throttler.Lease{}) {
		t.Fatalf("critical while the store fails: %+v %v, want allowed without a lease", d, err)
	}
	if _, d, err := f.Admit(ctx, shed.Read); err == nil || d.Allowed {
		t.Fatalf("read while the store fails (fail closed): %+v %v, want an error", d, err)
	}
}

func TestFleetShareRounding(t *testing.T) {
	f, err := shed.NewFleet(newThrottler(t, newLeaseStore(t), failOpen), &shed.FleetOptions{Capacity: 100, Share: 0.29})
	if err != nil {
		t.Fatal(err)
	}
	if _, d, err := f.Admit(context.Background(), shed.Write); err != nil || d.Limit != 29 {
		t.Fatalf("0.29 of 100: %d (%v), want 29", d.Limit, err)
	}
}

func TestNewFleetErrors(t *testing.T) {
	leases := newThrottler(t, newLeaseStore(t), failOpen)
	m, err := memory.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	noLeases := newThrottler(t, rateOnly{m}, failOpen)
	for _, tc := range []struct {
		name string
		t    *throttler.Throttler
		o    *shed.FleetOptions
		want string
	}{
		{"nil throttler", nil, &shed.FleetOptions{Capacity: 10}, "needs a Throttler, got nil"},
		{"backend without leases", noLeases, &shed.FleetOptions{Capacity: 10}, "backend holds leases"},
		{"nil options", leases, nil, "concurrency limit must be between 1 and 10000, got 0"},
		{"capacity above max", leases, &shed.FleetOptions{Capacity: 10_001}, "concurrency limit must be between"},
		{"negative capacity", leases, &shed.FleetOptions{Capacity: -1}, "concurrency limit must be between"},
		{"negative share", leases, &shed.FleetOptions{Capacity: 10, Share: -0.5}, "Share must be in (0, 1]"},
		{"share above 1", leases, &shed.FleetOptions{Capacity: 10, Share: 1.5}, "Share must be in (0, 1]"},
		{"share NaN", leases, &shed.FleetOptions{Capacity: 10, Share: math.NaN()}, "Share must be in (0, 1]"},
		{"share rounds to 0", leases, &shed.FleetOptions{Capacity: 10, Share: 0.05}, "leaves non-critical traffic no request"},
		{"negative TTL", leases, &shed.FleetOptions{Capacity: 10, TTL: -time.Second}, "lease TTL must be >= 1ms"},
		{"TTL not whole ms", leases, &shed.FleetOptions{Capacity: 10, TTL: 1500 * time.Microsecond}, "whole number of milliseconds"},
		{"name with space", leases, &shed.FleetOptions{Capacity: 10, Name: "my fleet"}, "only printable ASCII without spaces"},
		{"key too long", leases, &shed.FleetOptions{Capacity: 10, Key: strings.Repeat("k", throttler.MaxKeyLen+1)}, "FleetOptions.Key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := shed.NewFleet(tc.t, tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "shed: ") || strings.Count(err.Error(), ": ") < 1 || strings.Contains(err.Error(), "throttler:") {
				t.Fatalf("NewFleet: %v, %v; want an error containing %q", f, err, tc.want)
			}
		})
	}
}

func TestNilFleet(t *testing.T) {
	var f *shed.Fleet
	if _, d, err := f.Admit(context.Background(), shed.Read); err == nil || d.Allowed {
		t.Fatal("Admit on a nil Fleet: no error")
	}
}
