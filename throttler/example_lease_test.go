package throttler_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// While the store is down, a Throttler that fails open (the default) grants
// a lease that no store holds: its ID is 0 and its Release calls nothing.
// Failing closed refuses instead, with an error matching ErrUnavailable.
func ExampleLease_failOpen() {
	exports := throttler.ConcurrencyPolicy{Name: "exports", Limit: 2, TTL: time.Minute}
	ctx := context.Background()
	for _, mode := range []bool{failOpen, failClosed} {
		th, err := throttler.New(downLeases{}, &throttler.Options{FailClosed: mode})
		if err != nil {
			log.Fatal(err)
		}
		l, d, err := th.Acquire(ctx, "account:7", exports)
		fmt.Println("allowed:", d.Allowed, "degraded:", d.Degraded, "unavailable:", errors.Is(err, throttler.ErrUnavailable))
		held, d, err := l.Release(ctx)
		fmt.Println("released: held", held, "degraded", d.Degraded, err)
	}
	// Output:
	// allowed: true degraded: true unavailable: false
	// released: held false degraded true <nil>
	// allowed: false degraded: true unavailable: true
	// released: held false degraded false <nil>
}

// downLeases is a store that holds leases and is down.
type downLeases struct{ downBackend }

func (downLeases) Acquire(context.Context, string, throttler.ConcurrencyPolicy, throttler.LeaseID, time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, fmt.Errorf("dial tcp 127.0.0.1:6379: connection refused")
}

func (downLeases) Release(context.Context, string, throttler.ConcurrencyPolicy, throttler.LeaseID, time.Time) (bool, throttler.Decision, error) {
	return false, throttler.Decision{}, fmt.Errorf("dial tcp 127.0.0.1:6379: connection refused")
}
