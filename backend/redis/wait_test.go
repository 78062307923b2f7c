package redis

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/backendtest"
	"github.com/throttlekit/throttlekit/throttler"
)

// TestWaitOptionsRefused: settings that cannot work are errors from the
// constructor, never per-call failures: a timeout that would block for
// ever or cut WAIT short, and clients whose pipelines do not reach one
// server on one connection. No server is dialled.
func TestWaitOptionsRefused(t *testing.T) {
	one := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
	short := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", ReadTimeout: 40 * time.Millisecond})
	cluster := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	ring := goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	t.Cleanup(func() { one.Close(); short.Close(); cluster.Close(); ring.Close() })
	ap, err := one.AutoPipeline()
	require.NoError(t, err)
	ms := time.Millisecond
	for _, tc := range []struct {
		name string
		c    Client
		o    Options
		want string // "" : accepted
	}{
		{"off", one, Options{}, ""},
		{"default timeout", one, Options{WaitReplicas: 1}, ""},
		{"timeout", one, Options{WaitReplicas: 2, WaitTimeout: 5 * ms}, ""},
		{"cluster without waiting", cluster, Options{}, ""},
		{"negative replicas", one, Options{WaitReplicas: -1}, "WaitReplicas must be >= 0"},
		{"negative timeout", one, Options{WaitReplicas: 1, WaitTimeout: -ms}, "WaitTimeout must be >= 0"},
		{"timeout below a ms", one, Options{WaitReplicas: 1, WaitTimeout: 100}, "at least 1ms"},
		{"timeout without replicas", one, Options{WaitTimeout: 10 * ms}, "WaitReplicas is 0"},
		{"timeout beyond ReadTimeout", short, Options{WaitReplicas: 1}, "below shards[0].Primary's ReadTimeout"},
		{"timeout at ReadTimeout", short, Options{WaitReplicas: 1, WaitTimeout: 40 * ms}, "ReadTimeout 40ms"},
		{"cluster", cluster, Options{WaitReplicas: 1}, "*redis.ClusterClient"},
		{"ring", ring, Options{WaitReplicas: 1}, "*redis.Ring"},
		{"auto pipeliner", ap, Options{WaitReplicas: 1}, "*redis.AutoPipeliner"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.c, &tc.o)
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	// A short timeout is fine beside a short ReadTimeout.
	_, err = New(short, &Options{WaitReplicas: 1, WaitTimeout: 39 * ms})
	assert.NoError(t, err)
}

// waitPolicies are one policy per algorithm and a composite, for the WAIT
// tests.
var waitPolicies = []throttler.Policy{
	{Name: "w-fw", Limit: 5, Window: time.Minute},
	{Name: "w-tb", Limit: 5, Window: time.Minute, Algorithm: throttler.TokenBucket},
	{Name: "w-sw", Limit: 5, Window: time.Minute, Algorithm: throttler.SlidingWindow},
	{Name: "w-sl", Limit: 5, Window: time.Minute, Algorithm: throttler.SlidingLog},
	throttler.All(
		throttler.Policy{Name: "w-all-fw", Limit: 5, Window: time.Minute},
		throttler.Policy{Name: "w-all-sl", Limit: 6, Window: time.Hour, Algorithm: throttler.SlidingLog},
	),
}

// TestWaitWithoutReplica: a primary with no replica acknowledges nothing,
// so with WaitReplicas 1 every write fails as a store failure matching
// ErrTooFewReplicas, alone and in batches, leases included, while Peeks,
// which write nothing, still answer. Each failure comes from WAIT's own
// timeout, well within the call's deadline. The server's scripts are
// flushed before each policy's calls, so that the first ones are sent
// again with their source (NOSCRIPT), which must wait too.
func TestWaitWithoutReplica(t *testing.T) {
	for _, tc := range []struct {
		name     string
		batched  bool // every call through a batch
		maxBatch int
	}{{"alone or batched", false, 0}, {"batched", true, 0}, {"MaxBatch 1", false, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			rdb, _ := startRedis(t)
			b, err := New(rdb, &Options{WaitReplicas: 1, WaitTimeout: 5 * time.Millisecond, MaxBatch: tc.maxBatch, alwaysBatch: tc.batched})
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			now := backendtest.T0
			assertFails := func(what string, err error) {
				t.Helper()
				if assert.ErrorIs(t, err, ErrTooFewReplicas, what) {
					assert.ErrorIs(t, err, throttler.ErrUnavailable, what)
					assert.Contains(t, err.Error(), "0 of 1 within 5ms", what)
				}
			}
			for _, p := range waitPolicies {
				require.NoError(t, rdb.ScriptFlush(ctx).Err())
				// Peeks among the Takes: in a batch, the writes fail and
				// the reads answer.
				var wg sync.WaitGroup
				errs, peekErrs := make([]error, 8), make([]error, 8)
				for i := range errs {
					wg.Go(func() {
						_, errs[i] = b.Take(ctx, "k"+strconv.Itoa(i%3), p, 1, now)
					})
					wg.Go(func() {
						_, peekErrs[i] = b.Peek(ctx, "k"+strconv.Itoa(i%3), p, now)
					})
				}
				wg.Wait()
				for i, err := range errs {
					assertFails(fmt.Sprintf("%v take %d", p, i), err)
					assert.NoError(t, peekErrs[i], "%v peek %d", p, i)
				}
				if !p.Composite() { // a composite is refunded member by member
					_, err = b.Refund(ctx, "k0", p, 1, now, now)
					assertFails(p.String()+" refund", err)
				}
				d, err := b.Peek(ctx, "k0", p, now)
				require.NoError(t, err, "%v peek", p)
				// The primary wrote: the units are counted there, though
				// every Take was answered as failed.
				assert.Positive(t, d.Used, "%v peek", p)
			}
			lp := throttler.ConcurrencyPolicy{Name: "w-cc", Limit: 2, TTL: time.Minute}
			require.NoError(t, rdb.ScriptFlush(ctx).Err())
			_, err = b.Acquire(ctx, "k", lp, 7, now)
			assertFails("acquire", err)
			_, _, err = b.Release(ctx, "k", lp, 7, now)
			assertFails("release", err)
			require.NoError(t, ctx.Err(), "a WAIT blocked beyond its timeout")
		})
	}
}

// TestWaitThroughThrottler: a Throttler counts ErrTooFewReplicas as its
// store's failure: failing closed, each Take is denied with
// ErrUnavailable, and the breaker opens at its threshold.
func TestWaitThroughThrottler(t *testing.T) {
	rdb, _ := startRedis(t)
	b, err := New(rdb, &Options{WaitReplicas: 1, WaitTimeout: 2 * time.Millisecond})
	require.NoError(t, err)
	var failures []error
	th, err := throttler.New(b, &throttler.Options{
		FailClosed: true, BreakerThreshold: 3, BreakerCooldown: time.Hour, Timeout: time.Second,
		Observe: func(o throttler.Observation) { failures = append(failures, o.Err) },
	})
	require.NoError(t, err)
	for i := range 3 {
		d, err := th.Allow(context.Background(), "k", waitPolicies[0])
		assert.ErrorIs(t, err, throttler.ErrUnavailable, "take %d", i)
		assert.False(t, d.Allowed, "take %d", i)
	}
	states := th.Breakers()
	require.Len(t, states, 1)
	assert.True(t, states[0].Open, "breaker after 3 shortfalls: %+v", states[0])
	require.Len(t, failures, 3)
	for _, err := range failures {
		assert.ErrorIs(t, err, ErrTooFewReplicas)
	}
}

// TestWaitWithReplica: with a replica attached, WaitReplicas 1 admits as
// without it, and each write is on the replica when its call returns: read
// there at once, every key holds what its Takes counted, alone and in
// batches, under concurrency.
func TestWaitWithReplica(t *testing.T) {
	for _, batched := range []bool{false, true} {
		t.Run(fmt.Sprintf("batched=%v", batched), func(t *testing.T) {
			primary, port := startRedis(t, "--repl-diskless-sync-delay", "0")
			replica, _ := startRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(port))
			waitReplicaInSync(t, primary)
			b, err := New(primary, &Options{WaitReplicas: 1, WaitTimeout: time.Second, alwaysBatch: batched})
			require.NoError(t, err)
			// The replica read through a second backend: a Peek goes to a
			// shard's replica.
			onReplica, err := NewSharded([]Shard{{Primary: primary, Replicas: []Client{replica}}}, &Options{alwaysBatch: batched})
			require.NoError(t, err)
			ctx := context.Background()
			now := backendtest.T0
			for _, p := range waitPolicies {
				var wg sync.WaitGroup
				for g := range 8 {
					wg.Go(func() {
						key := "k" + strconv.Itoa(g)
						for i := range int(p.Capacity()) + 1 {
							d, err := b.Take(ctx, key, p, 1, now)
							if !assert.NoError(t, err, "%v %s take %d", p, key, i) {
								return
							}
							assert.Equal(t, i < int(p.Capacity()), d.Allowed, "%v %s take %d", p, key, i)
							r, err := onReplica.Peek(ctx, key, p, now)
							if assert.NoError(t, err) {
								assert.Equal(t, d.Used, r.Used, "%v %s take %d: replica behind", p, key, i)
							}
						}
					})
				}
				wg.Wait()
			}
			lp := throttler.ConcurrencyPolicy{Name: "w-cc", Limit: 2, TTL: time.Minute}
			d, err := b.Acquire(ctx, "k", lp, 7, now)
			require.NoError(t, err)
			assert.True(t, d.Allowed)
			_, _, err = b.Release(ctx, "k", lp, 7, now)
			require.NoError(t, err)
		})
	}
}

// TestConformanceWithWait runs the conformance suites, rates and leases,
// on a primary with a replica and WaitReplicas 1, alone and through
// batches: waiting changes no answer while the replica acknowledges.
func TestConformanceWithWait(t *testing.T) {
	primary, port := startRedis(t, "--repl-diskless-sync-delay", "0")
	_, _ = startRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(port))
	waitReplicaInSync(t, primary)
	for _, batched := range []bool{false, true} {
		t.Run(fmt.Sprintf("batched=%v", batched), func(t *testing.T) {
			// The suite checks answers, not how soon a replica
			// acknowledges: on a machine starved of CPU an acknowledgement
			// can take over a second, which is an outage only in tests
			// that say so (TestWaitWithReplica).
			newBackend := func(t *testing.T) *Backend {
				b, err := New(primary, &Options{Prefix: fmt.Sprintf("wait%v:", batched), WaitReplicas: 1, WaitTimeout: 4 * time.Second, alwaysBatch: batched})
				require.NoError(t, err)
				return b
			}
			backendtest.Run(t, func(t *testing.T) throttler.Backend { return newBackend(t) })
			backendtest.RunLeases(t, func(t *testing.T) backendtest.LeaseStore { return newBackend(t) })
		})
	}
}

// waitReplicaInSync waits until primary streams its writes to its replica. The
// replica reports its link up once it has loaded the primary's snapshot,
// but after a diskless sync the primary starts streaming only at the
// replica's next acknowledgement, up to a second later: a WAIT in that
// second can time out with 0 replicas. So it waits until a write of its
// own (PUBLISH: replicated, no key) is acknowledged, on one connection, as
// WAIT counts its own connection's writes.
func waitReplicaInSync(t *testing.T, primary *goredis.Client) {
	t.Helper()
	ctx := context.Background()
	for i := 0; ; i++ {
		pipe := primary.Pipeline()
		pipe.Publish(ctx, "sync", "")
		acks := pipe.Do(ctx, "WAIT", 1, 100)
		_, err := pipe.Exec(ctx)
		if n, _ := acks.Int64(); err == nil && n == 1 {
			return
		}
		if i == 100 {
			t.Fatalf("replica not streamed to: %v, %d acknowledged", err, acks.Val())
		}
	}
}
