package throttler

import (
	"fmt"
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

// MaxPolicyNameLen is the longest Policy.Name, in bytes.
const MaxPolicyNameLen = 128

// Policy names a limit: Limit units per Window, counted in fixed windows.
//
// The storage identity of a limit is (Name, key): the same client key under
// two policies is counted in two independent windows. Changing Limit of a
// live policy applies at once to the open window (its count is kept);
// changing Window applies from the next window.
type Policy struct {
	// Name identifies the limit in storage and in the X-RateLimit-Resource
	// header. It may be empty; otherwise it is printable ASCII without spaces.
	Name string
	// Limit is how many units a key may take per window: 1 to MaxLimit.
	Limit int64
	// Window is the length of a window, opened by the first counted request.
	// Must be at least one millisecond, the unit that stores keep.
	Window time.Duration
}

// PerSecond returns an unnamed policy of n units per second.
func PerSecond(n int64) Policy { return Policy{Limit: n, Window: time.Second} }

// PerMinute returns an unnamed policy of n units per minute.
func PerMinute(n int64) Policy { return Policy{Limit: n, Window: time.Minute} }

// PerHour returns an unnamed policy of n units per hour.
func PerHour(n int64) Policy { return Policy{Limit: n, Window: time.Hour} }

// Named returns a copy of p with the given name.
func (p Policy) Named(name string) Policy {
	p.Name = name
	return p
}

// Validate reports why p cannot be used, as an error matching
// ErrInvalidPolicy, or nil.
func (p Policy) Validate() error {
	if p.Limit <= 0 || p.Limit > MaxLimit {
		return fmt.Errorf("%w: limit must be between 1 and 2^48, got %d", ErrInvalidPolicy, p.Limit)
	}
	if p.Window < time.Millisecond {
		return fmt.Errorf("%w: window must be >= 1ms, got %v", ErrInvalidPolicy, p.Window)
	}
	if p.Window%time.Millisecond != 0 {
		return fmt.Errorf("%w: window must be a whole number of milliseconds, got %v", ErrInvalidPolicy, p.Window)
	}
	if len(p.Name) > MaxPolicyNameLen {
		return fmt.Errorf("%w: name is %d bytes, at most %d allowed", ErrInvalidPolicy, len(p.Name), MaxPolicyNameLen)
	}
	if !validName(p.Name) {
		return fmt.Errorf("%w: name %q: only printable ASCII without spaces is allowed", ErrInvalidPolicy, p.Name)
	}
	return nil
}

func validName(name string) bool {
	if len(name) > MaxPolicyNameLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}

// String describes p, for example "api: 5000 per 1h0m0s".
func (p Policy) String() string {
	s := fmt.Sprintf("%d per %v", p.Limit, p.Window)
	if p.Name != "" {
		s = p.Name + ": " + s
	}
	return s
}

// ValidateKey reports why key cannot be used, as an error matching
// ErrInvalidKey, or nil.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: %d bytes, at most %d allowed", ErrInvalidKey, len(key), MaxKeyLen)
	}
	return nil
}

// ValidateCost reports why cost cannot be taken or refunded, as an error
// matching ErrInvalidCost, or nil.
func ValidateCost(cost int64) error {
	if cost <= 0 || cost > MaxLimit {
		return fmt.Errorf("%w: must be between 1 and 2^48, got %d", ErrInvalidCost, cost)
	}
	return nil
}

// ValidateCall checks everything a Backend operation receives, so that
// backends, routers and shadows reject bad input alike before any store is
// called. Use cost 1 for Peek.
func ValidateCall(key string, p Policy, cost int64) error {
	// Small enough to inline: every backend operation runs it.
	if key != "" && len(key) <= MaxKeyLen && cost > 0 && cost <= MaxLimit && p.Limit > 0 && p.Limit <= MaxLimit &&
		p.Window >= time.Millisecond && p.Window%time.Millisecond == 0 && validName(p.Name) {
		return nil
	}
	return validateCall(key, p, cost)
}

func validateCall(key string, p Policy, cost int64) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	if err := p.Validate(); err != nil {
		return err
	}
	return ValidateCost(cost)
}
