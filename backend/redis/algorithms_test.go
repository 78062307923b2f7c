package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/backend/backendtest"
	"github.com/throttlekit/throttlekit/throttler"
)

// startRedis starts a redis-server of its own on a free local port, without
// persistence, for the test's lifetime, and returns a client on it; args
// are added to the server's command line. It skips the test when
// redis-server is not on PATH.
func startRedis(t *testing.T, args ...string) (*goredis.Client, int) {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server is not on PATH")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir := t.TempDir()
	cmd := exec.Command(path, append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "log")}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	rdb := goredis.NewClient(&goredis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), PoolSize: 64})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	for i := 0; ; i++ {
		if err := rdb.Ping(ctx).Err(); err == nil {
			return rdb, port
		} else if i == 200 {
			t.Fatalf("redis-server on port %d: %v", port, err)
		}
		time.Sleep(10 * time.Millisecond) // the server starting, not the clock
	}
}

// TestConformanceLocalRedis runs the whole conformance suite (the four
// algorithms, their tables, concurrency and differential traces) against a
// real Redis started for the test.
func TestConformanceLocalRedis(t *testing.T) {
	rdb, _ := startRedis(t)
	backendtest.Run(t, func(t *testing.T) throttler.Backend {
		b, err := NewSharded([]Shard{{Primary: rdb}}, &Options{Prefix: "conf:"})
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}

// TestAlgorithmsMatchGoAtTheBounds replays random traces on a real Redis and
// on package backend's functions (state kept here, never dropped), at the
// bounds of the doubles: capacity·window and limit·window at 2^53, costs up
// to 2^48, windows that do not divide the refill, instants before 1970,
// clocks going back, and named policies whose Limit, Burst or Window
// change under live state. Every Decision must be equal, Peek included.
func TestAlgorithmsMatchGoAtTheBounds(t *testing.T) {
	rdb, _ := startRedis(t)
	b, err := NewSharded([]Shard{{Primary: rdb}}, &Options{ExpiryMargin: time.Hour}) // nothing expires mid-trace
	if err != nil {
		t.Fatal(err)
	}
	const max48 = throttler.MaxLimit
	ms := time.Millisecond
	policies := []throttler.Policy{
		{Name: "tb-max", Limit: max48, Window: 32 * ms, Algorithm: throttler.TokenBucket},
		{Name: "tb-max", Limit: 3, Window: 31 * ms, Algorithm: throttler.TokenBucket, Burst: max48},
		{Name: "tb-max", Limit: 3, Window: 32 * ms, Algorithm: throttler.TokenBucket, Burst: max48},
		{Name: "tb-odd", Limit: 7, Window: 13 * ms, Algorithm: throttler.TokenBucket, Burst: 2},
		{Name: "tb-odd", Limit: 5, Window: 13 * ms, Algorithm: throttler.TokenBucket, Burst: 3},
		{Limit: 1_000_000_007, Window: 8191 * ms, Algorithm: throttler.TokenBucket, Burst: 1_000_000_000_000},
		{Name: "sw-max", Limit: 1 << 40, Window: 8191 * ms, Algorithm: throttler.SlidingWindow},
		{Name: "sw-max", Limit: max48, Window: 32 * ms, Algorithm: throttler.SlidingWindow},
		{Name: "sw-odd", Limit: 3, Window: 7 * ms, Algorithm: throttler.SlidingWindow},
		{Name: "sw-odd", Limit: 2, Window: 7 * ms, Algorithm: throttler.SlidingWindow},
		{Name: "sl", Limit: throttler.MaxLogLimit, Window: 50 * ms, Algorithm: throttler.SlidingLog},
		{Name: "sl", Limit: 7, Window: 13 * ms, Algorithm: throttler.SlidingLog},
		{Limit: 1, Window: ms, Algorithm: throttler.SlidingLog},
	}
	type state struct {
		bucket  backend.BucketState
		counter backend.CounterState
		log     []backend.LogEntry
		stored  bool
	}
	ctx := context.Background()
	for _, start := range []int64{backendtest.T0.UnixMilli(), -1_000_003} {
		rng := rand.New(rand.NewPCG(uint64(start), 7))
		ref := map[string]*state{}
		now := start
		for i := range 3000 {
			switch r := rng.IntN(10); {
			case r < 6:
				now += int64(rng.IntN(5))
			case r < 8:
				now -= int64(rng.IntN(30))
			default:
				now += int64(rng.IntN(20_000))
			}
			p := policies[rng.IntN(len(policies))]
			key := fmt.Sprint(start, []string{"a", "b"}[rng.IntN(2)])
			op := []throttler.Op{throttler.OpTake, throttler.OpTake, throttler.OpPeek, throttler.OpRefund}[rng.IntN(4)]
			c := p.Capacity()
			cost := []int64{1, 1 + rng.Int64N(c), c, c/2 + 1, 1 + rng.Int64N(min(c, 3))}[rng.IntN(5)]
			if op == throttler.OpRefund && rng.IntN(4) == 0 {
				cost = max48
			}
			got, err := backend.Do(ctx, b, op, key, p, cost, time.UnixMilli(now))
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			id := backend.Identity(p) + "\x00" + key
			st := ref[id]
			if st == nil {
				st = &state{}
				ref[id] = st
			}
			var want throttler.Decision
			switch p.Algorithm {
			case throttler.TokenBucket:
				d, next, write := backend.Bucket(p, st.bucket, st.stored, op, cost, now)
				if want = d; write {
					st.bucket, st.stored = next, true
				}
			case throttler.SlidingWindow:
				d, next, write := backend.Counter(p, st.counter, st.stored, op, cost, now)
				if want = d; write {
					st.counter, st.stored = next, true
				}
			case throttler.SlidingLog:
				d, next, write := backend.Log(p, slices.Clone(st.log), op, cost, now)
				if want = d; write {
					st.log = next
				}
			}
			if got != want {
				t.Fatalf("step %d: %v %d of %q under %+v at %d:\n got %+v\nwant %+v", i, op, cost, key, p, now, got, want)
			}
		}
	}
}
