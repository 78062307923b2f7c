package integration

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/throttler"
)

// TestRedisDeadReplica pauses the replica of a primary (SIGSTOP: its
// connections hang, as a stalled server's do) under Peeks through
// NewSharded. The replica's failures reach Observe naming it and open the
// replicas' breaker; between the replica's probes (one per rest of a
// second) Peeks are answered by the primary without waiting for the
// replica, with its count; the primary's breaker stays closed and its
// Takes go on.
func TestRedisDeadReplica(t *testing.T) {
	const (
		run     = 3500 * time.Millisecond
		maxCall = 20_000
	)
	primary, replicas := redisReplicaSet(t, 1)
	replica := replicas[0]
	b, err := redis.NewSharded([]redis.Shard{{
		Primary: redisClient(t, primary.Addr), Replicas: []redis.Client{redisClient(t, replica.Addr)},
	}}, nil)
	require.NoError(t, err)
	p := throttler.Policy{Name: "dead-replica", Limit: 100, Window: time.Hour}
	var (
		mu       sync.Mutex
		errs     []string
		toStores = map[string]int{} // Peeks by the store they were sent to
	)
	th, err := throttler.New(b, &throttler.Options{
		BreakerThreshold: 2, // the default Timeout, 100ms, and cooldown, 1s
		Observe: func(o throttler.Observation) {
			if o.Op != throttler.OpPeek {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			toStores[o.Store]++
			if o.Err != nil {
				errs = append(errs, o.Err.Error())
			}
		},
	})
	require.NoError(t, err)
	ctx := context.Background()
	key := "dead-replica-" + time.Now().Format("150405.000000")
	for range 3 {
		d, err := th.Allow(ctx, key, p)
		require.NoError(t, err)
		require.True(t, d.Allowed && !d.Degraded)
	}
	waitFor(t, 10*time.Second, "the replica holding the key's count", func(ctx context.Context) bool {
		d, err := b.Peek(ctx, key, p, time.Now())
		return err == nil && d.Used == 3
	})

	redisPause(t, replica)
	var (
		latencies            []time.Duration
		degraded, wrongCount int
	)
	start := time.Now()
	for i := 0; i < maxCall && time.Since(start) < run; i++ {
		began := time.Now()
		d, err := th.Peek(ctx, key, p)
		latencies = append(latencies, time.Since(began))
		require.NoError(t, err) // fails open, Degraded, when the replica fails it
		switch {
		case d.Degraded:
			degraded++
		case d.Used != 3:
			wrongCount++
		}
	}
	elapsed := time.Since(start)
	take, err := th.Allow(ctx, key, p)
	require.NoError(t, err)

	slices.Sort(latencies)
	slow := 0 // Peeks that waited about half the Timeout, a replica's share
	for _, l := range latencies {
		if l >= 40*time.Millisecond {
			slow++
		}
	}
	mu.Lock()
	defer mu.Unlock()
	replicasStore, primaryStore := "redis replicas ("+replica.Addr+")", "redis ("+primary.Addr+")"
	t.Logf("replica paused for %v: %d Peeks (median %v, %d took 40ms or more), %d to the replicas' store and %d to the primary's, %d failed open, %d errors observed",
		elapsed.Round(time.Millisecond), len(latencies), latencies[len(latencies)/2], slow,
		toStores[replicasStore], toStores[primaryStore], degraded, len(errs))
	for _, br := range th.Breakers() {
		t.Logf("breaker %q: open %v, %d failures", br.Store, br.Open, br.Failures)
		switch br.Store {
		case replicasStore:
			assert.True(t, br.Open, "the replicas' breaker")
		case primaryStore:
			assert.False(t, br.Open, "the primary's breaker")
			assert.Zero(t, br.Failures, "failures counted toward the primary")
		}
	}
	require.NotEmpty(t, errs, "no replica failure was observed")
	for _, e := range errs {
		assert.Contains(t, e, "redis replica ("+replica.Addr+")", "an observed error does not name the replica")
	}
	// One Peek per rest of a second reaches the paused replica (the first,
	// then each probe); every other one is the primary's.
	rests := int(elapsed/time.Second) + 1
	assert.LessOrEqual(t, len(errs), rests, "Peeks that failed on the replica")
	assert.Equal(t, len(errs), degraded, "Peeks answered by the failure mode")
	assert.GreaterOrEqual(t, toStores[primaryStore], len(latencies)-rests, "Peeks sent to the primary")
	assert.Zero(t, wrongCount, "Peeks answered with another count than the primary's")
	assert.True(t, take.Allowed && !take.Degraded && take.Used == 4, "a Take after: %+v", take)
}
