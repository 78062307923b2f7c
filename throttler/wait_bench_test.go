package throttler_test

import (
	"context"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// BenchmarkWaitParallel is Wait admitted at once, as most Waits are, from
// parallel goroutines that each use a Throttler of their own over their
// own memory store: what one Throttler's waiters cost another's.
func BenchmarkWaitParallel(b *testing.B) {
	p := throttler.Policy{Name: "bench", Limit: 1 << 40, Window: time.Hour}
	ctx := context.Background()
	now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	o := &throttler.Options{Clock: func() time.Time { return now }}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		th := newThrottler(b, newMemory(b), o)
		for pb.Next() {
			if _, err := th.Wait(ctx, "client", p); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
