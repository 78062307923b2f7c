// Package throttler limits how often each client may do something: the API
// an application uses. Pick a Backend (the in-process backend/memory, or
// backend/redis or backend/memcached for a fleet), build a Throttler over it
// once, and ask it per request (ExampleThrottler_Allow runs it):
//
//	import (
//		"github.com/throttlekit/throttlekit/backend/memory"
//		"github.com/throttlekit/throttlekit/throttler"
//	)
//
//	store, err := memory.New(nil)
//	if err != nil { ... }
//	th, err := throttler.New(store, nil) // real clock, 100ms timeout, fail open
//	if err != nil { ... }
//	core := throttler.PerHour(5000).Named("core")
//
//	d, err := th.Allow(ctx, "user:42", core)
//	if err == nil && !d.Allowed {
//		// over the limit: retry after d.RetryAfter
//	}
//
// To limit HTTP requests, put package httplimit's middleware in front of a
// handler: it counts each request, refunds a 304 and writes the
// X-RateLimit-* headers.
//
// # Construction
//
// Every constructor (New, and the backends' New) checks what it is given
// and returns an error naming the bad field: a nil backend, a negative
// duration, a Timeout under 1ms, an invalid Policy. A misconfigured
// limiter fails when the program starts, never by failing every call and
// letting everything through. Zero values mean defaults; nil options mean
// all defaults.
//
// # Policies and decisions
//
// A Policy is a limit: Limit units per Window. Named policies keep their
// state across a change of Limit; two different unnamed policies never
// share state (see Policy for the identity of a limit). A Decision is what
// one call saw: Allowed, Limit, Used, Remaining, ResetAt and RetryAfter,
// all from the single backend call that decided, so the headers built from
// it never contradict each other.
//
// All combines up to MaxMembers policies on one key, such as a login's 1
// a second and 100 an hour, into one Policy whose Take is all or nothing:
// admitted only if every member admits, and then counted in every member,
// else in none (see Backend for the rules, and SupportsComposites).
//
// # Failures
//
// Bad input (an empty key, a cost above the limit) is an error matching
// ErrInvalidKey, ErrInvalidPolicy or ErrInvalidCost (IsInputError): it is
// never counted as a store outage, so it is never answered by a fallback or
// by failing open. A store that fails or times out (has no answer yet when
// Options.Timeout has passed and the caller looks) is an outage: the
// Throttler answers from Options.Fallback, or fails open (allows, marks the
// Decision Degraded) or closed (ErrUnavailable), as Options.FailClosed
// says, and reports it to Options.Observe, so that failing open is always
// visible. A fallback counts a share of each limit (FallbackFleetSize),
// and answers a key it answered until its window there has ended, so that
// one store answers each window.
//
// Breakers keep an outage from costing every request a timeout, and are
// scoped to what failed. There is one per store (a Redis shard, a Memcached
// server: backends name them in their Traits), and only failures of the
// store itself count toward it: this Throttler's Timeout, a network error,
// or an error a backend marked as its store's (matching ErrUnavailable).
// One key's bad data (ErrKeyState), a full in-process table and the like
// still get the failure mode for that call, never for other keys. A
// cooldown runs on the monotonic clock, never on Options.Clock, and when it
// ends exactly one call probes the store (see Options.BreakerThreshold and
// BreakerCooldown).
//
// # Concurrency
//
// Acquire takes a lease under a ConcurrencyPolicy: at most Limit leases of
// one key held at once, each released when its work ends (Lease.Release)
// or counting no longer after its TTL, so that a crashed process never
// holds capacity for good. Leases go through the same failure handling as
// Allow (breakers, Timeout, fallback, failure mode, Observe with OpAcquire
// and OpRelease); a Release always goes back to whoever granted its lease.
// Backends that hold leases implement LeaseBackend (SupportsLeases).
//
// # Waiting
//
// Allow answers at once. Wait and WaitN block instead until the units are
// admitted, sleeping each denial's RetryAfter (plus a little jitter, never
// less), and return ErrWouldExceedDeadline at once when the context's
// deadline comes before the earliest admission, as golang.org/x/time/rate
// does, also for a waiter queued behind others of its key (see WaitN for
// how it knows). A key its policy runs in dry run never waits, also after a
// rollback: enforcement is read at each call, and a sleeping waiter
// re-reads it every second. They are for callers that can afford to delay
// work (outbound calls; see package outbound), not for answering clients.
//
// Errors may contain the client's key: log them, never send them to a
// client (package httplimit's answers hold only the status text). Keys
// that are secrets (API tokens) are best hashed before they reach a store.
//
// # Time
//
// The Throttler reads Options.Clock once per call and hands that instant to
// the backend, which never reads a clock: tests move time by moving the
// clock, and two backends asked the same question at the same instant
// answer alike (which the shadow comparison of a migration relies on).
//
// # Writing a backend
//
// Backend is the interface applications pass around; its doc is the
// contract a backend keeps (LeaseBackend's, for concurrency limits). A
// backend starts each operation with ValidateCall (a lease: ValidateLease),
// marks its store's failures with StoreFailure and one key's with
// KeyFailure, and declares what a Throttler needs to know of its store in
// Traits; a wrapper derives its own with TraitsOf. The rest (an operation
// named as a value, batching counts, the conformance suite) is in package
// github.com/throttlekit/throttlekit/backend and its backendtest.
package throttler
