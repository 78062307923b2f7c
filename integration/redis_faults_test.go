package integration

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/throttler"
)

// TestRedisFaults takes Redis away mid-load, by pausing its container (a
// stalled server: connections hang) or stopping it (a dead one: connections
// are refused), under a Throttler that fails open, with and without a memory
// fallback. Every call must be answered within the timeout plus a small
// margin, the fallback must keep limiting, and once Redis is back the
// decisions must come from it again.
func TestRedisFaults(t *testing.T) {
	faultSubtests(t, func(t *testing.T, fault string, fallback bool) { redisTestFault(t, fault, fallback, false) })
	// The docs recommend go-redis's AutoPipeliner under high concurrency: it
	// must honour the Throttler's deadline as well.
	t.Run("pause/fail-open/autopipeline", func(t *testing.T) { redisTestFault(t, "pause", false, true) })
	t.Run("stop/fail-open/autopipeline", func(t *testing.T) { redisTestFault(t, "stop", false, true) })
}

const (
	redisFaultTimeout = 100 * time.Millisecond
	// redisFaultMargin is what a call may take beyond the timeout: scheduling
	// on a 2-core machine shared with the server and other tests.
	redisFaultMargin = 150 * time.Millisecond
)

func redisTestFault(t *testing.T, fault string, fallback, autoPipeline bool) {
	rc := redisStart(t)
	leaks := faultLeaks()
	c := redisClient(t, rc.Addr)
	b := redisNew(t, c, nil)
	if autoPipeline {
		// The AutoPipeliner's blocking calls wait for their batch whatever
		// the caller's context says (go-redis v9.23), bounded only by the
		// client's own timeouts and retries (by default, seconds). The
		// backend says so, and the Throttler detaches its calls: its
		// Timeout bounds them with the client's defaults untouched.
		require.NoError(t, c.Close())
		c = goredis.NewClient(&goredis.Options{Addr: rc.Addr})
		t.Cleanup(func() { c.Close() })
		ap, err := c.AutoPipeline()
		require.NoError(t, err)
		b = redisNew(t, ap, nil)
	}
	sc := &faultScenario{
		name:    "Redis",
		backend: b,
		leaks:   leaks,
		timeout: redisFaultTimeout,
		margin:  redisFaultMargin,
		pause:   func(t *testing.T) { redisPause(t, rc) },
		unpause: func(t *testing.T) { redisUnpause(t, rc) },
		stop: func(t *testing.T) {
			timeout := time.Duration(0)
			require.NoError(t, rc.c.Stop(context.Background(), &timeout))
		},
		start: func(t *testing.T) { require.NoError(t, rc.c.Start(context.Background())) },
		stored: func(t *testing.T, key string, _ throttler.Policy) {
			stored, err := c.Keys(context.Background(), "throttlekit:*"+key).Result()
			require.NoError(t, err)
			assert.Len(t, stored, 1, "the decision after recovery was counted in Redis")
		},
		closeClient: c.Close,
	}
	sc.run(t, fault, fallback)
}
