package integration

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/shadow"
	"github.com/throttlekit/throttlekit/throttler"
)

// A shadow keeps up with a dead Redis candidate: a refused address, and a
// paused server (connections hang). One hot key puts every call on one
// worker, which used to pay the full Timeout per call (200 calls: 20s);
// every call must be accounted within Timeout × calls / Workers, and the
// calls are compared again once the server answers.
func TestShadowDeadCandidate(t *testing.T) {
	const (
		calls   = 200
		workers = 8
		timeout = 100 * time.Millisecond
	)
	for _, mode := range []string{"refused", "paused"} {
		t.Run(mode, func(t *testing.T) {
			addr := "127.0.0.1:1"
			var rc *redisContainer
			if mode == "paused" {
				rc = redisStart(t)
				addr = rc.Addr
			}
			c := goredis.NewClient(&goredis.Options{
				Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1, DialTimeout: 2 * time.Second,
			})
			t.Cleanup(func() { _ = c.Close() })
			candidate, err := redis.New(c, &redis.Options{Prefix: "dead:"})
			if err != nil {
				t.Fatal(err)
			}
			if rc != nil {
				redisPause(t, rc)
			}
			control, err := memory.New(nil)
			if err != nil {
				t.Fatal(err)
			}
			sh, err := shadow.New(control, candidate, &shadow.Options{Workers: workers, Timeout: timeout})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sh.Close() })
			p := throttler.Policy{Name: "dead", Limit: 1 << 20, Window: time.Hour}
			now := time.Now()
			for range calls {
				if _, err := sh.Take(context.Background(), "hot", p, 1, now); err != nil {
					t.Fatal(err)
				}
			}
			bound := timeout * calls / workers
			ctx, cancel := context.WithTimeout(context.Background(), bound)
			defer cancel()
			start := time.Now()
			err = sh.Flush(ctx)
			st := sh.Stats()
			t.Logf("Flush after %v: %v; %d calls: %d candidate errors, %d dropped", time.Since(start), err, st.Results, st.Count(shadow.CandidateError), st.Count(shadow.Dropped))
			if err != nil {
				t.Fatalf("Flush within %v: %v", bound, err)
			}
			if st.Results != calls || st.Count(shadow.CandidateError)+st.Count(shadow.Dropped) != calls {
				t.Fatalf("%d results, %d candidate errors, %d dropped; want %d, all errors or drops",
					st.Results, st.Count(shadow.CandidateError), st.Count(shadow.Dropped), calls)
			}
			if rc == nil {
				return
			}
			redisUnpause(t, rc)
			waitFor(t, 30*time.Second, "a call compared once Redis answers", func(ctx context.Context) bool {
				_, _ = sh.Take(ctx, "after", p, 1, now)
				return sh.Flush(ctx) == nil && sh.Stats().Compared > 0
			})
		})
	}
}
