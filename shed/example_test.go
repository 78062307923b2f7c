package shed_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/httplimit"
	"github.com/throttlekit/throttlekit/shed"
	"github.com/throttlekit/throttlekit/throttler"
)

// All four of Stripe's limiters in front of an API, on the memory backend
// (a fleet would share a Redis instead): the worker shedder, a fleet of 10
// concurrent requests of which non-critical traffic may hold 8, at most 2
// requests in flight per user, and 100 requests a minute per user.
func ExampleMiddleware() {
	store, err := memory.New(nil)
	if err != nil {
		log.Fatal(err)
	}
	th, err := throttler.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	worker, err := shed.NewWorker(&shed.WorkerOptions{Workers: 64})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go worker.Run(ctx) // the controller's ticks

	fleet, err := shed.NewFleet(th, &shed.FleetOptions{Capacity: 10, Share: 0.8})
	if err != nil {
		log.Fatal(err)
	}
	user := httplimit.KeyByHeader("X-User-ID")
	inflight, err := httplimit.Concurrency(th, throttler.ConcurrencyPolicy{Name: "inflight", Limit: 2, TTL: time.Minute}, user, nil)
	if err != nil {
		log.Fatal(err)
	}
	rate, err := httplimit.Rate(th, throttler.PerMinute(100).Named("api"), user, nil)
	if err != nil {
		log.Fatal(err)
	}
	mw, err := shed.Middleware(&shed.Options{Worker: worker, Fleet: fleet, Concurrency: inflight, Rate: rate})
	if err != nil {
		log.Fatal(err)
	}
	api := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") }))

	// User 42 already has two requests in flight.
	for range 2 {
		if _, _, err := th.Acquire(ctx, "42", throttler.ConcurrencyPolicy{Name: "inflight", Limit: 2, TTL: time.Minute}); err != nil {
			log.Fatal(err)
		}
	}
	for _, id := range []string{"7", "42"} {
		r := httptest.NewRequest(http.MethodGet, "/v1/things", nil)
		r.Header.Set("X-User-ID", id)
		w := httptest.NewRecorder()
		api.ServeHTTP(w, r)
		fmt.Printf("user %s: %d %q\n", id, w.Code, w.Header().Get(shed.HeaderLimiter))
	}
	// Output:
	// user 7: 200 ""
	// user 42: 429 "concurrency"
}

// The worker shedder's controller at fixed instants: saturated from the
// start, it sheds nothing for 28 s, then test-mode traffic first.
func ExampleWorker() {
	worker, err := shed.NewWorker(&shed.WorkerOptions{Utilization: func() float64 { return 1 }})
	if err != nil {
		log.Fatal(err)
	}
	t0 := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	for s := 0; s <= 148; s++ {
		worker.Update(t0.Add(time.Duration(s) * time.Second))
		switch s {
		case 28, 48, 88, 128, 148:
			drop := worker.Stats().DropChance
			fmt.Printf("%3d s: test mode %3.0f%%, reads %3.0f%%, writes %3.0f%%, critical %.0f%%\n", s,
				100*drop[shed.TestMode], 100*drop[shed.Read], 100*drop[shed.Write], 100*drop[shed.Critical])
		}
	}
	// Output:
	//  28 s: test mode   0%, reads   0%, writes   0%, critical 0%
	//  48 s: test mode  50%, reads   0%, writes   0%, critical 0%
	//  88 s: test mode 100%, reads  50%, writes   0%, critical 0%
	// 128 s: test mode 100%, reads 100%, writes  50%, critical 0%
	// 148 s: test mode 100%, reads 100%, writes 100%, critical 0%
}
