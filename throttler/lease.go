package throttler

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// MaxConcurrencyLimit is the largest ConcurrencyPolicy.Limit: it bounds a
// key's state (one entry per lease held), so that it fits in one Memcached
// item and one Redis call stays short.
const MaxConcurrencyLimit = 10_000

// ConcurrencyPolicy names a concurrency limit: at most Limit leases of one
// key held at once, each counting for at most TTL.
type ConcurrencyPolicy struct {
	// Name identifies the limit in storage and in headers. It may be empty;
	// otherwise it is printable ASCII without spaces, at most 128 bytes.
	Name string
	// Limit is how many leases a key may hold at once: 1 to
	// MaxConcurrencyLimit.
	Limit int64
	// TTL is how long an unreleased lease counts: at least one millisecond,
	// and a whole number of them. Make it longer than the slowest request
	// the limit covers: a request still running past TTL no longer counts.
	TTL time.Duration
}

// Concurrent returns an unnamed concurrency policy: at most n leases held at
// once, each counting for at most ttl. A named one is a literal, for example
// ConcurrencyPolicy{Name: "exports", Limit: 20, TTL: time.Minute}.
func Concurrent(n int64, ttl time.Duration) ConcurrencyPolicy {
	return ConcurrencyPolicy{Limit: n, TTL: ttl}
}

// Validate reports why p cannot be used, as an error matching
// ErrInvalidPolicy, or nil.
func (p ConcurrencyPolicy) Validate() error {
	switch {
	case p.Limit <= 0 || p.Limit > MaxConcurrencyLimit:
		return fmt.Errorf("%w: concurrency limit must be between 1 and %d, got %d", ErrInvalidPolicy, MaxConcurrencyLimit, p.Limit)
	case p.TTL < time.Millisecond:
		return fmt.Errorf("%w: lease TTL must be >= 1ms, got %v", ErrInvalidPolicy, p.TTL)
	case p.TTL%time.Millisecond != 0:
		return fmt.Errorf("%w: lease TTL must be a whole number of milliseconds, got %v", ErrInvalidPolicy, p.TTL)
	case len(p.Name) > maxPolicyNameLen:
		return fmt.Errorf("%w: name is %d bytes, at most %d allowed", ErrInvalidPolicy, len(p.Name), maxPolicyNameLen)
	case !validName(p.Name):
		return fmt.Errorf("%w: name %q: only printable ASCII without spaces is allowed", ErrInvalidPolicy, p.Name)
	}
	return nil
}

// String describes p, for example "exports: 20 concurrent (lease TTL 1m0s)".
func (p ConcurrencyPolicy) String() string {
	s := fmt.Sprintf("%d concurrent (lease TTL %v)", p.Limit, p.TTL)
	if p.Name != "" {
		s = p.Name + ": " + s
	}
	return s
}

// LeaseID identifies one lease among the leases of a key. A Throttler draws
// it at random (64 bits: two of the at most MaxConcurrencyLimit leases held
// on one key collide with a probability below 2^-37). Zero is no lease.
type LeaseID uint64

// newLeaseID returns a random non-zero LeaseID.
func newLeaseID() LeaseID {
	for {
		if id := LeaseID(rand.Uint64()); id != 0 {
			return id
		}
	}
}

// ErrInvalidLease is the error for a zero LeaseID.
var ErrInvalidLease = errors.New("throttler: invalid lease")

// ValidateLease reports why a lease operation cannot be made, as an error
// matching ErrInvalidKey, ErrInvalidPolicy or ErrInvalidLease, or nil. Every
// LeaseBackend runs it first in Acquire and Release, as ValidateCall in the
// rate operations; wrappers forward without it.
func ValidateLease(key string, p ConcurrencyPolicy, id LeaseID) error {
	if err := validateKey(key); err != nil {
		return err
	}
	if err := p.Validate(); err != nil {
		return err
	}
	if id == 0 {
		return fmt.Errorf("%w: lease ID 0", ErrInvalidLease)
	}
	return nil
}

// LeaseBackend stores concurrency limits, by the lease contract below.
// Backends that hold leases implement it beside Backend; as for Backend,
// every operation receives the caller's now, and being over the limit is a
// Decision, never an error.
//
// Concurrency limits (Stripe's concurrent-requests limiter): a key may hold
// at most Limit leases at once. A request acquires a lease when it starts
// and releases it when it ends; a lease never released (a crashed process, a
// lost connection) stops counting TTL after it was acquired, so capacity
// never leaks for good.
//
// The lease contract, checked by backendtest, pinned to the millisecond so
// that two stores compared by a shadow answer alike (now and every expiry
// are whole Unix milliseconds, now truncated):
//   - A key's state is its set of held leases, each an ID with an expiry.
//     A lease whose expiry is <= now is not held: every operation first
//     drops such leases.
//   - Acquire of an ID not held admits it only if fewer than Limit leases
//     are held, and then holds it with expiry now + TTL. Acquire of an ID
//     already held admits it again without counting it twice and moves its
//     expiry to now + TTL (a retried Acquire is harmless). A denied Acquire
//     changes nothing. One round trip, atomic under any concurrency.
//   - Release drops the ID and reports whether it was held; releasing an
//     ID that expired, was released already or never existed changes
//     nothing and reports false (Release is idempotent).
//   - The Decision of either: Limit is p.Limit; Used is the leases held
//     after the call (the acquired one included); Remaining is Limit - Used,
//     never below zero (a lowered Limit can leave Used above it); ResetAt is
//     the earliest expiry among the leases held after the call, or now + TTL
//     when none is; RetryAfter, for a denied Acquire, is ResetAt - now, the
//     longest a slot can take to free (a Release frees one sooner). Allowed,
//     after a Release, reports whether an Acquire of a new ID would be
//     admitted.
//
// The storage identity of a concurrency limit is (Name, key) for a named
// policy, so that a live policy's Limit and TTL can change without dropping
// the leases held (a new Limit applies at once, a new TTL to leases
// acquired from then on), and the whole definition for an unnamed one. A
// concurrency policy never shares state with a rate Policy of the same
// Name.
//
// A router must send a Release to the backend that granted the lease, even
// if its routing changed in between; a shadow mirrors both operations.
// Implementations must be safe for concurrent use.
type LeaseBackend interface {
	Acquire(ctx context.Context, key string, p ConcurrencyPolicy, id LeaseID, now time.Time) (Decision, error)
	Release(ctx context.Context, key string, p ConcurrencyPolicy, id LeaseID, now time.Time) (held bool, d Decision, err error)
}

// ErrLeasesUnsupported is the error of a lease operation on a Throttler
// whose backend holds no leases: a configuration error, never an outage, so
// no failure mode ever answers it (IsInputError reports it).
var ErrLeasesUnsupported = errors.New("throttler: the backend does not hold leases")

// Lease is a lease acquired through a Throttler. Release it when the work it
// covers ends. The zero Lease releases nothing.
//
// A Lease is a value: releasing it again (or a copy of it) sends the
// Release again, which the store answers with held false and nothing
// changed, since Release is idempotent and a Throttler never reuses a
// LeaseID.
type Lease struct {
	t      *Throttler
	key    string
	policy ConcurrencyPolicy
	id     LeaseID
	// source is who granted it: a lease granted by the fallback is released
	// there, one granted by the failure mode nowhere.
	source Source
	// store is the store that granted it, as the backend named it at
	// Acquire: its breaker covers the Release, wherever the backend routes
	// the key by then.
	store string
}

// SupportsLeases reports whether t's backend holds leases: whether Acquire
// can work. Constructors that need leases check it when they are built.
func (t *Throttler) SupportsLeases() bool {
	return t != nil && t.primary.lb != nil
}

// Acquire takes a lease on key under p. Release the returned Lease when the
// work ends; a denied Acquire returns the zero Lease, whose Release does
// nothing. The Throttler's failure handling applies as for Allow: the call
// goes to the backend under Timeout, unless the breaker of its store is
// open; a failing store is answered by the fallback if the fallback holds
// leases (the lease is then the fallback's, and Degraded), else by the
// failure mode (failing open grants a lease that no store holds); every call is
// observed with OpAcquire. A backend that holds no leases is an error
// matching ErrLeasesUnsupported, never a failure mode.
func (t *Throttler) Acquire(ctx context.Context, key string, p ConcurrencyPolicy) (Lease, Decision, error) {
	if t == nil || t.backend == nil {
		return Lease{}, Decision{}, errNotBuilt
	}
	var store string
	if t.leaseStore != nil {
		store = t.leaseStore(key, p)
	}
	var r request // filled in place, as in do
	r.op, r.key, r.cp, r.id = OpAcquire, key, p, newLeaseID()
	if t.primary.lb == nil {
		err := fmt.Errorf("%w: %T", ErrLeasesUnsupported, t.backend)
		if t.opts.Observe != nil {
			t.start(&r)
			t.observe(&r, store, Decision{}, SourceNone, err)
		}
		return Lease{}, Decision{}, err
	}
	d, src, err := t.run(ctx, &r, store, SourcePrimary)
	if err != nil || !d.Allowed {
		return Lease{}, d, err
	}
	l := Lease{t: t, key: key, policy: p, id: r.id, source: src, store: store}
	if src == SourceFailureMode {
		l.id = 0
	}
	return l, d, nil
}

// Release gives the lease back to the store that granted it, and reports
// whether that store still held it (false: it expired, or was released
// already) and the key's state after it, as LeaseBackend.Release does: one
// shape for every Release of the module. It goes through the Throttler's
// failure handling as Acquire does (observed with OpRelease), except that
// it never goes to a store that did not grant the lease: when the primary
// fails to release its lease, the failure mode answers (the lease then
// counts until its TTL). Releasing a lease granted by the failure mode calls
// no store, and is observed. The zero Lease releases nothing and returns the
// zero Decision.
//
// A context cancelled already does not stop the Release (it is made
// without the cancellation, still bounded by the Timeout): a request's
// context ends when its client goes away, often just as the work ends, and
// a lease not released would hold a slot until its TTL.
func (l Lease) Release(ctx context.Context) (held bool, d Decision, err error) {
	t := l.t
	if t == nil {
		return false, Decision{}, nil
	}
	if ctx.Err() != nil {
		ctx = context.WithoutCancel(ctx)
	}
	var r request // filled in place, as in do
	r.op, r.key, r.cp, r.id = OpRelease, l.key, l.policy, l.id
	if l.source == SourceFailureMode {
		t.start(&r)
		d = t.failureMode(&r)
		d.At = r.now
		if t.opts.Observe != nil {
			t.observe(&r, l.store, d, SourceFailureMode, nil)
		}
		return false, d, nil
	}
	d, _, err = t.run(ctx, &r, l.store, l.source)
	return r.held, d, err
}
