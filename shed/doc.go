// Package shed holds Stripe's two load shedders and the HTTP middleware that
// runs all four of Stripe's limiters in its order.
//
//   - Worker sheds the least important traffic of a saturated process,
//     slowly: Stripe's worker utilization load shedder, a derivative
//     controller that starts shedding after 28 s of bad utilization and
//     sheds all shed-able traffic 120 s later.
//   - Fleet keeps a share of a fleet-wide concurrency limit for critical
//     traffic: Stripe's fleet usage load shedder, built on a Throttler's
//     leases (Throttler.Acquire) over one global key.
//   - Middleware runs the worker shedder, the fleet shedder, a per-client
//     concurrency limit and a per-client request rate (package httplimit's
//     Concurrency and Rate), in that order, each optional, each refusal
//     with its own status and headers.
//
// Requests are sorted into priority Classes (Options); shedders drop
// the least important first (test-mode traffic, then reads, then writes) and
// never drop Critical traffic.
package shed
