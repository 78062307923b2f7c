package memcached_test

import (
	"context"
	"fmt"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/throttlekit/throttlekit/backend/memcached"
	"github.com/throttlekit/throttlekit/throttler"
)

// Example needs a Memcached server, so it is compiled but not run. The
// client's Timeout bounds every call, since gomemcache takes no context.
func Example() {
	c := memcache.New("10.0.0.1:11211", "10.0.0.2:11211")
	c.Timeout = 100 * time.Millisecond
	c.MaxIdleConns = 64 // about the peak of concurrent calls
	b := memcached.New(c, &memcached.Options{Prefix: "api-limits:"})

	p := throttler.PerHour(5000).Named("core")
	d, err := b.Take(context.Background(), "user:42", p, 1, time.Now())
	if err != nil {
		fmt.Println("memcached unavailable:", err)
		return
	}
	fmt.Println(d.Allowed, d.Remaining)
}
