package redis_test

import (
	"context"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/throttler"
)

// A Throttler on one Redis, falling back to an in-process memory backend
// while Redis is unreachable. The examples need a server, so they are
// compiled but not run.
func Example() {
	rdb := goredis.NewClient(&goredis.Options{
		Addr: "127.0.0.1:6379",
		// Without it go-redis ignores the Throttler's per-call deadline.
		ContextTimeoutEnabled: true,
	})
	defer rdb.Close()

	b, err := redis.New(rdb, nil)
	if err != nil {
		panic(err) // a nil client or a bad option: fails here, not per call
	}
	fallback, err := memory.New(nil)
	if err != nil {
		panic(err)
	}
	t, err := throttler.New(b, &throttler.Options{
		Timeout:  50 * time.Millisecond,
		Fallback: fallback,
	})
	if err != nil {
		panic(err)
	}
	d, err := t.Allow(context.Background(), "user-42", throttler.PerHour(5000).Named("api"))
	if err != nil {
		panic(err)
	}
	fmt.Println(d.Allowed, d.Remaining, d.ResetAt)
}

// GitHub's layout: independent shards chosen by the application, each a
// primary that takes the writes and replicas that serve Peek.
func ExampleNewSharded() {
	client := func(addr string) *goredis.Client {
		return goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
	}
	b, err := redis.NewSharded([]redis.Shard{
		{Primary: client("10.0.0.1:6379"), Replicas: []redis.Client{client("10.0.0.2:6379"), client("10.0.0.3:6379")}},
		{Primary: client("10.0.1.1:6379"), Replicas: []redis.Client{client("10.0.1.2:6379"), client("10.0.1.3:6379")}},
	}, &redis.Options{Prefix: "rl:"})
	if err != nil {
		panic(err)
	}
	if _, err := throttler.New(b, nil); err != nil {
		panic(err)
	}
}

// go-redis's AutoPipeliner is accepted as the client; the backend then
// leaves batching to it. Its own batching, on by default over a plain
// client, does as well without one (see docs/performance.md).
func ExampleNew_autoPipeline() {
	const timeout = 100 * time.Millisecond
	rdb := goredis.NewClient(&goredis.Options{
		Addr: "127.0.0.1:6379",
		// The AutoPipeliner's calls ignore the context: the socket timeouts
		// bound them instead.
		ReadTimeout:  timeout / 4,
		WriteTimeout: timeout / 4,
		DialTimeout:  timeout / 4,
	})
	defer rdb.Close() // closes the AutoPipeliner too
	ap, err := rdb.AutoPipeline()
	if err != nil {
		panic(err)
	}
	b, err := redis.New(ap, nil)
	if err != nil {
		panic(err)
	}
	if _, err := throttler.New(b, &throttler.Options{Timeout: timeout}); err != nil {
		panic(err)
	}
}

// The over-limit cache: Takes of keys Redis denied until a known instant
// are denied here until then, without a round trip (see its limits in
// docs/backends-redis.md); Stats counts what it and batching saved.
func ExampleOptions_overLimitCache() {
	rdb := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer rdb.Close()
	b, err := redis.New(rdb, &redis.Options{OverLimitCache: 100_000})
	if err != nil {
		panic(err)
	}
	// ... serve traffic, then report:
	s := b.Stats()
	_ = fmt.Sprintf("%d operations in %d round trips, %d Takes denied locally", s.Ops, s.RoundTrips, s.CacheHits)
}
