package memory_test

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

func Example() {
	b, err := memory.New(&memory.Options{MaxKeys: 100_000})
	if err != nil {
		panic(err)
	}
	p := throttler.PerMinute(3).Named("api")
	now := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	ctx := context.Background()

	taken, _ := b.Take(ctx, "alice", p, 2, now)
	fmt.Println(taken.Allowed, taken.Used, taken.Remaining, taken.ResetAt.UTC().Format(time.TimeOnly))
	d, _ := b.Take(ctx, "alice", p, 2, now.Add(time.Second))
	fmt.Println(d.Allowed, d.Used, d.Remaining, d.RetryAfter)
	_, err = b.Take(ctx, "alice", p, 4, now.Add(time.Second))
	fmt.Println(err)
	// The refund names the Take whose units it gives back by its ResetAt.
	d, _ = b.Refund(ctx, "alice", p, 1, taken.ResetAt, now.Add(2*time.Second))
	fmt.Println(d.Allowed, d.Used, d.Remaining)
	// Output:
	// true 2 1 03:05:05
	// false 2 1 59s
	// throttler: invalid cost: 4 is more than the policy's capacity of 3, so it could never be admitted
	// true 1 2
}
