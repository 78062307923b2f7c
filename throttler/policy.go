package throttler

import (
	"fmt"
	"math/bits"
	"time"
)

// MaxKeyLen is the longest key, in bytes, that a Throttler accepts. Keys are
// otherwise opaque: any bytes are allowed, and each Backend makes them legal
// for its store.
const MaxKeyLen = 4096

// MaxLimit is the largest Policy.Limit and cost, 2^48: every backend counts
// it exactly (Redis's Lua numbers are doubles, exact to 2^53; Memcached's
// counters wrap at 2^64 and must leave room for concurrent overshoots), so
// backends behind a router or a shadow accept the same policies.
const MaxLimit = 1 << 48

// maxPolicyNameLen is the longest Policy.Name and ConcurrencyPolicy.Name,
// in bytes, as their docs state.
const maxPolicyNameLen = 128

// Policy names a limit: Limit units per Window, counted by its Algorithm
// (fixed windows by default; see docs/algorithms.md for the others).
//
// The identity of a limit in storage is (Name, key) for a named policy, so
// that a live policy's Limit can change without anyone getting a fresh
// window: a new Limit applies at once to the open window (its count is
// kept), a new Window from the next window. An unnamed policy's identity is
// its whole definition (Limit and Window), so two different unnamed
// policies on one key never share a window: PerHour(3) and PerMinute(2) are
// counted apart. Name the policies whose Limit may change while they run.
//
// Check a policy once, when it is configured, with Validate; the HTTP
// middleware (package httplimit) does so when it is built.
type Policy struct {
	// Name identifies the limit in storage and in the X-RateLimit-Resource
	// header. It may be empty; otherwise it is printable ASCII without
	// spaces, at most 128 bytes.
	Name string
	// Limit is how many units a key may take per Window: 1 to MaxLimit
	// (MaxLogLimit for a SlidingLog). For a TokenBucket it is the refill:
	// Limit tokens per Window.
	Limit int64
	// Window is the length of a window: at least one millisecond, and a
	// whole number of them, the unit that stores keep.
	Window time.Duration
	// Algorithm is how units are counted. default: FixedWindow
	Algorithm Algorithm
	// Burst is a TokenBucket's capacity, the most units one instant can
	// take; 0 means Limit. It must be 0 for the other algorithms.
	Burst int64
	// enforce is which keys the policy is enforced for (EnforcedBy,
	// DryRun); nil: every key.
	enforce *enforcement
	// all holds a composite's members (see All); nil for one policy.
	all *composite
}

// PerSecond returns an unnamed policy of n units per second.
func PerSecond(n int64) Policy { return Policy{Limit: n, Window: time.Second} }

// PerMinute returns an unnamed policy of n units per minute.
func PerMinute(n int64) Policy { return Policy{Limit: n, Window: time.Minute} }

// PerHour returns an unnamed policy of n units per hour.
func PerHour(n int64) Policy { return Policy{Limit: n, Window: time.Hour} }

// PerDay returns an unnamed policy of n units per day: a window of 24 hours
// that opens at the key's first counted request, not at midnight.
func PerDay(n int64) Policy { return Policy{Limit: n, Window: 24 * time.Hour} }

// Every returns an unnamed policy that admits one unit per interval: a
// TokenBucket of capacity 1 that one token per interval refills, so
// consecutive admissions are at least interval apart and a denied caller
// waits only for the rest of the interval. With a burst of b (at least 1),
// Every(interval).WithBurst(b) is golang.org/x/time/rate's
// NewLimiter(rate.Every(interval), b). The interval is a Window: a whole
// number of milliseconds, at least one (Validate says why another is not).
func Every(interval time.Duration) Policy {
	return Policy{Limit: 1, Window: interval, Algorithm: TokenBucket}
}

// Named returns a copy of p with the given name.
func (p Policy) Named(name string) Policy {
	p.Name = name
	return p
}

// WithAlgorithm returns a copy of p counted by a, for example
// PerMinute(600).WithAlgorithm(SlidingLog). Each WithX method returns a
// copy of p with its field X set.
func (p Policy) WithAlgorithm(a Algorithm) Policy {
	p.Algorithm = a
	return p
}

// WithBurst returns a copy of p as a TokenBucket of capacity burst: Limit
// tokens per Window refill it, and up to burst units may be taken at once.
func (p Policy) WithBurst(burst int64) Policy {
	p.Algorithm, p.Burst = TokenBucket, burst
	return p
}

// Capacity is the most units a key can ever hold: Burst (or Limit when 0)
// for a TokenBucket, Limit otherwise. A Take of more is ErrInvalidCost.
// A composite's is the least of its members'.
func (p Policy) Capacity() int64 {
	switch {
	case p.all != nil:
		return p.all.capacity // computed by All: Capacity stays cheap enough to inline
	case p.Algorithm == TokenBucket && p.Burst != 0:
		return p.Burst
	}
	return p.Limit
}

// Validate reports why p cannot be used, as an error matching
// ErrInvalidPolicy, or nil. A composite is checked as All says.
func (p Policy) Validate() error {
	if err := p.validateEnforcement(); err != nil {
		return err
	}
	if p.all != nil {
		return p.validateComposite()
	}
	if p.Limit <= 0 || p.Limit > MaxLimit {
		return fmt.Errorf("%w: limit must be between 1 and 2^48, got %d", ErrInvalidPolicy, p.Limit)
	}
	if p.Window < time.Millisecond {
		return fmt.Errorf("%w: window must be >= 1ms, got %v", ErrInvalidPolicy, p.Window)
	}
	if p.Window%time.Millisecond != 0 {
		return fmt.Errorf("%w: window must be a whole number of milliseconds, got %v", ErrInvalidPolicy, p.Window)
	}
	if len(p.Name) > maxPolicyNameLen {
		return fmt.Errorf("%w: name is %d bytes, at most %d allowed", ErrInvalidPolicy, len(p.Name), maxPolicyNameLen)
	}
	if !validName(p.Name) {
		return fmt.Errorf("%w: name %q: only printable ASCII without spaces is allowed", ErrInvalidPolicy, p.Name)
	}
	return p.validateAlgorithm()
}

// validateAlgorithm checks what each algorithm adds to the common bounds:
// the products its arithmetic forms must stay exact in every store.
func (p Policy) validateAlgorithm() error {
	w := p.Window.Milliseconds()
	switch p.Algorithm {
	case FixedWindow, SlidingLog, SlidingWindow:
		if p.Burst != 0 {
			return fmt.Errorf("%w: burst is only for a token bucket, got %d on a %v policy", ErrInvalidPolicy, p.Burst, p.Algorithm)
		}
	case TokenBucket:
		if p.Burst < 0 || p.Burst > MaxLimit {
			return fmt.Errorf("%w: burst must be between 0 (the limit) and 2^48, got %d", ErrInvalidPolicy, p.Burst)
		}
		if c := p.Capacity(); !scaledFits(c, w) {
			return fmt.Errorf("%w: a token bucket's capacity times its window in ms must be at most 2^53, got %d x %d", ErrInvalidPolicy, c, w)
		}
	default:
		return fmt.Errorf("%w: unknown algorithm %v", ErrInvalidPolicy, p.Algorithm)
	}
	switch {
	case p.Algorithm == SlidingLog && p.Limit > MaxLogLimit:
		return fmt.Errorf("%w: a sliding log's limit must be at most %d, got %d", ErrInvalidPolicy, MaxLogLimit, p.Limit)
	case p.Algorithm == SlidingWindow && !scaledFits(p.Limit, w):
		return fmt.Errorf("%w: a sliding window's limit times its window in ms must be at most 2^53, got %d x %d", ErrInvalidPolicy, p.Limit, w)
	}
	return nil
}

// scaledFits reports whether n·w <= 2^53, with no division (every call
// validates its policy) and no overflow.
func scaledFits(n, w int64) bool {
	hi, lo := bits.Mul64(uint64(n), uint64(w))
	return hi == 0 && lo <= maxScaled
}

func validName(name string) bool {
	if len(name) > maxPolicyNameLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}

// String describes p, for example "api: 5000 per 1h0m0s" or
// "10 per 1s (token-bucket, burst 20)"; a composite lists its members,
// "all(login-s: 1 per 1s; login-h: 100 per 1h0m0s)".
func (p Policy) String() string {
	if p.all != nil {
		return p.all.String()
	}
	s := fmt.Sprintf("%d per %v", p.Limit, p.Window)
	switch {
	case p.Algorithm == TokenBucket:
		s += fmt.Sprintf(" (%v, burst %d)", p.Algorithm, p.Capacity())
	case p.Algorithm != FixedWindow:
		s += " (" + p.Algorithm.String() + ")"
	}
	if p.Name != "" {
		s = p.Name + ": " + s
	}
	return s
}

// ValidateCall reports why op (OpTake, OpPeek or OpRefund) of cost units of
// key under p cannot be made, as an error matching ErrInvalidKey,
// ErrInvalidPolicy, ErrInvalidCost or ErrInvalidReceipt, checked in that
// order, or nil. Every Backend runs it first in each operation, and a
// Throttler when its backend fails; an application can run it on a key or a
// cost it is configured with.
//
//   - key: 1 to MaxKeyLen bytes.
//   - p: see Policy.Validate. A composite (All) is refunded member by
//     member, never in one Refund.
//   - cost: none for a Peek. At least 1 for a Take, and at most p's
//     Capacity: a Take of more could never be admitted, so it is an error
//     rather than a denial with a RetryAfter that would never help. At
//     least 1 and at most MaxLimit for a Refund, which clamps to what is
//     counted.
//   - receipt: a Refund's, which names the Take that counted its units (that
//     Take's Decision.ResetAt); the zero time names none. Unused by Take and
//     Peek, which pass the zero time.
func ValidateCall(op Op, key string, p Policy, cost int64, receipt time.Time) error {
	if err := validateKey(key); err != nil {
		return err
	}
	if err := p.Validate(); err != nil {
		return err
	}
	switch {
	case op == OpRefund && p.all != nil:
		return fmt.Errorf("%w: a composite is refunded member by member, each under its own receipt",
			ErrInvalidPolicy)
	case op == OpPeek:
		return nil
	case cost <= 0:
		return fmt.Errorf("%w: must be at least 1, got %d", ErrInvalidCost, cost)
	case op == OpTake && cost > p.Capacity():
		return fmt.Errorf("%w: %d is more than the policy's capacity of %d, so it could never be admitted",
			ErrInvalidCost, cost, p.Capacity())
	case cost > MaxLimit:
		return fmt.Errorf("%w: must be at most 2^48, got %d", ErrInvalidCost, cost)
	case op == OpRefund && receipt.IsZero():
		return fmt.Errorf("%w: the zero time names no Take; pass the ResetAt of the Take's Decision",
			ErrInvalidReceipt)
	}
	return nil
}

// validateKey reports why key cannot be used, as an error matching
// ErrInvalidKey, or nil.
func validateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: %d bytes, at most %d allowed", ErrInvalidKey, len(key), MaxKeyLen)
	}
	return nil
}
