package throttler

import (
	"context"
	"time"
)

// Backend stores fixed windows. Every operation receives the caller's now:
// backends never read the clock, so two backends asked the same question at
// the same now answer alike, and tests move time without sleeping.
//
// The storage identity of a window is (p.Name, key). Keys are opaque bytes
// (see MaxKeyLen); a backend makes them legal for its store. Being over the
// limit is a Decision, never an error; errors mean bad input (ErrInvalidKey,
// ErrInvalidPolicy, ErrInvalidCost) or a failing store.
//
// The fixed-window contract, checked by backendtest.Run:
//   - A window opens at the key's first counted unit with ResetAt = now +
//     p.Window, stored and returned unchanged for every call inside it.
//   - A stored window whose ResetAt <= now has ended and reads as absent.
//   - Take admits cost only if Used+cost <= Limit; a denied Take counts
//     nothing. One round trip, atomic under any concurrency.
//   - Peek counts nothing; a replica may serve it.
//   - Refund gives units back to the open window, never below zero, and
//     does nothing when no window is open.
//
// Implementations must be safe for concurrent use.
type Backend interface {
	Take(ctx context.Context, key string, p Policy, cost int64, now time.Time) (Decision, error)
	Peek(ctx context.Context, key string, p Policy, now time.Time) (Decision, error)
	Refund(ctx context.Context, key string, p Policy, cost int64, now time.Time) (Decision, error)
}

// InProcess is implemented by backends that can say their calls answer from
// memory without blocking (backend/memory), and by wrappers (router, shadow)
// that say what they wrap. The Throttler calls such a backend without a
// timeout context, which would cost more than the call itself.
type InProcess interface {
	InProcess() bool
}

// IsInProcess reports whether b says its calls never block.
func IsInProcess(b Backend) bool {
	l, ok := b.(InProcess)
	return ok && l.InProcess()
}

// Op names a Backend operation.
type Op string

const (
	OpTake   Op = "take"
	OpPeek   Op = "peek"
	OpRefund Op = "refund"
)

// Do runs op on b: Take or Refund of cost, or Peek (cost unused). Code that
// forwards, replays or tabulates calls (a shadow's mirror, a test's steps)
// names the operation as a value and calls Do.
func Do(ctx context.Context, b Backend, op Op, key string, p Policy, cost int64, now time.Time) (Decision, error) {
	switch op {
	case OpPeek:
		return b.Peek(ctx, key, p, now)
	case OpRefund:
		return b.Refund(ctx, key, p, cost, now)
	default:
		return b.Take(ctx, key, p, cost, now)
	}
}
