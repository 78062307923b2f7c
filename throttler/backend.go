package throttler

import (
	"context"
	"fmt"
	"time"
)

// Backend stores the state of limits. Every operation receives the caller's
// now: backends never read the clock, so two backends asked the same
// question at the same now answer alike, and tests move time without
// sleeping. Applications pick a Backend (backend/memory, backend/redis,
// backend/memcached, or a migration over two of them) and hand it to New;
// writing one is described in package backend.
//
// The storage identity of a limit is the policy's identity (see Policy) and
// the key. Keys are opaque bytes (see MaxKeyLen); a backend makes them legal
// for its store. Being over the limit is a Decision, never an error; errors
// mean bad input (ErrInvalidKey, ErrInvalidPolicy, ErrInvalidCost,
// ErrInvalidReceipt) or a failing store.
//
// The fixed-window contract, checked by backendtest.Run:
//   - A window opens at the key's first counted unit with ResetAt = now +
//     p.Window, stored and returned unchanged for every call inside it.
//   - A stored window whose ResetAt <= now has ended and reads as absent.
//   - Take admits cost only if Used+cost <= Limit; a denied Take counts
//     nothing. One round trip, atomic under any concurrency.
//   - Peek counts nothing; a replica may serve it.
//   - Refund gives units back only to what counted them, never below
//     zero. receipt names it: the ResetAt of the Decision of the Take that
//     counted the units. A stored window gets them back only while it is
//     open at now and its ResetAt is the receipt; otherwise nothing is
//     stored, and the Decision reports the state as a Peek would. So a
//     refund never credits a later window, even one that a process whose
//     clock runs ahead opened before the receipt. A zero receipt is
//     ErrInvalidReceipt.
//
// The other algorithms' Refund, with r the receipt and t now in Unix ms and
// w the Window in ms (docs/algorithms.md):
//   - sliding-window counter: only when the window K the call applies to
//     (a call before the stored window is answered in it) is the stored
//     one and the Take's, r == (K+1)·w.
//   - token bucket: only when max(t, t0) < r, t0 the stored last refill:
//     no clock that wrote or reads the state has reached the instant the
//     bucket was full again after the Take (later Takes only delay it), so
//     tokens that came back by refill are never returned; and only to a
//     stored bucket that is not full.
//   - sliding log: up to cost units from the live entries logged at or
//     before r−w, newest first. The Take's own entry is the newest of
//     those unless a clock behind logged a later one of the same or an
//     earlier ms, whose units then go instead (never more than cost);
//     entries a clock ahead logged after the Take are never touched.
//
// A backend whose Traits say Composites takes a composite policy (see All)
// in Take and Peek, on its members' own states (the same as each member's
// alone: nothing forks), and keeps these rules:
//   - Take is all or nothing, atomic under any concurrency: it counts cost
//     in every member only if every member admits it; otherwise it changes
//     no state at all. (A store without transactions over several items
//     keeps this for calls made one after another and states its bound
//     under concurrency and failure: docs/backends-memcached.md.)
//   - The Decision (built by Combine) is Allowed only if every member
//     admits; its Remaining is the least of the members'. Its Limit, Used,
//     ResetAt and RetryAfter are the binding member's (Decision.Binding):
//     the one with the least Remaining, or when denied, the denying one
//     with the longest RetryAfter, which is then the least wait after
//     which the composite is admitted if nobody else spends (each member's
//     admission only gets nearer as time passes). Ties go to the latest
//     ResetAt, then to the first member.
//   - Decision.Members holds each member's own Decision in order. When the
//     composite is denied, a denying member's is what its own denied Take
//     answers, and an admitting one's is its state as it stands (a Peek's)
//     with Allowed set.
//   - A Peek of a composite is the Combine of its members' Peeks.
//   - Refund never takes a composite (ErrInvalidPolicy): a Throttler
//     refunds a composite member by member, each under its own receipt,
//     its Decision's ResetAt in Members.
//
// A backend without Composites need not check for them: a Throttler
// refuses a composite before calling it (SupportsComposites).
//
// Implementations must be safe for concurrent use.
type Backend interface {
	Take(ctx context.Context, key string, p Policy, cost int64, now time.Time) (Decision, error)
	Peek(ctx context.Context, key string, p Policy, now time.Time) (Decision, error)
	Refund(ctx context.Context, key string, p Policy, cost int64, receipt, now time.Time) (Decision, error)
}

// Op names a Backend operation, in observations and in the shadow's
// results. The zero value is no operation.
type Op uint8

const (
	OpTake Op = iota + 1
	OpPeek
	OpRefund
	// OpAcquire and OpRelease are a LeaseBackend's operations.
	OpAcquire
	OpRelease
)

var opNames = [...]string{OpTake: "take", OpPeek: "peek", OpRefund: "refund", OpAcquire: "acquire", OpRelease: "release"}

// String returns "take", "peek", "refund", "acquire" or "release", and
// "Op(n)" for anything else.
func (op Op) String() string {
	if op >= OpTake && int(op) < len(opNames) {
		return opNames[op]
	}
	return fmt.Sprintf("Op(%d)", uint8(op))
}
