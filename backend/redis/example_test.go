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

	fallback, err := memory.New(nil)
	if err != nil {
		panic(err)
	}
	t, err := throttler.New(redis.New(rdb, nil), &throttler.Options{
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
	_, _ = throttler.New(b, nil)
}

// Many goroutines sharing one client: go-redis's AutoPipeliner batches
// their scripts into pipelines, for several times the throughput on one
// connection (see docs/performance.md).
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
	_, _ = throttler.New(redis.New(ap, nil), &throttler.Options{Timeout: timeout})
}
