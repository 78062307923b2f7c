package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/throttler"
)

// sourceCounts counts a Throttler's decisions by operation and source.
type sourceCounts struct {
	takes, peeks [4]atomic.Int64 // by throttler.Source
}

func (c *sourceCounts) observe(o throttler.Observation) {
	if o.Op == throttler.OpPeek {
		c.peeks[o.Source].Add(1)
	} else {
		c.takes[o.Source].Add(1)
	}
}

// A paused replica, which serves only Peek, never makes Takes fail open
// while the primary is healthy: the replica gets half of a Peek's time and
// its failure is the replicas' store's, never the primary's: every Take is answered by the
// primary and every key is limited exactly. The Peeks under way on the
// replica when it first fails fail open (at most one per worker); the
// replica then rests and the other Peeks are the primary's.
func TestBreakerRedisPausedReplica(t *testing.T) {
	primary, replicas := redisReplicaSet(t, 1)
	b, err := redis.NewSharded([]redis.Shard{{
		Primary:  redisClient(t, primary.Addr),
		Replicas: []redis.Client{redisClient(t, replicas[0].Addr)},
	}}, nil)
	require.NoError(t, err)
	now := time.Now()
	var counts sourceCounts
	th, err := throttler.New(b, &throttler.Options{Timeout: 100 * time.Millisecond, Clock: func() time.Time { return now }, Observe: counts.observe})
	require.NoError(t, err)

	redisPause(t, replicas[0])

	p := throttler.Policy{Name: "replica-paused", Limit: 10, Window: time.Hour}
	run := fmt.Sprint(now.UnixNano())
	const workers, rounds = 8, 15
	var admitted [workers]atomic.Int64
	var wg sync.WaitGroup
	ctx := context.Background()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprint(run, "-", w)
			for range rounds {
				if _, err := th.Peek(ctx, key, p); err != nil {
					t.Errorf("Peek: %v", err)
				}
				d, err := th.Allow(ctx, key, p)
				if err != nil {
					t.Errorf("Allow: %v", err)
				}
				if d.Allowed {
					admitted[w].Add(1)
				}
			}
		}()
	}
	wg.Wait()

	t.Logf("takes: %d from the primary, %d failed open; peeks: %d from the primary, %d failed open",
		counts.takes[throttler.SourcePrimary].Load(), counts.takes[throttler.SourceFailureMode].Load(),
		counts.peeks[throttler.SourcePrimary].Load(), counts.peeks[throttler.SourceFailureMode].Load())
	assert.Zero(t, counts.takes[throttler.SourceFailureMode].Load(), "no Take fails open")
	assert.Equal(t, int64(workers*rounds), counts.takes[throttler.SourcePrimary].Load())
	failed := counts.peeks[throttler.SourceFailureMode].Load()
	assert.True(t, failed >= 1 && failed <= workers, "Peeks failed on the replica: %d, want 1 to %d", failed, workers)
	assert.Equal(t, int64(workers*rounds)-failed, counts.peeks[throttler.SourcePrimary].Load(), "the other Peeks are the primary's")
	for w := range workers {
		assert.Equal(t, p.Limit, admitted[w].Load(), "worker %d's key is limited exactly", w)
	}
}

// A shard's primary and its replica are stores apart. With the primary
// paused, Peeks the replica answered used to reset the primary's failure
// count, so its breaker never opened and every Take paid the whole
// Timeout (48 of 48). Now Takes open the primary's breaker after
// BreakerThreshold failures and the rest skip it at once, while every
// Peek is still answered by the replica, whose breaker stays closed.
func TestBreakerRedisPausedPrimaryLiveReplica(t *testing.T) {
	primary, replicas := redisReplicaSet(t, 1)
	pc := redisClient(t, primary.Addr)
	b, err := redis.NewSharded([]redis.Shard{{
		Primary:  pc,
		Replicas: []redis.Client{redisClient(t, replicas[0].Addr)},
	}}, nil)
	require.NoError(t, err)
	now := time.Now()
	var counts sourceCounts
	var mu sync.Mutex
	stores := map[string]bool{}
	var reached atomic.Int64 // Takes that reached the primary, not skipped by its breaker
	// A Peek gives the replica half of the Timeout: 150 ms, so that on a
	// loaded -race run the live replica still answers in its half (with
	// 100 ms, 47 of 48 Peeks once failed on both, which opened the
	// replicas' breaker).
	const timeout, threshold = 300 * time.Millisecond, 5
	th, err := throttler.New(b, &throttler.Options{Timeout: timeout, BreakerThreshold: threshold, BreakerCooldown: time.Minute,
		Clock: func() time.Time { return now }, Observe: func(o throttler.Observation) {
			counts.observe(o)
			if o.Op == throttler.OpTake && !strings.Contains(fmt.Sprint(o.Err), "skipped") {
				reached.Add(1)
			}
			mu.Lock()
			stores[o.Op.String()+" "+o.Store] = true
			mu.Unlock()
		}})
	require.NoError(t, err)
	ctx := context.Background()
	p := throttler.Policy{Name: "primary-paused", Limit: 10, Window: time.Hour}
	run := fmt.Sprint(now.UnixNano())
	const workers, rounds = 8, 6
	for w := range workers { // on the backend: a Throttler's Timeout could fail a seed open
		d, err := b.Take(ctx, fmt.Sprint(run, "-", w), p, 3, now)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	acked, err := pc.Wait(ctx, 1, 5*time.Second).Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, acked, "the replica has the seeds")
	for w := range workers { // and its connections are open before the pause
		d, err := b.Peek(ctx, fmt.Sprint(run, "-", w), p, now)
		require.NoError(t, err)
		require.EqualValues(t, 3, d.Used)
	}

	redisPause(t, primary)

	var slowTakes, badPeeks atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			key := fmt.Sprint(run, "-", w)
			for range rounds {
				d, err := th.Peek(ctx, key, p)
				if err != nil || d.Degraded || d.Used != 3 {
					badPeeks.Add(1)
					t.Errorf("Peek: %+v, %v; want the replica's Used 3", d, err)
				}
				start := time.Now()
				if d, _ := th.Allow(ctx, key, p); !d.Degraded {
					t.Errorf("a paused primary answered a Take: %+v", d)
				}
				if time.Since(start) >= timeout/2 {
					slowTakes.Add(1)
				}
			}
		})
	}
	wg.Wait()

	t.Logf("%d of %d Takes reached the paused primary, %d took Timeout/2 or more; peeks: %d from the replica, %d failed open",
		reached.Load(), workers*rounds, slowTakes.Load(), counts.peeks[throttler.SourcePrimary].Load(), counts.peeks[throttler.SourceFailureMode].Load())
	// The Takes under way when the pause began fail as one failure; the
	// breaker opens after threshold-1 more from Takes made after that, and
	// the calls already under way then (one per worker at most) still reach
	// the primary.
	assert.LessOrEqual(t, reached.Load(), int64(threshold+2*workers), "the primary's breaker opened")
	assert.Zero(t, badPeeks.Load(), "every Peek is answered by the replica")
	// Check names the paused primary, and only it.
	checkCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	err = b.Check(checkCtx)
	assert.ErrorIs(t, err, throttler.ErrUnavailable)
	assert.ErrorContains(t, err, "redis ("+primary.Addr+"): ")
	assert.NotContains(t, fmt.Sprint(err), replicas[0].Addr, "the live replica answered")
	replicaStore := "peek redis replicas (" + replicas[0].Addr + ")"
	assert.True(t, stores[replicaStore], "Peeks are the replicas' store: %v", stores)
	assert.True(t, stores["take redis ("+primary.Addr+")"], "Takes are the primary's store: %v", stores)
}

// A key another program wrote with another type (WRONGTYPE) is that key's
// failure alone: one key that always errors never opens the breaker for
// every key.
func TestBreakerRedisPoisonedKey(t *testing.T) {
	rc := redisStart(t)
	c := redisClient(t, rc.Addr)
	now := time.Now()
	var counts sourceCounts
	var mu sync.Mutex
	var keyErrs int
	th, err := throttler.New(redisNew(t, c, nil), &throttler.Options{Clock: func() time.Time { return now }, Observe: func(o throttler.Observation) {
		counts.observe(o)
		if o.Err != nil && assert.ErrorIs(t, o.Err, throttler.ErrKeyState) {
			mu.Lock()
			keyErrs++
			mu.Unlock()
		}
	}})
	require.NoError(t, err)
	ctx := context.Background()
	p := throttler.Policy{Name: "poisoned", Limit: 10, Window: time.Hour}
	run := fmt.Sprint(now.UnixNano())

	poisoned := run + "-poisoned"
	_, err = th.Allow(ctx, poisoned, p)
	require.NoError(t, err)
	stored, err := c.Keys(ctx, "throttlekit:*"+poisoned).Result()
	require.NoError(t, err)
	require.Len(t, stored, 1)
	require.NoError(t, c.Set(ctx, stored[0], "not a hash", 0).Err())

	for range 20 {
		d, err := th.Allow(ctx, poisoned, p)
		require.NoError(t, err)
		require.True(t, d.Degraded, "the poisoned key fails open")
	}
	assertOthersLimited(t, th, run, p)
	assert.Equal(t, 20, keyErrs, "each of the poisoned key's calls reported its own failure")
}

// assertOthersLimited checks that five fresh keys under p are each served
// by the store and limited exactly, whatever failed before.
func assertOthersLimited(t *testing.T, th *throttler.Throttler, run string, p throttler.Policy) {
	t.Helper()
	for i := range 5 {
		admitted := int64(0)
		for range p.Limit + 5 {
			d, err := th.Allow(context.Background(), fmt.Sprint(run, "-", i), p)
			require.NoError(t, err)
			require.False(t, d.Degraded, "other keys are served by the store")
			if d.Allowed {
				admitted++
			}
		}
		assert.Equal(t, p.Limit, admitted, "key %d is limited exactly", i)
	}
}
