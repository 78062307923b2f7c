package httplimit

import (
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// ResetOf is the instant Rate's X-RateLimit-Reset names for d, made at now
// under p (d straight from a backend, which leaves d.At to the Throttler).
func ResetOf(p throttler.Policy, d throttler.Decision, now time.Time) time.Time {
	d.At = now
	return resetOf(p, d)
}
