package throttler_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

// A whole set-up: a store, a Throttler over it, and middleware limiting an
// API to 2 requests a minute per user. Every constructor returns an error
// for a configuration that cannot work, so a mistake stops the server at
// start-up instead of silently letting everything through.
func Example() {
	store, err := memory.New(nil) // or backend/redis, backend/memcached
	if err != nil {
		log.Fatal(err)
	}
	now := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC) // a fixed clock, for the output below
	th, err := throttler.New(store, &throttler.Options{Clock: func() time.Time { return now }})
	if err != nil {
		log.Fatal(err)
	}
	mw, err := th.Middleware(throttler.PerMinute(2).Named("api"), throttler.KeyByHeader("X-User-ID"), nil)
	if err != nil {
		log.Fatal(err)
	}
	api := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") }))

	for range 3 {
		r := httptest.NewRequest(http.MethodGet, "/api/", nil)
		r.Header.Set("X-User-ID", "42")
		w := httptest.NewRecorder()
		api.ServeHTTP(w, r)
		h := w.Header()
		fmt.Printf("%d %s limit=%s remaining=%s used=%s reset=%s resource=%s retry-after=%q\n",
			w.Code, strings.TrimSpace(w.Body.String()), h.Get("X-RateLimit-Limit"), h.Get("X-RateLimit-Remaining"),
			h.Get("X-RateLimit-Used"), h.Get("X-RateLimit-Reset"), h.Get("X-RateLimit-Resource"), h.Get("Retry-After"))
	}
	// Output:
	// 200 hello limit=2 remaining=1 used=1 reset=1925089505 resource=api retry-after=""
	// 200 hello limit=2 remaining=0 used=2 reset=1925089505 resource=api retry-after=""
	// 429 rate limit exceeded: 2 per 1m0s; retry in 60s limit=2 remaining=0 used=2 reset=1925089505 resource=api retry-after="60"
}

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

func ExampleThrottler_Middleware() {
	store, err := memory.New(nil)
	if err != nil {
		log.Fatal(err)
	}
	th, err := throttler.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	mw, err := th.Middleware(throttler.PerHour(1).Named("core"), throttler.KeyByHeader("Authorization"),
		&throttler.MiddlewareOptions{IETFHeaders: true}) // also RateLimit-Policy and RateLimit
	if err != nil {
		log.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") }))

	for range 2 {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("Authorization", "token abc")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%d remaining=%s retry-after=%q policy=%s\n", w.Code, w.Header().Get("X-RateLimit-Remaining"), w.Header().Get("Retry-After"), w.Header().Get("RateLimit-Policy"))
	}

	// A configuration that cannot work fails here, not on every request.
	_, err = th.Middleware(throttler.Policy{}, throttler.KeyByRemoteIP, nil)
	fmt.Println(err)
	// Output:
	// 200 remaining=0 retry-after="" policy="core";q=1;w=3600
	// 429 remaining=0 retry-after="3600" policy="core";q=1;w=3600
	// throttler: invalid policy: limit must be between 1 and 2^48, got 0
}

// Keys that are secrets (API tokens) are best hashed before they reach a
// store, where anyone reading the store, its logs or its metrics would see
// them.
func ExampleKeyFunc_hashed() {
	hashed := func(r *http.Request) (string, error) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || tok == "" {
			return "", fmt.Errorf("no bearer token")
		}
		sum := sha256.Sum256([]byte(tok))
		return "tok:" + hex.EncodeToString(sum[:16]), nil
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Bearer s3cr3t")
	key, _ := hashed(r)
	fmt.Println(key)
	// Output:
	// tok:4e738ca5563c06cfd0018299933d58db
}

func ExamplePolicy() {
	p := throttler.PerHour(5000).Named("core")
	fmt.Println(p, p.Validate())
	fmt.Println(throttler.PerSecond(0).Validate())
	// Output:
	// core: 5000 per 1h0m0s <nil>
	// throttler: invalid policy: limit must be between 1 and 2^48, got 0
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
	exports := throttler.Concurrent(2, time.Minute).Named("exports")
	ctx := context.Background()

	first, d, _ := th.Acquire(ctx, "account:7", exports)
	fmt.Println("first:", d.Allowed, "in flight:", d.Used)
	_, d, _ = th.Acquire(ctx, "account:7", exports)
	fmt.Println("second:", d.Allowed, "in flight:", d.Used)
	third, d, _ := th.Acquire(ctx, "account:7", exports)
	fmt.Println("third:", d.Allowed, "retry after:", d.RetryAfter)
	_, _ = third.Release(ctx) // a refused lease releases nothing

	held, _ := first.Release(ctx)
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
