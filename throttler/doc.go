// Package throttler limits how often each client may do something: the API
// an application uses. Pick a Backend (the in-process backend/memory, or
// Redis or Memcached for a fleet), build a Throttler over it once, and ask
// it per request, directly or through its HTTP middleware:
//
//	store, err := memory.New(nil)
//	if err != nil { ... }
//	th, err := throttler.New(store, nil) // real clock, 100ms timeout, fail open
//	if err != nil { ... }
//	core := throttler.PerHour(5000).Named("core")
//
//	mw, err := th.Middleware(core, throttler.KeyByHeader("X-User-ID"), nil)
//	if err != nil { ... } // a bad policy or option fails here, at start-up
//	http.Handle("/api/", mw(api))
//
//	d, err := th.Allow(ctx, "user:42", core) // or directly
//	if err == nil && !d.Allowed {
//		// over the limit: retry after d.RetryAfter
//	}
//
// # Policies and decisions
//
// A Policy is a limit: Limit units per Window. Named policies keep their
// state across a change of Limit; see Policy for the identity of a limit. A
// Decision is what one call saw: Allowed, Limit, Used, Remaining, ResetAt
// and RetryAfter, all from the single backend call that decided, so the
// X-RateLimit-* headers built from it never contradict each other.
//
// # Failures
//
// Bad input (an empty key, a cost above the limit) is an error matching
// ErrInvalidKey, ErrInvalidPolicy or ErrInvalidCost, and a misconfiguration
// is an error from the constructor: neither ever counts as a store outage.
// A store that fails or times out is an outage: the Throttler answers from
// Options.Fallback, or fails open (allows, marks the Decision Degraded) or
// closed (ErrUnavailable), as Options.FailureMode says, and reports it to
// Options.Observe, so that failing open is always visible.
//
// Errors may contain the client's key: log them, never send them to a
// client. Keys that are secrets (API tokens) are best hashed by the KeyFunc
// before they reach a store.
//
// # Time
//
// The Throttler reads Options.Clock once per call and hands that instant to
// the backend, which never reads a clock: tests move time by moving the
// clock, and two backends asked the same question at the same instant
// answer alike (which the shadow comparison of a migration relies on).
package throttler
