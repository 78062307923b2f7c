package redis

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/throttler"
)

// unreachable is a client of a loopback port nobody listens on.
func unreachable(t *testing.T) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// wantNamed checks that err names the store and the refused dial, and
// still matches the context's error and the dial's.
func wantNamed(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error", what)
	}
	for _, s := range []string{"redis (127.0.0.1:1)", "connection refused"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%s: %q does not say %q", what, err, s)
		}
	}
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("%s: %v matches DeadlineExceeded %v, ECONNREFUSED %v; want both", what, err,
			errors.Is(err, context.DeadlineExceeded), errors.Is(err, syscall.ECONNREFUSED))
	}
}

// An unreachable Redis failed each call with a bare "context deadline
// exceeded": go-redis dials in the background, and a caller whose deadline
// comes first never hears why. The error names the store and the cause, in
// what the call returns and in what Observe sees.
func TestUnreachableRedisErrorNamesStoreAndCause(t *testing.T) {
	b := newBackend(t, unreachable(t), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := b.Take(ctx, "k", policy, 1, t0)
	wantNamed(t, "Take", err)

	var observed error
	th, err := throttler.New(b, &throttler.Options{Timeout: 200 * time.Millisecond, FailClosed: true,
		Observe: func(o throttler.Observation) { observed = o.Err }})
	if err != nil {
		t.Fatal(err)
	}
	_, err = th.Allow(context.Background(), "k", policy)
	wantNamed(t, "Allow", err)
	wantNamed(t, "Observe", observed)
	if !errors.Is(err, throttler.ErrUnavailable) {
		t.Errorf("Allow: %v does not match ErrUnavailable", err)
	}
}

// A failing replica is named in its Peek's error; the next Peek, while it
// rests, goes to the primary, whose error names it.
func TestPeekErrorNamesReplicaAndPrimary(t *testing.T) {
	primary := &fakeClient{hmgetErr: replyErr("LOADING Redis is loading")}
	replica := &fakeClient{hmgetErr: replyErr("MASTERDOWN link down")}
	b, err := NewSharded([]Shard{{Primary: primary, Replicas: []Client{replica}}, {Primary: primary}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ { // a key of shard 0
		key := string(rune('a' + i))
		if b.store(throttler.OpTake, key, policy) != "redis shard 0" {
			continue
		}
		for _, s := range []string{"redis shard 0 replica: MASTERDOWN", "redis shard 0: LOADING"} {
			_, err = b.Peek(context.Background(), key, policy, t0)
			if err == nil || !strings.Contains(err.Error(), s) {
				t.Errorf("Peek: %v does not say %q", err, s)
			}
			if !errors.Is(err, throttler.ErrUnavailable) {
				t.Errorf("Peek: %v does not match ErrUnavailable", err)
			}
		}
		break
	}
}

// Check pings every client and names those that fail, with the cause.
func TestCheck(t *testing.T) {
	ok := &fakeClient{evalVal: int64(1)}
	if err := newBackend(t, ok, nil).Check(context.Background()); err != nil {
		t.Errorf("healthy: %v", err)
	}
	if len(ok.calls) != 1 {
		t.Errorf("healthy: calls %v, want one script", ok.calls)
	}
	rdb, _ := startRedis(t)
	if err := newBackend(t, rdb, nil).Check(context.Background()); err != nil {
		t.Errorf("a live redis-server: %v", err)
	}
	down := &fakeClient{evalErr: replyErr("LOADING Redis is loading")}
	ok2 := &fakeClient{evalVal: int64(1)} // Check calls each client at once: one fake each
	b, err := NewSharded([]Shard{{Primary: ok, Replicas: []Client{down}}, {Primary: ok2}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = b.Check(context.Background())
	if err == nil || !strings.Contains(err.Error(), "redis shard 0 replica: LOADING") || strings.Contains(err.Error(), "redis shard 1") {
		t.Errorf("one replica down: %v, want it alone named", err)
	}
	if !errors.Is(err, throttler.ErrUnavailable) {
		t.Errorf("%v does not match ErrUnavailable", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err = newBackend(t, unreachable(t), nil).Check(ctx)
	if err == nil || !strings.Contains(err.Error(), "redis (127.0.0.1:1)") || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("unreachable: %v, want the store named and connection refused", err)
	}
}
