package throttler_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/internal/cputime"
	"github.com/throttlekit/throttlekit/throttler"
)

// BenchmarkAllowEnforceInterleaved is what a policy's enforcement costs a
// memory-backend Allow, measured side by side as in
// BenchmarkAllowInterleaved: rounds of 1,000 calls each of the same Allow
// under a policy enforced for every key (no Enforcer), in dry run, and
// enforced for 50% of keys by a flags.Percent. Once on a key far below its
// limit (admitted: the Enforcer is not asked), once on a key at its limit (a
// denial, or a would-be denial, for which Enforced is asked; the 50%
// rollout's key is outside it, so its bucket is hashed). The extra costs
// are the median differences from the enforced call in the same round.
func BenchmarkAllowEnforceInterleaved(b *testing.B) {
	if !cputime.Supported {
		b.Skip("no thread CPU clock here")
	}
	ctx := context.Background()
	th := newThrottler(b, newMemory(b), nil)
	pct, err := flags.NewPercentFor("bench-limit", 50)
	if err != nil {
		b.Fatal(err)
	}
	half, err := flags.Enforcement(pct)
	if err != nil {
		b.Fatal(err)
	}
	key := "client-0"
	for i := 0; pct.UseNew(key); i++ {
		key = "client-" + string(rune('a'+i))
	}
	open := throttler.Policy{Name: "open", Limit: 1 << 40, Window: time.Hour}
	full := throttler.Policy{Name: "full", Limit: 1, Window: time.Hour}
	partial := func(p throttler.Policy) throttler.Policy { return p.EnforcedBy(half) }
	if _, err := th.Allow(ctx, key, full); err != nil {
		b.Fatal(err)
	}
	calls := []struct {
		name string
		p    throttler.Policy
	}{
		{"admitted", open}, {"admitted-dry-run", open.DryRun()}, {"admitted-partial", partial(open)},
		{"denied", full}, {"denied-dry-run", full.DryRun()}, {"denied-partial", partial(full)},
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r := newRounds(b, len(calls))
	for b.Loop() {
		for i, c := range calls {
			start := cputime.Thread()
			for range turn {
				if _, err := th.Allow(ctx, key, c.p); err != nil {
					b.Fatal(err)
				}
			}
			r.add(i, start)
		}
	}
	for i, c := range calls {
		r.report(i, c.name, i/3*3, "-extra-ns") // against the enforced call of its three
	}
	b.ReportMetric(0, "ns/op")
}
