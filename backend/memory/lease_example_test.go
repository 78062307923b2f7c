package memory_test

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

// At most two exports in flight per client: a third waits for a release,
// or for the TTL of a lease whose holder never released it.
func ExampleBackend_Acquire() {
	b, err := memory.New(nil)
	if err != nil {
		panic(err)
	}
	p := throttler.ConcurrencyPolicy{Name: "exports", Limit: 2, TTL: time.Minute}
	now := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	ctx := context.Background()

	d, _ := b.Acquire(ctx, "alice", p, 1, now)
	fmt.Println(d.Allowed, d.Used, d.Remaining)
	d, _ = b.Acquire(ctx, "alice", p, 2, now.Add(time.Second))
	fmt.Println(d.Allowed, d.Used, d.Remaining)
	d, _ = b.Acquire(ctx, "alice", p, 3, now.Add(2*time.Second))
	fmt.Println(d.Allowed, d.Used, d.RetryAfter) // lease 1 ends at +1m
	held, d, _ := b.Release(ctx, "alice", p, 1, now.Add(3*time.Second))
	fmt.Println(held, d.Used)
	held, _, _ = b.Release(ctx, "alice", p, 1, now.Add(4*time.Second))
	fmt.Println(held) // released already: harmless
	d, _ = b.Acquire(ctx, "alice", p, 3, now.Add(5*time.Second))
	fmt.Println(d.Allowed, d.Used)
	// Output:
	// true 1 1
	// true 2 0
	// false 2 58s
	// true 1
	// false
	// true 2
}
