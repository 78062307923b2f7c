// Package httplimit is throttlekit's HTTP edge: middleware that limits each
// client's requests through a throttler.Throttler, and the one place where
// a limit's answer becomes a status and headers.
//
//   - Rate limits a client's request rate under a throttler.Policy: one
//     unit counted when a request starts, given back for a refundable
//     answer (304 Not Modified).
//   - Concurrency limits a client's requests in flight under a
//     throttler.ConcurrencyPolicy, with a lease held while the handler
//     runs.
//
// Both name the client with a KeyFunc (KeyByHeader, KeyByRemoteIP, or your
// own), refuse a misconfiguration when they are built, and answer a request
// they could not decide with WriteError (or Options.OnError). On one route,
// Concurrency goes first, so that a request refused for being one too many
// in flight is not counted against the rate:
//
//	user := httplimit.KeyByHeader("X-User-ID")
//	inflight, err := httplimit.Concurrency(th, throttler.Concurrent(2, time.Minute), user, nil)
//	...
//	perMinute, err := httplimit.Rate(th, throttler.PerMinute(100).Named("api"), user, nil)
//	...
//	http.Handle("/api/", inflight(perMinute(api)))
//
// Package shed runs both after Stripe's two load shedders.
//
// # Headers
//
// Rate sets on every answer, from the one backend call that decided it:
// X-RateLimit-Limit (the policy's capacity), -Remaining and -Used (left out
// when the store was down and nothing is known), -Reset (Unix seconds,
// rounded up) and -Resource (the policy's Name, when it has one); with
// Options.IETFHeaders also RateLimit-Policy and RateLimit
// (draft-ietf-httpapi-ratelimit-headers). A denied request gets
// DeniedStatus (429) and Retry-After, in whole seconds rounded up. A key
// that the policy runs in dry run (throttler.Policy.EnforcedBy) is never
// refused and gets none of these headers, unless Options.DryRunHeaders
// asks for the X-RateLimit-* and IETF ones.
// Concurrency sets the same X-RateLimit-* headers, of its own limit, on
// the requests it refuses.
//
// X-RateLimit-Reset (and the IETF RateLimit's t) names an instant at which
// a client that returns is admitted if nobody else spent in between, on
// every algorithm: a denied answer's is never earlier than its
// Retry-After, and an answer with nothing remaining names when one unit
// fits again. It is the Decision's ResetAt except where that comes
// earlier: a sliding-window counter's ResetAt is the end of the current
// window, while the previous window's count may still weigh after it. The
// headers are computed at the instant the Throttler read its clock for
// the decision: one reading per request (and one for a 304's refund).
//
// # Errors
//
// WriteError maps what went wrong to whose it is: 400 for a request that
// names no usable client key, 499 for a client that has gone, 503 with
// Retry-After: 1 for a store that failed while the Throttler fails closed
// or a request whose deadline passed, 500 for anything else. Its answers
// hold the status text alone: errors can hold the client's key, so they go
// to the Throttler's Observe and your logs, never to the client. Keys that
// are secrets (API tokens) are best hashed by the KeyFunc before they reach
// a store (see ExampleKeyFunc_hashed).
package httplimit
