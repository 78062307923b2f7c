package redis

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// closingListener accepts connections on loopback and closes each at once:
// a server a client can dial, whose address the dial hook sees.
func closingListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return ln.Addr().String()
}

// A primary's client that reaches another server than before (as a
// FailoverClient does after Sentinel names a new primary) is a primary
// switch in Stats; dials to the same server are not, nor is the first.
func TestPrimarySwitchesAreCounted(t *testing.T) {
	a, b := closingListener(t), closingListener(t)
	var target atomic.Pointer[string]
	target.Store(&a)
	rdb := goredis.NewClient(&goredis.Options{
		Addr: "primary", MaxRetries: -1, DialTimeout: time.Second,
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, *target.Load())
		},
	})
	defer rdb.Close()
	be, err := New(rdb, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i, step := range []struct {
		to   string
		want uint64
	}{{a, 0}, {a, 0}, {b, 1}, {b, 1}, {a, 2}} {
		target.Store(&step.to)
		_ = rdb.Ping(ctx).Err() // fails: the server closes; the dial is what counts
		if got := be.Stats().PrimarySwitches; got != step.want {
			t.Errorf("step %d: PrimarySwitches %d, want %d", i, got, step.want)
		}
	}
}
