package shed

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// FleetOptions configure NewFleet.
type FleetOptions struct {
	// Capacity is how many requests the whole fleet serves at once, every
	// class together: the concurrency limit on the global key, 1 to
	// throttler.MaxConcurrencyLimit. Required. default: none
	Capacity int64
	// Share is the part of Capacity that non-critical traffic may hold,
	// in (0, 1]: the rest is kept for critical traffic. Share × Capacity,
	// rounded down, must be at least 1. default: 0.8
	Share float64
	// TTL is how long a lease counts if its request never releases it (a
	// crashed process): longer than the slowest request. default: 1m
	TTL time.Duration
	// Name names the limit in storage and in the X-RateLimit-Resource
	// header of a refusal. default: "fleet"
	Name string
	// Key is the one global key every process of the fleet acquires on.
	// default: "fleet"
	Key string
}

// Fleet is Stripe's fleet usage load shedder: a concurrency limit on one
// key that every process of the fleet shares, through a Throttler whose
// backend holds leases (a shared store such as Redis, for a fleet).
// Non-critical traffic may hold at most Share of Capacity; critical traffic
// is never shed.
//
// Both kinds acquire on the same named limit, so they count in the same
// set of leases: a non-critical request acquires under the limit Share ×
// Capacity and is refused once that many leases are held, whoever holds
// them; a critical request acquires under Capacity, so that while it runs
// it counts against the non-critical share too. A critical request that
// finds Capacity full, or the store failing, still goes ahead without a
// lease: critical traffic is never refused here, and Capacity is only what
// non-critical traffic is measured against.
//
// A Fleet is safe for concurrent use. Build it with NewFleet.
type Fleet struct {
	t           *throttler.Throttler
	key         string
	critical    throttler.ConcurrencyPolicy
	nonCritical throttler.ConcurrencyPolicy
}

// NewFleet returns a Fleet over t, or an error naming what cannot work: a
// Throttler whose backend does not hold leases is one.
func NewFleet(t *throttler.Throttler, o *FleetOptions) (*Fleet, error) {
	if t == nil {
		return nil, errors.New("shed: NewFleet needs a Throttler, got nil")
	}
	if !t.SupportsLeases() {
		return nil, errors.New("shed: NewFleet needs a Throttler whose backend holds leases (Throttler.SupportsLeases)")
	}
	var opts FleetOptions
	if o != nil {
		opts = *o
	}
	if math.IsNaN(opts.Share) || opts.Share < 0 || opts.Share > 1 {
		return nil, fmt.Errorf("shed: FleetOptions.Share must be in (0, 1] (0: default), got %v", opts.Share)
	}
	if opts.Share == 0 {
		opts.Share = 0.8
	}
	if opts.TTL == 0 {
		opts.TTL = time.Minute
	}
	if opts.Name == "" {
		opts.Name = "fleet"
	}
	if opts.Key == "" {
		opts.Key = "fleet"
	}
	critical := throttler.ConcurrencyPolicy{Name: opts.Name, Limit: opts.Capacity, TTL: opts.TTL}
	if err := critical.Validate(); err != nil {
		return nil, reword(fmt.Sprintf("FleetOptions (Capacity %d, TTL %v, Name %q)", opts.Capacity, opts.TTL, opts.Name), err)
	}
	// The policy and the lease ID are valid: only the key can be wrong.
	if err := throttler.ValidateLease(opts.Key, critical, 1); err != nil {
		return nil, reword("FleetOptions.Key", err)
	}
	// The epsilon keeps 0.29 × 100 at 29, not the 28.999… of binary floats.
	share := int64(math.Floor(opts.Share*float64(opts.Capacity) + 1e-9))
	if share < 1 {
		return nil, fmt.Errorf("shed: FleetOptions.Share %v of Capacity %d leaves non-critical traffic no request at all", opts.Share, opts.Capacity)
	}
	nonCritical := critical
	nonCritical.Limit = share
	return &Fleet{t: t, key: opts.Key, critical: critical, nonCritical: nonCritical}, nil
}

// Admit acquires a lease for a request of class c and answers as
// Throttler.Acquire does: release the Lease when the request ends (a zero
// Lease releases nothing), and the Decision's Allowed says whether the
// request may go ahead. The Decision is the store's, its Limit the one the
// class is measured against (Share × Capacity for non-critical traffic,
// Capacity for critical), except that a critical request is always Allowed
// with a nil error: when Capacity is full or the store fails it goes ahead
// without a lease (zero Lease, no RetryAfter). The error is the
// Throttler's, for a non-critical request that could not be decided (the
// store fails and the Throttler fails closed): answer 503.
func (f *Fleet) Admit(ctx context.Context, c Class) (throttler.Lease, throttler.Decision, error) {
	if f == nil || f.t == nil {
		return throttler.Lease{}, throttler.Decision{}, errNilShedder
	}
	p := f.nonCritical
	if c == Critical {
		p = f.critical
	}
	l, d, err := f.t.Acquire(ctx, f.key, p)
	if c == Critical {
		// Never shed: a full fleet or a failing store only means this
		// request runs without a lease (Observe sees the failure).
		d.Allowed, d.RetryAfter = true, 0
		return l, d, nil
	}
	return l, d, err
}
