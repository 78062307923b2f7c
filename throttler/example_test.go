package throttler_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

func ExampleThrottler_Allow() {
	store, err := memory.New(nil)
	if err != nil {
		log.Fatal(err)
	}
	now := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	th, err := throttler.New(store, &throttler.Options{Clock: func() time.Time { return now }})
	if err != nil {
		log.Fatal(err)
	}
	p := throttler.PerMinute(2).Named("login")
	for range 3 {
		d, err := th.Allow(context.Background(), "alice", p)
		if err != nil {
			log.Fatal(err) // bad input, or the store failed while failing closed
		}
		fmt.Printf("allowed=%v remaining=%d retry in %v\n", d.Allowed, d.Remaining, d.RetryAfter)
	}
	// Output:
	// allowed=true remaining=1 retry in 0s
	// allowed=true remaining=0 retry in 0s
	// allowed=false remaining=0 retry in 1m0s
}

func ExamplePolicy() {
	p := throttler.PerHour(5000).Named("core")
	fmt.Println(p, p.Validate())
	fmt.Println(throttler.PerSecond(0).Validate())
	// Output:
	// core: 5000 per 1h0m0s <nil>
	// throttler: invalid policy: limit must be between 1 and 2^48, got 0
}

func ExampleEvery() {
	store, err := memory.New(nil)
	if err != nil {
		log.Fatal(err)
	}
	now := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	th, err := throttler.New(store, &throttler.Options{Clock: func() time.Time { return now }})
	if err != nil {
		log.Fatal(err)
	}
	// One request per 200ms, as rate.NewLimiter(rate.Every(200*time.Millisecond), 1).
	p := throttler.Every(200 * time.Millisecond)
	fmt.Println(p)
	for _, after := range []time.Duration{0, 50 * time.Millisecond, 150 * time.Millisecond} {
		now = now.Add(after)
		d, err := th.Allow(context.Background(), "alice", p)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("+%v: allowed=%v retry in %v\n", after, d.Allowed, d.RetryAfter)
	}
	// Output:
	// 1 per 200ms (token-bucket, burst 1)
	// +0s: allowed=true retry in 0s
	// +50ms: allowed=false retry in 150ms
	// +150ms: allowed=true retry in 0s
}

func ExampleNew() {
	// A configuration that cannot work is an error, never a Throttler that
	// fails every call and lets everything through.
	_, err := throttler.New(nil, nil)
	fmt.Println(err)
	_, err = throttler.New(&downBackend{}, &throttler.Options{Timeout: -time.Second})
	fmt.Println(err)
	// Output:
	// throttler: New needs a backend, got nil
	// throttler: Options.Timeout must be >= 0, got -1s
}

func ExampleNew_fallback() {
	// A Throttler over a store that is down fails over to an in-process
	// memory backend, so limits keep holding per process.
	fallback, err := memory.New(nil)
	if err != nil {
		log.Fatal(err)
	}
	th, err := throttler.New(downBackend{}, &throttler.Options{Fallback: fallback})
	if err != nil {
		log.Fatal(err)
	}
	d, err := th.Allow(context.Background(), "alice", throttler.PerMinute(10))
	fmt.Println(d.Allowed, d.Degraded, d.Remaining, err)
	// Output:
	// true true 9 <nil>
}

type downBackend struct{}

func (downBackend) Take(context.Context, string, throttler.Policy, int64, time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, fmt.Errorf("dial tcp 127.0.0.1:6379: connection refused")
}

func (d downBackend) Peek(ctx context.Context, k string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	return d.Take(ctx, k, p, 1, now)
}

func (d downBackend) Refund(ctx context.Context, k string, p throttler.Policy, n int64, _, now time.Time) (throttler.Decision, error) {
	return d.Take(ctx, k, p, n, now)
}

// At most two exports of one account run at once: each acquires a lease
// and releases it when it ends; a third is refused until one ends. A lease
// never released (a crashed worker) stops counting after its TTL.
func ExampleThrottler_Acquire() {
	store, err := memory.New(nil) // memory, Redis and Memcached hold leases
	if err != nil {
		log.Fatal(err)
	}
	now := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	th, err := throttler.New(store, &throttler.Options{Clock: func() time.Time { return now }})
	if err != nil {
		log.Fatal(err)
	}
	exports := throttler.ConcurrencyPolicy{Name: "exports", Limit: 2, TTL: time.Minute}
	ctx := context.Background()

	first, d, _ := th.Acquire(ctx, "account:7", exports)
	fmt.Println("first:", d.Allowed, "in flight:", d.Used)
	_, d, _ = th.Acquire(ctx, "account:7", exports)
	fmt.Println("second:", d.Allowed, "in flight:", d.Used)
	third, d, _ := th.Acquire(ctx, "account:7", exports)
	fmt.Println("third:", d.Allowed, "retry after:", d.RetryAfter)
	_, _, _ = third.Release(ctx) // a refused lease releases nothing

	held, _, _ := first.Release(ctx)
	fmt.Println("first released:", held)
	_, d, _ = th.Acquire(ctx, "account:7", exports)
	fmt.Println("fourth:", d.Allowed)
	// Output:
	// first: true in flight: 1
	// second: true in flight: 2
	// third: false retry after: 1m0s
	// first released: true
	// fourth: true
}
