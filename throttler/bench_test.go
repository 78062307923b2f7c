package throttler_test

import (
	"context"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

// BenchmarkAllow is what the Throttler adds to a backend call: the clock,
// the per-call timeout's context, the breaker and the decision's path.
func BenchmarkAllow(b *testing.B) {
	p := throttler.Policy{Name: "bench", Limit: 1 << 40, Window: time.Hour}
	ctx := context.Background()
	m := memory.New(nil)
	now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	b.Run("backend", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := m.Take(ctx, "client", p, 1, now); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("throttler", func(b *testing.B) {
		th := throttler.New(m, nil)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := th.Allow(ctx, "client", p); err != nil {
				b.Fatal(err)
			}
		}
	})
}
