package throttler_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

// A worker calling a partner that allows 2 calls per 100ms waits for
// capacity instead of failing: the third call is admitted once the first
// two have left the window. A context whose deadline comes before the
// earliest admission fails at once instead of waiting in vain.
func ExampleThrottler_Wait() {
	store, err := memory.New(nil) // backend/redis for a fleet of workers
	if err != nil {
		log.Fatal(err)
	}
	th, err := throttler.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	partner := throttler.Policy{Name: "partner", Limit: 2, Window: 100 * time.Millisecond, Algorithm: throttler.SlidingLog}

	ctx := context.Background()
	start := time.Now()
	for i := range 3 {
		if _, err := th.Wait(ctx, "partner-api", partner); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("call %d admitted\n", i+1)
	}
	fmt.Println("the third waited for the window:", time.Since(start) >= partner.Window)

	daily := throttler.PerHour(24).Named("daily")
	if _, err := th.AllowN(ctx, "report", daily, 24); err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	d, err := th.Wait(ctx, "report", daily)
	fmt.Println(errors.Is(err, throttler.ErrWouldExceedDeadline), d.RetryAfter > time.Second)
	// Output:
	// call 1 admitted
	// call 2 admitted
	// call 3 admitted
	// the third waited for the window: true
	// true true
}
