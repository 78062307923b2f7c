package throttler_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

// A tighter limit tried in dry run: every call is
// admitted, counted, and the third says it would have been denied.
func ExamplePolicy_DryRun() {
	store, err := memory.New(nil)
	if err != nil {
		log.Fatal(err)
	}
	now := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	th, err := throttler.New(store, &throttler.Options{Clock: func() time.Time { return now }})
	if err != nil {
		log.Fatal(err)
	}
	tighter := throttler.PerMinute(2).Named("login-v2").DryRun()
	for range 3 {
		d, err := th.Allow(context.Background(), "alice", tighter)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("allowed=%v would deny=%v used=%d\n", d.Allowed, d.WouldDeny, d.Used)
	}
	// Output:
	// allowed=true would deny=false used=1
	// allowed=true would deny=false used=2
	// allowed=true would deny=true used=2
}
