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

// deadCandidate is a candidate store, and the functions that stop it
// answering and make it answer again (nil: it never answers).
type deadCandidate struct {
	b          throttler.Backend
	kill, heal func()
}

// A shadow keeps up with a dead candidate: a refused Redis address, a
// paused Redis (connections hang until the deadline), and a paused
// Memcached, whose client ignores the context and waits its own 1s Timeout
// per round trip. One hot key puts every call on one worker, which used to
// pay the full Timeout (or more) per call: 200 calls, 20s and beyond. Every
// call must be accounted within Timeout × calls / Workers, and calls are
// compared again once the server answers.
func TestShadowDeadCandidate(t *testing.T) {
	const (
		calls   = 200
		workers = 8
		timeout = 100 * time.Millisecond
	)
	redisAt := func(t *testing.T, addr string) throttler.Backend {
		c := goredis.NewClient(&goredis.Options{
			Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1, DialTimeout: 2 * time.Second,
		})
		t.Cleanup(func() { _ = c.Close() })
		b, err := redis.New(c, &redis.Options{Prefix: "dead:"})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name string
		make func(t *testing.T) deadCandidate
	}{
		{"redis refused", func(t *testing.T) deadCandidate {
			return deadCandidate{b: redisAt(t, "127.0.0.1:1"), kill: func() {}}
		}},
		{"redis paused", func(t *testing.T) deadCandidate {
			rc := redisStart(t)
			return deadCandidate{redisAt(t, rc.Addr), func() { redisPause(t, rc) }, func() { redisUnpause(t, rc) }}
		}},
		{"memcached paused", func(t *testing.T) deadCandidate {
			s := memcachedStart(t)
			b := memcachedNew(t, memcachedClient(t, time.Second, s.addr), nil)
			return deadCandidate{b, func() { s.pause(t) }, func() { s.unpause(t) }}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dc := tc.make(t)
			dc.kill()
			control, err := memory.New(nil)
			if err != nil {
				t.Fatal(err)
			}
			sh, err := shadow.New(control, dc.b, &shadow.Options{Workers: workers, Timeout: timeout})
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
			t.Logf("Flush after %v: %v; %d calls: %d candidate errors, %d dropped", time.Since(start), err, st.Results, st.ByKind[shadow.CandidateError], st.ByKind[shadow.Dropped])
			if err != nil {
				t.Fatalf("Flush within %v: %v", bound, err)
			}
			if st.Results != calls || st.ByKind[shadow.CandidateError]+st.ByKind[shadow.Dropped] != calls {
				t.Fatalf("%d results, %d candidate errors, %d dropped; want %d, all errors or drops",
					st.Results, st.ByKind[shadow.CandidateError], st.ByKind[shadow.Dropped], calls)
			}
			if dc.heal == nil {
				return
			}
			dc.heal()
			waitFor(t, 30*time.Second, "a call compared once the store answers", func(ctx context.Context) bool {
				_, _ = sh.Take(ctx, "after", p, 1, now)
				return sh.Flush(ctx) == nil && sh.Stats().Compared > 0
			})
		})
	}
}
