package flags_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/throttler"
)

// A limit in dry run for every client, then enforced for all of them, then
// rolled back: a rollout at 0%, 100%, 0%.
func ExampleEnforcement() {
	pct, err := flags.NewPercentFor("limit-login-v2", 0)
	if err != nil {
		log.Fatal(err)
	}
	enforce, err := flags.Enforcement(pct)
	if err != nil {
		log.Fatal(err)
	}
	store, err := memory.New(nil)
	if err != nil {
		log.Fatal(err)
	}
	now := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	th, err := throttler.New(store, &throttler.Options{Clock: func() time.Time { return now }})
	if err != nil {
		log.Fatal(err)
	}
	p := throttler.PerMinute(1).Named("login-v2").EnforcedBy(enforce)
	for _, percent := range []int{0, 0, 100, 0} {
		if err := pct.Set(percent); err != nil {
			log.Fatal(err)
		}
		d, err := th.Allow(context.Background(), "alice", p)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%3d%%: allowed=%v would deny=%v\n", percent, d.Allowed, d.WouldDeny)
	}
	// Output:
	//   0%: allowed=true would deny=false
	//   0%: allowed=true would deny=true
	// 100%: allowed=false would deny=false
	//   0%: allowed=true would deny=true
}
