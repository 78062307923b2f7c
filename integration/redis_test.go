package integration

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/backendtest"
	"github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/httplimit"
	"github.com/throttlekit/throttlekit/throttler"
)

// redisT0 is where these tests' windows open: years from today, so expiry
// computed as an absolute time from the application's clock would delete
// every window at once.
var redisT0 = time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)

// redisNew is redis.New for a client and options that cannot be wrong.
func redisNew(t testing.TB, c redis.Client, opts *redis.Options) *redis.Backend {
	t.Helper()
	b, err := redis.New(c, opts)
	require.NoError(t, err)
	return b
}

func TestRedisStandalone(t *testing.T) {
	rc := redisStart(t)
	c := redisClient(t, rc.Addr)

	t.Run("Conformance", func(t *testing.T) {
		backendtest.Run(t, func(t *testing.T) throttler.Backend { return redisNew(t, c, nil) })
	})
	t.Run("ConformanceAutoPipeline", func(t *testing.T) {
		ap, err := c.AutoPipeline()
		require.NoError(t, err)
		backendtest.Run(t, func(t *testing.T) throttler.Backend { return redisNew(t, ap, nil) })
	})
	t.Run("ResetAtNeverWobbles", func(t *testing.T) {
		redisTestResetAtNeverWobbles(t, redisNew(t, c, nil), nil)
	})
	t.Run("ExactAcrossProcesses", func(t *testing.T) {
		redisTestExactAcrossClients(t, func() throttler.Backend { return redisNew(t, redisClient(t, rc.Addr), nil) })
	})
	t.Run("ExpiryIsADurationAfterResetAt", func(t *testing.T) {
		// The window opens years from today on the application's clock; Redis
		// must still keep it for Window + margin from its own now.
		b := redisNew(t, c, &redis.Options{Prefix: "ttl:", ExpiryMargin: 1500 * time.Millisecond})
		p := throttler.Policy{Name: "ttl", Limit: 5, Window: time.Minute}
		_, err := b.Take(context.Background(), "k", p, 1, redisT0)
		require.NoError(t, err)
		keys, err := c.Keys(context.Background(), "ttl:*").Result()
		require.NoError(t, err)
		require.Len(t, keys, 1)
		ttl, err := c.PTTL(context.Background(), keys[0]).Result()
		require.NoError(t, err)
		assert.InDelta(t, float64(61500*time.Millisecond), float64(ttl), float64(2*time.Second), "PTTL %v", ttl)
		// The stored reset-at is the application's, in milliseconds.
		r, err := c.HGet(context.Background(), keys[0], "r").Result()
		require.NoError(t, err)
		assert.Equal(t, strconv.FormatInt(redisT0.Add(time.Minute).UnixMilli(), 10), r)
	})
	t.Run("ExactUpToMaxLimit", func(t *testing.T) {
		// Lua numbers are doubles: counts up to 2^53 must stay exact, one
		// unit either side of the limit included.
		b := redisNew(t, c, nil)
		p := throttler.Policy{Name: "max", Limit: redis.MaxLimit, Window: time.Minute}
		ctx := context.Background()
		d, err := b.Take(ctx, "k", p, redis.MaxLimit-1, redisT0)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.Equal(t, int64(redis.MaxLimit-1), d.Used)
		d, err = b.Take(ctx, "k", p, 2, redisT0)
		require.NoError(t, err)
		assert.False(t, d.Allowed, "MaxLimit-1 + 2 > MaxLimit")
		d, err = b.Take(ctx, "k", p, 1, redisT0)
		require.NoError(t, err)
		assert.True(t, d.Allowed)
		assert.Equal(t, int64(redis.MaxLimit), d.Used)
		assert.Equal(t, int64(0), d.Remaining)
		d, err = b.Refund(ctx, "k", p, 3, d.ResetAt, redisT0)
		require.NoError(t, err)
		assert.Equal(t, int64(redis.MaxLimit-3), d.Used)
		_, err = b.Take(ctx, "k", throttler.Policy{Limit: redis.MaxLimit + 1, Window: time.Minute}, 1, redisT0)
		assert.ErrorIs(t, err, throttler.ErrInvalidPolicy)
	})
	t.Run("ScriptCacheFlushed", func(t *testing.T) {
		// After SCRIPT FLUSH (a restart, a failover to a fresh replica) EVALSHA
		// fails with NOSCRIPT and the backend must fall back to EVAL.
		b := redisNew(t, c, nil)
		p := throttler.Policy{Name: "flush", Limit: 2, Window: time.Minute}
		require.NoError(t, c.ScriptFlush(context.Background()).Err())
		d, err := b.Take(context.Background(), "k", p, 1, redisT0)
		require.NoError(t, err)
		assert.Equal(t, int64(1), d.Used)
		require.NoError(t, c.ScriptFlush(context.Background()).Err())
		d, err = b.Refund(context.Background(), "k", p, 1, d.ResetAt, redisT0)
		require.NoError(t, err)
		assert.Equal(t, int64(0), d.Used)
	})
	t.Run("CorruptWindowIsReplaced", func(t *testing.T) {
		// Fields that do not parse (another program's, an old layout's) read
		// as no window, and the next Take replaces them; a key of another type
		// is an error, never a panic.
		b := redisNew(t, c, &redis.Options{Prefix: "corrupt:"})
		p := throttler.Policy{Name: "c", Limit: 2, Window: time.Minute}
		_, err := b.Take(context.Background(), "k", p, 1, redisT0)
		require.NoError(t, err)
		keys, err := c.Keys(context.Background(), "corrupt:*").Result()
		require.NoError(t, err)
		require.Len(t, keys, 1)
		require.NoError(t, c.HSet(context.Background(), keys[0], "u", "many", "r", "soon").Err())
		d, err := b.Peek(context.Background(), "k", p, redisT0)
		require.NoError(t, err)
		assert.Equal(t, int64(0), d.Used)
		d, err = b.Take(context.Background(), "k", p, 2, redisT0)
		require.NoError(t, err)
		assert.True(t, d.Allowed)
		assert.Equal(t, int64(2), d.Used)
		require.NoError(t, c.Del(context.Background(), keys[0]).Err())
		require.NoError(t, c.Set(context.Background(), keys[0], "a string", 0).Err())
		for _, err := range redisAllOps(b, "k", p, redisT0) {
			require.Error(t, err)
			assert.True(t, strings.HasPrefix(err.Error(), "redis: "), "%v", err)
			assert.Contains(t, err.Error(), "WRONGTYPE")
		}
	})
}

func redisAllOps(b throttler.Backend, key string, p throttler.Policy, now time.Time) []error {
	ctx := context.Background()
	_, e1 := b.Take(ctx, key, p, 1, now)
	_, e2 := b.Peek(ctx, key, p, now)
	_, e3 := b.Refund(ctx, key, p, 1, now.Add(p.Window), now)
	return []error{e1, e2, e3}
}

func TestRedisCluster(t *testing.T) {
	addrs := redisCluster(t, 3)
	c := redisClusterClient(t, addrs)

	t.Run("Conformance", func(t *testing.T) {
		backendtest.Run(t, func(t *testing.T) throttler.Backend { return redisNew(t, c, nil) })
	})
	t.Run("ExactAcrossProcesses", func(t *testing.T) {
		redisTestExactAcrossClients(t, func() throttler.Backend { return redisNew(t, redisClusterClient(t, addrs), nil) })
	})
	t.Run("KeysWithBracesSpreadOverMasters", func(t *testing.T) {
		// Every key holds the same "{tenant}": if the user's braces made the
		// hash tag, all would land in one slot on one master.
		b := redisNew(t, c, &redis.Options{Prefix: "spread:"})
		p := throttler.Policy{Name: "{p}", Limit: 1, Window: time.Minute}
		for i := 0; i < 60; i++ {
			d, err := b.Take(context.Background(), fmt.Sprintf("{tenant}}{%d", i), p, 1, redisT0)
			require.NoError(t, err)
			require.True(t, d.Allowed)
		}
		var mu sync.Mutex
		var perNode []int
		err := c.ForEachMaster(context.Background(), func(ctx context.Context, n *goredis.Client) error { // concurrently
			keys, err := n.Keys(ctx, "spread:*").Result()
			mu.Lock()
			perNode = append(perNode, len(keys))
			mu.Unlock()
			return err
		})
		require.NoError(t, err)
		assert.Len(t, perNode, 3)
		for _, n := range perNode {
			assert.NotZero(t, n, "keys per master: %v", perNode)
		}
	})
}

// TestRedisShardsWithReplicas runs GitHub's layout: two independent shards,
// each a primary with two replicas that serve Peek.
func TestRedisShardsWithReplicas(t *testing.T) {
	shards, primaries := redisShardsWithReplicas(t)
	newBackend := func(t *testing.T) *redis.Backend {
		b, err := redis.NewSharded(shards, nil)
		require.NoError(t, err)
		return b
	}

	t.Run("Conformance", func(t *testing.T) {
		// Replication is asynchronous: a Peek on a replica right after a
		// Take may not see it yet. The suite checks read-after-write, so
		// each write here waits until both replicas acknowledge it.
		backendtest.Run(t, func(t *testing.T) throttler.Backend {
			b, err := redis.NewSharded(shards, &redis.Options{ExpiryMargin: redisTraceMargin})
			require.NoError(t, err)
			return &redisReplicated{Backend: b, primaries: primaries, replicas: 2}
		})
	})
	t.Run("ResetAtNeverWobbles", func(t *testing.T) {
		redisTestResetAtNeverWobbles(t, newBackend(t), primaries)
	})
	t.Run("ReplicaHoldingEndedWindow", func(t *testing.T) {
		// The primary has not expired the key yet (it lives Window + margin
		// of real time), so both replicas still hold the full window when
		// the application's clock reaches its reset-at.
		b := newBackend(t)
		p := throttler.Policy{Name: "ended", Limit: 5, Window: time.Minute}
		ctx := context.Background()
		d, err := b.Take(ctx, "k", p, 5, redisT0)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.NoError(t, (&redisReplicated{primaries: primaries, replicas: 2}).sync(ctx))
		d, err = b.Peek(ctx, "k", p, redisT0.Add(time.Second))
		require.NoError(t, err)
		require.Equal(t, int64(5), d.Used, "the replicas hold the window")
		redisCheckFreshAfterReset(t, b, p, "k", redisT0.Add(p.Window))
	})
	t.Run("KeysSpreadOverShards", func(t *testing.T) {
		b := newBackend(t)
		p := throttler.Policy{Name: "spread", Limit: 1, Window: time.Minute}
		for i := 0; i < 100; i++ {
			_, err := b.Take(context.Background(), fmt.Sprint("user-", i), p, 1, redisT0)
			require.NoError(t, err)
		}
		for i, pc := range primaries {
			n, err := pc.DBSize(context.Background()).Result()
			require.NoError(t, err)
			assert.Greater(t, n, int64(20), "shard %d holds %d of 100 keys", i, n)
		}
	})
}

// TestRedisStaleReplica is GitHub's second bug in its purest form: the
// backend's replica is a server that still holds an ended window its
// primary never had (as if the expiry had not propagated).
func TestRedisStaleReplica(t *testing.T) {
	primary, stale := redisStart(t), redisStart(t)
	p := throttler.Policy{Name: "stale", Limit: 5, Window: time.Minute}
	ctx := context.Background()
	// Fill the window on the server that will play the replica.
	filler := redisNew(t, redisClient(t, stale.Addr), nil)
	d, err := filler.Take(ctx, "k", p, 5, redisT0)
	require.NoError(t, err)
	require.True(t, d.Allowed)

	b, err := redis.NewSharded([]redis.Shard{{
		Primary:  redisClient(t, primary.Addr),
		Replicas: []redis.Client{redisClient(t, stale.Addr)},
	}}, nil)
	require.NoError(t, err)
	d, err = b.Peek(ctx, "k", p, redisT0.Add(30*time.Second))
	require.NoError(t, err)
	require.Equal(t, int64(5), d.Used, "Peek inside the window reads the replica")
	require.False(t, d.Allowed)
	redisCheckFreshAfterReset(t, b, p, "k", redisT0.Add(p.Window))
}

// redisCheckFreshAfterReset asserts, around and after resetAt, that Peek
// reports a fresh window once reset-at has passed and that no call ever
// says "denied, Remaining == Limit".
func redisCheckFreshAfterReset(t *testing.T, b throttler.Backend, p throttler.Policy, key string, resetAt time.Time) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < 10; i++ { // round robin: every replica answers
		now := resetAt.Add(time.Duration(i) * time.Millisecond)
		d, err := b.Peek(ctx, key, p, now)
		require.NoError(t, err)
		assert.True(t, d.Allowed, "Peek at reset-at+%dms", i)
		assert.Equal(t, int64(0), d.Used, "Peek at reset-at+%dms", i)
		assert.Equal(t, p.Limit, d.Remaining, "Peek at reset-at+%dms", i)
		assert.Equal(t, now.Add(p.Window).UnixMilli(), d.ResetAt.UnixMilli(), "Peek at reset-at+%dms", i)
	}
	// Take and Peek across the boundary, on the primary and the replicas.
	for i := 0; i < 3*int(p.Limit); i++ {
		now := resetAt.Add(time.Duration(i) * time.Millisecond)
		for _, op := range []string{"peek", "take"} {
			var d throttler.Decision
			var err error
			if op == "take" {
				d, err = b.Take(ctx, key, p, 1, now)
			} else {
				d, err = b.Peek(ctx, key, p, now)
			}
			require.NoError(t, err)
			assert.False(t, !d.Allowed && d.Remaining == p.Limit, "%s at reset-at+%dms: denied with Remaining == Limit: %+v", op, i, d)
			if op == "take" {
				assert.Equal(t, i < int(p.Limit), d.Allowed, "take %d of the new window", i+1)
				assert.Equal(t, resetAt.Add(p.Window).UnixMilli(), d.ResetAt.UnixMilli(), "take %d of the new window", i+1)
			}
		}
	}
}

// redisTestResetAtNeverWobbles is GitHub's first bug: over 1,200 calls inside
// one window, at 7ms steps across many second boundaries, neither ResetAt
// nor the middleware's X-RateLimit-Reset ever changes. With primaries set,
// Peeks go to replicas once each write is acknowledged by them.
func redisTestResetAtNeverWobbles(t *testing.T, b throttler.Backend, primaries []*goredis.Client) {
	var nowNS atomic.Int64
	nowNS.Store(redisT0.Add(300 * time.Millisecond).UnixNano())
	clock := func() time.Time { return time.Unix(0, nowNS.Load()) }
	thr, err := throttler.New(b, &throttler.Options{Clock: clock, Timeout: 2 * time.Second})
	require.NoError(t, err)
	p := throttler.Policy{Name: "wobble", Limit: 5000, Window: time.Hour}
	mw, err := httplimit.Rate(thr, p, httplimit.KeyByHeader("X-Client"), nil)
	require.NoError(t, err)
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	key := fmt.Sprint("client-", time.Now().UnixNano())

	var wantReset time.Time
	wantHeader := ""
	seconds := map[int64]bool{}
	for i := 0; i < 1200; i++ {
		now := clock()
		seconds[now.Unix()] = true
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-Client", key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		require.Equal(t, http.StatusOK, rec.Code, "request %d: %s", i, rec.Body)
		if i == 0 {
			wantHeader = rec.Header().Get("X-RateLimit-Reset")
			wantReset = now.Add(p.Window)
			require.Equal(t, strconv.FormatInt((wantReset.UnixMilli()+999)/1000, 10), wantHeader)
			require.NoError(t, (&redisReplicated{primaries: primaries, replicas: 2}).sync(context.Background()))
		}
		require.Equal(t, wantHeader, rec.Header().Get("X-RateLimit-Reset"), "request %d at +%v", i, now.Sub(redisT0))
		if i%4 == 0 {
			d, err := thr.Peek(context.Background(), key, p)
			require.NoError(t, err)
			require.False(t, d.Degraded)
			require.Equal(t, wantReset.UnixMilli(), d.ResetAt.UnixMilli(), "Peek %d at +%v", i, now.Sub(redisT0))
		}
		nowNS.Add(int64(7 * time.Millisecond))
	}
	require.Greater(t, len(seconds), 8, "the calls must cross second boundaries")
}

// redisTestExactAcrossClients: 4 independent clients (as 4 processes would
// have) x 32 goroutines on one key admit exactly Limit.
func redisTestExactAcrossClients(t *testing.T, newBackend func() throttler.Backend) {
	const clients, goroutines, perGoroutine = 4, 32, 5
	p := throttler.Policy{Name: "exact", Limit: 301, Window: time.Minute}
	key := fmt.Sprint("hot-", time.Now().UnixNano())
	var admitted, errs atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range clients {
		b := newBackend()
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for i := range perGoroutine {
					d, err := b.Take(context.Background(), key, p, 1, redisT0.Add(time.Duration(g*perGoroutine+i)*time.Millisecond))
					if err != nil {
						errs.Add(1)
						continue
					}
					if d.Allowed {
						admitted.Add(1)
					}
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	require.Zero(t, errs.Load(), "errors")
	assert.Equal(t, p.Limit, admitted.Load(), "admitted of %d attempts", clients*goroutines*perGoroutine)
}

// redisReplicated waits, after every write, until the replicas of every
// shard have it, so that read-after-write checks hold on replica Peeks.
// Its backend is built with redisTraceMargin.
type redisReplicated struct {
	*redis.Backend
	primaries []*goredis.Client
	replicas  int
}

// redisTraceMargin is the ExpiryMargin of a backend that runs the
// conformance suite with a WAIT after each write: the suite's traces
// keep windows of a few ms live on the callers' clock for hundreds of
// calls, and each call's round trips take real time, up to seconds on a
// starved machine. With the default 1s margin Redis would delete state
// that is live by the callers' clock, which the suite counts as a wrong
// answer. An hour outlasts any run of the suite.
const redisTraceMargin = time.Hour

// sync waits until the replicas of every primary hold every write made
// so far. WAIT counts acknowledgements of its own connection's last
// write: on a pooled connection that wrote nothing it answers at once,
// whatever the replicas hold. So it follows a write of its own on one
// connection (PUBLISH: replicated, and it stores no key); the replication
// stream is in order, so the writes before it are acknowledged with it.
func (r *redisReplicated) sync(ctx context.Context) error {
	for _, p := range r.primaries {
		n, err := redisWaitAfterWrite(ctx, p, r.replicas)
		if err != nil {
			return err
		}
		if n < int64(r.replicas) {
			return fmt.Errorf("WAIT: %d of %d replicas acknowledged", n, r.replicas)
		}
	}
	return nil
}

// redisWaitAfterWrite writes on one connection of p, then waits there
// until replicas acknowledge it, and answers how many did.
func redisWaitAfterWrite(ctx context.Context, p *goredis.Client, replicas int) (int64, error) {
	c := p.Conn()
	defer c.Close()
	if err := c.Publish(ctx, "throttlekit-test:sync", "").Err(); err != nil {
		return 0, err
	}
	return c.Wait(ctx, replicas, 5*time.Second).Result()
}

func (r *redisReplicated) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	d, err := r.Backend.Take(ctx, key, p, cost, now)
	if err == nil {
		err = r.sync(ctx)
	}
	return d, err
}

func (r *redisReplicated) Refund(ctx context.Context, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
	d, err := r.Backend.Refund(ctx, key, p, cost, receipt, now)
	if err == nil {
		err = r.sync(ctx)
	}
	return d, err
}
