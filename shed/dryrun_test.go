package shed_test

import (
	"testing"

	"github.com/throttlekit/throttlekit/shed"
)

// TestMiddlewareDryRunRate: a rate limit in dry run never refuses in the
// chain, leaves no HeaderLimiter and no rate headers, and still counts.
func TestMiddlewareDryRunRate(t *testing.T) {
	g := newRig(t, failOpen)
	g.rate = g.rate.DryRun()
	g.opts.Rate = g.rateLimit(t, nil)
	h := g.handler(t)
	for range 4 {
		w := g.serve(h, "GET", "alice")
		checkHeaders(t, "dry run", w, 200, map[string]string{shed.HeaderLimiter: "", "Retry-After": "", "X-RateLimit-Remaining": ""})
	}
	if g.reached != 4 {
		t.Errorf("the handler was reached %d times, want 4", g.reached)
	}
	if used := g.rateUsed(t, "alice"); used != 2 {
		t.Errorf("the dry-run limit counted %d, want 2 (its limit: would-be denials count nothing)", used)
	}
}
