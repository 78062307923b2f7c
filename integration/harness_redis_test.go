package integration

import (
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/backend/redis"
)

// redisShardsWithReplicas starts GitHub's layout: two independent shards,
// each a primary with two replicas. primaries are the shards' primary
// clients, for the tests that wait on replication (redisReplicated).
func redisShardsWithReplicas(t *testing.T) (shards []redis.Shard, primaries []*goredis.Client) {
	t.Helper()
	for range 2 {
		p, rs := redisReplicaSet(t, 2)
		s := redis.Shard{Primary: redisClient(t, p.Addr)}
		for _, r := range rs {
			s.Replicas = append(s.Replicas, redisClient(t, r.Addr))
		}
		shards = append(shards, s)
		primaries = append(primaries, s.Primary.(*goredis.Client))
	}
	return shards, primaries
}
