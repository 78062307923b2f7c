package integration

import (
	"context"
	"fmt"
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
	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/migration"
	"github.com/throttlekit/throttlekit/throttler"
)

// Composites (throttler.All) on real Redis: one script over the members'
// keys, which must share a slot and a shard. A single server takes them as
// it is (TestRedisStandalone's conformance runs the composite cases); a
// Cluster and independent shards take them with Options.TagByKey only.

// redisCompositeMembers are a composite's members for the exactness tests:
// every algorithm, the last one also taken alone.
var redisCompositeMembers = []throttler.Policy{
	throttler.PerMinute(50).Named("x-fw"),
	throttler.PerHour(10).WithBurst(60).Named("x-tb"),
	throttler.PerHour(90).WithAlgorithm(throttler.SlidingLog).Named("x-sl"),
	throttler.PerHour(70).WithAlgorithm(throttler.SlidingWindow).Named("x-sw"),
}

// redisCompositeExact makes 64 goroutines, spread over several backends
// (processes, each its own clients), take a composite of every algorithm,
// and its last member alone, on one key at one instant; then reads each
// member through reader: no member is over its limit, and each counts
// exactly the units admitted by what includes it, so a denied composite
// spent nothing anywhere.
func redisCompositeExact(t *testing.T, backends []throttler.Backend, reader throttler.Backend) {
	t.Helper()
	ctx := context.Background()
	c := throttler.All(redisCompositeMembers...)
	alone := redisCompositeMembers[len(redisCompositeMembers)-1]
	key := fmt.Sprint("exact-", time.Now().UnixNano())
	var viaAll, viaAlone, denied, errs atomic.Int64
	var wg sync.WaitGroup
	for g := range 64 {
		b := backends[g%len(backends)]
		wg.Go(func() {
			for i := range 8 {
				cost := int64(1 + (g+i)%3)
				p, n := c, &viaAll
				if (g+i)%4 == 0 {
					p, n = alone, &viaAlone
				}
				d, err := b.Take(ctx, key, p, cost, redisT0)
				switch {
				case err != nil:
					errs.Add(1)
				case d.Allowed:
					n.Add(cost)
				case p.Composite():
					denied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	require.Zero(t, errs.Load())
	require.Positive(t, denied.Load(), "some composites denied")
	for i, p := range redisCompositeMembers {
		d, err := reader.Peek(ctx, key, p, redisT0)
		require.NoError(t, err)
		want := viaAll.Load()
		if i == len(redisCompositeMembers)-1 {
			want += viaAlone.Load()
		}
		assert.Equal(t, want, d.Used, "member %v counts exactly what was admitted", p)
		assert.LessOrEqual(t, d.Used, p.Capacity(), "member %v over its limit", p)
	}
}

// redisCompositeRefused checks that b takes no composite: its Traits say
// so, a Throttler over it refuses one before any store call, and the
// Backend itself answers one with an input error.
func redisCompositeRefused(t *testing.T, b *redis.Backend) {
	t.Helper()
	c := throttler.All(redisCompositeMembers[0], redisCompositeMembers[1])
	assert.False(t, b.Traits().Composites)
	th, err := throttler.New(b, nil)
	require.NoError(t, err)
	_, err = th.Allow(context.Background(), "k", c)
	assert.ErrorIs(t, err, throttler.ErrInvalidPolicy)
	_, err = b.Take(context.Background(), "k", c, 1, redisT0)
	assert.ErrorIs(t, err, throttler.ErrInvalidPolicy)
	assert.NotErrorIs(t, err, throttler.ErrUnavailable)
}

// TestRedisCompositeStandalone: one server takes composites as it is
// (TestRedisStandalone's conformance runs them); through go-redis's
// AutoPipeliner, which may wrap a Cluster, only with TagByKey.
func TestRedisCompositeStandalone(t *testing.T) {
	rc := redisStart(t)
	c := redisClient(t, rc.Addr)
	t.Run("ExactAcrossProcesses", func(t *testing.T) {
		var backends []throttler.Backend
		for range 4 {
			backends = append(backends, redisNew(t, redisClient(t, rc.Addr), nil))
		}
		require.True(t, backends[0].(*redis.Backend).Traits().Composites)
		redisCompositeExact(t, backends, backends[0])
	})
	t.Run("AutoPipeline", func(t *testing.T) {
		ap, err := c.AutoPipeline()
		require.NoError(t, err)
		redisCompositeRefused(t, redisNew(t, ap, nil))
		backendtest.Run(t, func(t *testing.T) throttler.Backend {
			return redisNew(t, ap, &redis.Options{TagByKey: true})
		})
	})
}

func TestRedisCompositeCluster(t *testing.T) {
	addrs := redisCluster(t, 3)
	c := redisClusterClient(t, addrs)
	byKey := &redis.Options{TagByKey: true}

	t.Run("DefaultLayoutTakesNone", func(t *testing.T) {
		redisCompositeRefused(t, redisNew(t, c, nil))
	})
	t.Run("Conformance", func(t *testing.T) {
		backendtest.Run(t, func(t *testing.T) throttler.Backend { return redisNew(t, c, byKey) })
	})
	t.Run("ExactAcrossProcesses", func(t *testing.T) {
		var backends []throttler.Backend
		for range 4 {
			backends = append(backends, redisNew(t, redisClusterClient(t, addrs), byKey))
		}
		redisCompositeExact(t, backends, backends[0])
	})
	t.Run("OneSlotPerKeyAndKeysSpread", func(t *testing.T) {
		b := redisNew(t, c, &redis.Options{Prefix: "slot:", TagByKey: true})
		comp := throttler.All(redisCompositeMembers...)
		ctx := context.Background()
		for i := range 60 {
			d, err := b.Take(ctx, fmt.Sprint("user-", i), comp, 1, redisT0)
			require.NoError(t, err)
			require.True(t, d.Allowed)
		}
		var mu sync.Mutex
		slots := map[string]int64{} // by tag
		var perNode []int
		err := c.ForEachMaster(ctx, func(ctx context.Context, n *goredis.Client) error {
			keys, err := n.Keys(ctx, "slot:*").Result()
			if err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			perNode = append(perNode, len(keys))
			for _, k := range keys {
				slot, err := n.ClusterKeySlot(ctx, k).Result()
				if err != nil {
					return err
				}
				tag := k[:strings.IndexByte(k, '}')+1]
				if s, ok := slots[tag]; ok && s != slot {
					return fmt.Errorf("tag %s in slots %d and %d", tag, s, slot)
				}
				slots[tag] = slot
			}
			return nil
		})
		require.NoError(t, err)
		assert.Len(t, slots, 60, "one tag per key")
		assert.Len(t, perNode, 3)
		for _, n := range perNode {
			assert.NotZero(t, n, "keys per master: %v", perNode)
			assert.Zero(t, n%len(redisCompositeMembers), "a key's members apart: %v", perNode)
		}
	})
	t.Run("MoveToTagByKey", func(t *testing.T) {
		redisMoveToTagByKey(t, c)
	})
}

// TestRedisCompositeShardsWithReplicas: GitHub's layout, two shards each
// with two replicas, takes composites with TagByKey only; they pass the
// conformance suite (each write waited on by both replicas, so that the
// suite's Peeks, which replicas serve, read it) and stay exact across
// processes.
func TestRedisCompositeShardsWithReplicas(t *testing.T) {
	shards, primaries := redisShardsWithReplicas(t)
	newBackend := func(t *testing.T, opts *redis.Options) *redis.Backend {
		b, err := redis.NewSharded(shards, opts)
		require.NoError(t, err)
		return b
	}
	byKey := &redis.Options{TagByKey: true}

	t.Run("DefaultLayoutTakesNone", func(t *testing.T) {
		redisCompositeRefused(t, newBackend(t, nil))
	})
	t.Run("Conformance", func(t *testing.T) {
		backendtest.Run(t, func(t *testing.T) throttler.Backend {
			b := newBackend(t, &redis.Options{TagByKey: true, ExpiryMargin: redisTraceMargin})
			return &redisReplicated{Backend: b, primaries: primaries, replicas: 2}
		})
	})
	t.Run("ExactAcrossProcesses", func(t *testing.T) {
		var backends []throttler.Backend
		for range 4 {
			var own []redis.Shard
			for _, s := range shards {
				o := redis.Shard{Primary: redisClient(t, s.Primary.(*goredis.Client).Options().Addr)}
				for _, r := range s.Replicas {
					o.Replicas = append(o.Replicas, redisClient(t, r.(*goredis.Client).Options().Addr))
				}
				own = append(own, o)
			}
			b, err := redis.NewSharded(own, byKey)
			require.NoError(t, err)
			backends = append(backends, b)
		}
		// Read the primaries: a replica may lag the last writes.
		var onPrimaries []redis.Shard
		for _, p := range primaries {
			onPrimaries = append(onPrimaries, redis.Shard{Primary: p})
		}
		reader, err := redis.NewSharded(onPrimaries, byKey)
		require.NoError(t, err)
		redisCompositeExact(t, backends, reader)
	})
	t.Run("WaitReplicas", func(t *testing.T) {
		// Every composite Take waits for both replicas, in its pipeline:
		// a replica's Peek right after it reads what it counted.
		b := newBackend(t, &redis.Options{Prefix: "wait:", TagByKey: true, WaitReplicas: 2, WaitTimeout: time.Second})
		comp := throttler.All(redisCompositeMembers[0], redisCompositeMembers[2])
		ctx := context.Background()
		for i := range 5 {
			key := fmt.Sprint("user-", i)
			d, err := b.Take(ctx, key, comp, 3, redisT0)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			for range 2 { // each replica in turn
				p, err := b.Peek(ctx, key, comp, redisT0)
				require.NoError(t, err)
				for j, m := range p.Members() {
					assert.Equal(t, int64(3), m.Used, "%s member %d on a replica", key, j)
				}
			}
		}
	})
}

// redisMoveToTagByKey moves live traffic on c from the default layout to
// TagByKey through a migration.Migration, as docs/backends-redis.md says:
// shadow at 0% (the new layout's keys fill in step), then 100%. Nobody
// gets a fresh window, and the new layout's Backend then takes composites
// over the members' carried counts.
func redisMoveToTagByKey(t *testing.T, c redis.Client) {
	ctx := context.Background()
	old := redisNew(t, c, &redis.Options{Prefix: "mv:"})
	nu := redisNew(t, c, &redis.Options{Prefix: "mv:", TagByKey: true})
	require.False(t, old.Traits().Composites)
	require.True(t, nu.Traits().Composites)
	pct, err := flags.NewPercent(0)
	require.NoError(t, err)
	pct.SetMirror(true)
	m, err := migration.New(old, nu, pct, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	require.False(t, m.Traits().Composites, "the old layout takes none, so neither does the move")
	policies := []throttler.Policy{
		throttler.PerMinute(10).Named("mv-fw"),
		throttler.PerMinute(10).WithAlgorithm(throttler.TokenBucket).Named("mv-tb"),
		throttler.PerMinute(10).WithAlgorithm(throttler.SlidingLog).Named("mv-sl"),
		throttler.PerMinute(10).WithAlgorithm(throttler.SlidingWindow).Named("mv-sw"),
	}
	keys := []string{"alice", "bob", "carol", "dave"}
	for _, k := range keys {
		for _, p := range policies {
			d, err := m.Take(ctx, k, p, 6, redisT0)
			require.NoError(t, err)
			require.True(t, d.Allowed, "%s %v", k, p)
		}
	}
	require.NoError(t, m.Flush(ctx))
	for _, k := range keys {
		for _, p := range policies {
			do, err := old.Peek(ctx, k, p, redisT0)
			require.NoError(t, err)
			dn, err := nu.Peek(ctx, k, p, redisT0)
			require.NoError(t, err)
			assert.Equal(t, int64(6), dn.Used, "%s %v: the new layout's count", k, p)
			assert.Equal(t, do.Used, dn.Used, "%s %v", k, p)
		}
	}
	require.NoError(t, pct.Set(100))
	later := redisT0.Add(time.Second)
	for _, k := range keys {
		for _, p := range policies {
			d, err := m.Take(ctx, k, p, 6, later)
			require.NoError(t, err)
			assert.False(t, d.Allowed, "%s %v: a fresh window after the move", k, p)
			d, err = m.Take(ctx, k, p, 4, later)
			require.NoError(t, err)
			assert.True(t, d.Allowed, "%s %v: what was left", k, p)
		}
	}
	// The move is done: the new layout alone, composites included.
	for _, k := range keys {
		comp := throttler.All(policies[0], throttler.PerHour(100).Named("mv-h"))
		d, err := nu.Take(ctx, k, comp, 1, later)
		require.NoError(t, err)
		assert.False(t, d.Allowed, "%s: the composite sees the member's carried count", k)
		assert.Equal(t, 0, d.Binding())
	}
}
