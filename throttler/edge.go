package throttler

import "github.com/throttlekit/throttlekit/internal/edge"

// The HTTP edge (package httplimit) computes its headers from the instant a
// decision was made at, which only takeOne and refund return, and refuses at
// construction a Throttler that New did not build.
func init() {
	edge.Built = func(t *Throttler) bool { return t != nil && t.backend != nil }
	edge.Take = (*Throttler).takeOne
	edge.Refund = (*Throttler).refund
}
