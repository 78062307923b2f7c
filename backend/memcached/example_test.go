package memcached_test

import (
	"context"
	"fmt"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/throttlekit/throttlekit/backend/memcached"
	"github.com/throttlekit/throttlekit/throttler"
)

// Example needs a Memcached server, so it is compiled but not run.
// gomemcache takes no context, so the client's Timeout is what bounds each
// call: set it to the Throttler's Timeout (docs/backends-memcached.md).
// The backend reads the client's servers, so a Throttler keeps a breaker per
// server, and gives gomemcache's default pool of 2 idle connections 256, so
// that calls in flight reuse connections instead of dialing.
func Example() {
	c := memcache.New("10.0.0.1:11211", "10.0.0.2:11211")
	c.Timeout = 100 * time.Millisecond // the Throttler's
	b, err := memcached.New(c, &memcached.Options{Prefix: "rl:"})
	if err != nil {
		panic(err) // a nil client or a bad option: fails here, not per call
	}
	t, err := throttler.New(b, &throttler.Options{Timeout: 100 * time.Millisecond})
	if err != nil {
		panic(err)
	}

	// While Memcached is unreachable the Throttler fails open: Allowed,
	// with Degraded set. An error means bad input.
	d, err := t.Allow(context.Background(), "user:42", throttler.PerHour(5000).Named("core"))
	if err != nil {
		panic(err)
	}
	fmt.Println(d.Allowed, d.Degraded, d.Remaining)
}
