package throttler_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

// A login limited to 1 attempt a second and 100 an hour: an attempt counts
// in both limits or in neither, so a client refused by the second loses
// nothing of its hour.
func ExampleAll() {
	store, err := memory.New(nil)
	if err != nil {
		log.Fatal(err)
	}
	now := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	th, err := throttler.New(store, &throttler.Options{Clock: func() time.Time { return now }})
	if err != nil {
		log.Fatal(err)
	}
	login := throttler.All(throttler.PerSecond(1).Named("login-s"), throttler.PerHour(100).Named("login-h"))
	for _, after := range []time.Duration{0, 500 * time.Millisecond, 500 * time.Millisecond} {
		now = now.Add(after)
		d, err := th.Allow(context.Background(), "alice", login)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("allowed=%v retry in %v;", d.Allowed, d.RetryAfter)
		for i, m := range d.Members() {
			fmt.Printf(" member %d used %d of %d;", i, m.Used, m.Limit)
		}
		fmt.Println()
	}
	// Output:
	// allowed=true retry in 0s; member 0 used 1 of 1; member 1 used 1 of 100;
	// allowed=false retry in 500ms; member 0 used 1 of 1; member 1 used 1 of 100;
	// allowed=true retry in 0s; member 0 used 1 of 1; member 1 used 2 of 100;
}
