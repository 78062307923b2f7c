package httplimit

import (
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// ResetOf is the instant Rate's X-RateLimit-Reset names for d, made at now
// under p.
func ResetOf(p throttler.Policy, d throttler.Decision, now time.Time) time.Time {
	return resetOf(p, d, now)
}
