package throttler_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

func ExampleThrottler_Allow() {
	now := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	th := throttler.New(memory.New(nil), &throttler.Options{Clock: func() time.Time { return now }})
	p := throttler.PerMinute(2).Named("login")
	for i := 0; i < 3; i++ {
		d, err := th.Allow(context.Background(), "alice", p)
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v remaining=%d retry in %v\n", d.Allowed, d.Remaining, d.RetryAfter)
	}
	// Output:
	// allowed=true remaining=1 retry in 0s
	// allowed=true remaining=0 retry in 0s
	// allowed=false remaining=0 retry in 1m0s
}

func ExampleThrottler_Middleware() {
	th := throttler.New(memory.New(nil), nil)
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })
	h := th.Middleware(throttler.PerHour(1).Named("core"), throttler.KeyByHeader("Authorization"), nil)(api)

	for i := 0; i < 2; i++ {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("Authorization", "token abc")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%d remaining=%s retry-after=%q\n", w.Code, w.Header().Get("X-RateLimit-Remaining"), w.Header().Get("Retry-After"))
	}
	// Output:
	// 200 remaining=0 retry-after=""
	// 429 remaining=0 retry-after="3600"
}

func ExamplePolicy() {
	p := throttler.PerHour(5000).Named("core")
	fmt.Println(p, p.Validate())
	fmt.Println(throttler.PerSecond(0).Validate())
	// Output:
	// core: 5000 per 1h0m0s <nil>
	// throttler: invalid policy: limit must be between 1 and 2^48, got 0
}

func ExampleNew_fallback() {
	// A Throttler over a store that is down fails over to an in-process
	// memory backend, so limits keep holding per process.
	down := downBackend{}
	th := throttler.New(down, &throttler.Options{Fallback: memory.New(nil)})
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

func (d downBackend) Refund(ctx context.Context, k string, p throttler.Policy, n int64, now time.Time) (throttler.Decision, error) {
	return d.Take(ctx, k, p, n, now)
}
