package redis

import (
	"context"
	"fmt"
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

// A primary that answers a write with READONLY has become a replica: a
// switch seen even by a client that stays on its address. One is counted
// until the client reaches a new server (a replica answers a denied Take:
// a success proves nothing), and that dial is the same switch.
func TestReadOnlyIsAPrimarySwitch(t *testing.T) {
	readonly := fmt.Errorf("redis (10.0.0.1:6379): %w", replyErr("READONLY You can't write against a read only replica."))
	inScript := replyErr("ERR Error running script (call to f_1): @user_script:1: -READONLY You can't write against a read only replica.")
	var switches atomic.Uint64
	w := &primaryWatch{switches: &switches}
	for i, step := range []struct {
		dial string // a new connection's server, or
		err  error  // a write's answer
		want uint64
	}{
		{dial: "a", want: 0},
		{err: nil, want: 0},
		{err: readonly, want: 1},
		{err: inScript, want: 1},
		{err: replyErr("LOADING Redis is loading"), want: 1},
		{err: nil, want: 1}, // a denied Take, answered by the replica
		{err: readonly, want: 1},
		{dial: "a", want: 1}, // go-redis redials the same address
		{err: readonly, want: 1},
		{dial: "b", want: 1}, // the client follows: the same switch
		{err: nil, want: 1},
		{dial: "a", want: 2},
		{err: inScript, want: 3},
	} {
		if step.dial != "" {
			w.reached(step.dial)
		} else {
			w.answered(step.err)
		}
		if got := switches.Load(); got != step.want {
			t.Errorf("step %d: %d switches, want %d", i, got, step.want)
		}
	}
	(*primaryWatch)(nil).answered(readonly) // an unwatched primary: nothing to count, no panic
}

// A lease's write refused with READONLY is a switch seen, as a Take's is.
func TestReadOnlyLeaseWriteIsAPrimarySwitch(t *testing.T) {
	f := &fakeClient{evalErr: replyErr("READONLY You can't write against a read only replica.")}
	b := newBackend(t, f, nil)
	b.shards[0].watch = &primaryWatch{switches: &b.counters.primarySwitches} // as on a *goredis.Client
	if _, err := b.Acquire(context.Background(), "k", leasePolicy, 1, t0); err == nil {
		t.Fatal("Acquire succeeded on a READONLY primary")
	}
	if got := b.Stats().PrimarySwitches; got != 1 {
		t.Errorf("PrimarySwitches %d, want 1", got)
	}
}
