// Package edge carries three functions of a Throttler from package throttler
// to package httplimit, which needs them and no application does: a Take of
// one unit and a Refund, each also returning the instant the Throttler read
// from its clock for it (the HTTP headers are computed from that instant, so
// that a request reads the clock once), and whether New built the Throttler.
// Package throttler sets them in its init; package httplimit asserts their
// types once, when it is initialized.
// They are values of type any because this package imports nothing of the
// module, as every helper in the top-level internal/ does.
package edge

var (
	// Built is func(*throttler.Throttler) bool.
	Built any
	// Take is func(*throttler.Throttler, context.Context, string,
	// throttler.Policy) (throttler.Decision, time.Time, error).
	Take any
	// Refund is func(*throttler.Throttler, context.Context, string,
	// throttler.Policy, int64, throttler.Decision) (throttler.Decision,
	// time.Time, error).
	Refund any
)
