package integration

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

// fallbackDecision is one Allow of a user in one process, as the test saw it.
type fallbackDecision struct {
	process, user int
	at, resetAt   time.Time
	allowed       bool
	fallback      bool // Degraded: answered by the fallback
}

// TestFallbackFlappingRedis: three processes (Throttlers, each with its own
// Redis client and memory fallback, FallbackFleetSize 3) limit 12 users at
// 20 per 5 s, about 300 calls a second in all, while Redis is paused twice
// for 1.5 s. Within each process, a user answered by the fallback is never
// answered by Redis again while that fallback window is open, so the reset
// each user sees never goes back; the fallback admits at most the share
// (20 ÷ 3 = 6) per process and window, Redis at most 20 per window.
func TestFallbackFlappingRedis(t *testing.T) {
	rc := redisStart(t)
	const (
		processes = 3
		workers   = 4 // per process
		users     = 12
		limit     = 20
		window    = 5 * time.Second
		share     = limit / processes
		timeout   = 50 * time.Millisecond
	)
	p := throttler.Policy{Name: fmt.Sprint("fallback-", time.Now().UnixNano()), Limit: limit, Window: window}

	var mu sync.Mutex
	var decisions []fallbackDecision
	failureMode := 0
	ths := make([]*throttler.Throttler, processes)
	for i := range ths {
		fb, err := memory.New(nil)
		require.NoError(t, err)
		ths[i], err = throttler.New(redisNew(t, redisClient(t, rc.Addr), nil), &throttler.Options{
			Timeout: timeout, Fallback: fb, FallbackFleetSize: processes,
			Observe: func(o throttler.Observation) {
				if o.Source == throttler.SourceFailureMode {
					mu.Lock()
					failureMode++
					mu.Unlock()
				}
			},
		})
		require.NoError(t, err)
	}

	// Load: bounded in time and in calls.
	const runFor, maxCalls = 12 * time.Second, 4800
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for proc := range processes {
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < maxCalls/(processes*workers); i++ {
					select {
					case <-stop:
						return
					default:
					}
					user := (i*workers + w) % users
					d, err := ths[proc].Allow(context.Background(), fmt.Sprint("user-", user), p)
					if !assert.NoError(t, err) {
						return
					}
					mu.Lock()
					decisions = append(decisions, fallbackDecision{process: proc, user: user, at: d.At, resetAt: d.ResetAt,
						allowed: d.Allowed, fallback: d.Degraded})
					mu.Unlock()
					time.Sleep(40 * time.Millisecond) // about 300 calls a second in all
				}
			}()
		}
	}

	// Flapping: paused 1.5 s from 1 s, back (the users' fallback windows run
	// on to about 6 s), paused again 1.5 s from 7 s.
	start := time.Now()
	for _, pause := range []time.Duration{time.Second, 7 * time.Second} {
		time.Sleep(time.Until(start.Add(pause)))
		redisPause(t, rc)
		time.Sleep(1500 * time.Millisecond)
		redisUnpause(t, rc)
	}
	time.Sleep(time.Until(start.Add(runFor)))
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	sort.SliceStable(decisions, func(i, j int) bool { return decisions[i].at.Before(decisions[j].at) })
	type procUser struct{ process, user int }
	type storeWindow struct {
		procUser
		fallback bool
		resetAt  time.Time
	}
	// openFallback is, per process and user, the latest end of a fallback
	// window seen so far (in the order of the calls' instants).
	openFallback := map[procUser]time.Time{}
	admitted := map[storeWindow]int{}
	var fromFallback, fromRedis, backToRedis, reentries, admittedFallback, admittedRedis int
	for _, d := range decisions {
		pu := procUser{d.process, d.user}
		if d.fallback {
			fromFallback++
			if d.resetAt.After(openFallback[pu]) {
				openFallback[pu] = d.resetAt
			}
		} else {
			fromRedis++
			if end, ok := openFallback[pu]; ok {
				if d.at.Before(end) {
					reentries++
					if reentries <= 5 {
						t.Errorf("process %d, user %d: Redis answered at %v, inside the fallback's window ending %v",
							d.process, d.user, d.at.Format("15:04:05.000"), end.Format("15:04:05.000"))
					}
				} else {
					backToRedis++
					delete(openFallback, pu)
				}
			}
		}
		if d.allowed {
			admitted[storeWindow{pu, d.fallback, d.resetAt}]++
			if d.fallback {
				admittedFallback++
			} else {
				admittedRedis++
			}
		}
	}
	assert.Zero(t, reentries, "calls answered by Redis inside a fallback window of their process and user")
	assert.Zero(t, failureMode, "the fallback answered every failed call")
	assert.Positive(t, fromFallback, "the pauses were answered by the fallback")
	assert.Positive(t, backToRedis, "users went back to Redis between and after the pauses")

	// Per window: Redis's (shared by the processes) at most the limit, each
	// process's fallback's at most the share.
	type userWindow struct {
		user    int
		resetAt int64 // ms
	}
	redisWindows := map[userWindow]int{}
	worstFallback := 0
	for w, n := range admitted {
		if w.fallback {
			worstFallback = max(worstFallback, n)
			assert.LessOrEqual(t, n, share, "process %d, user %d: fallback window ending %v", w.process, w.user, w.resetAt)
			continue
		}
		redisWindows[userWindow{w.user, w.resetAt.UnixMilli()}] += n
	}
	for w, n := range redisWindows {
		assert.LessOrEqual(t, n, limit, "Redis window %v", w)
	}

	// The most any user was admitted in any span of one window, fleet-wide.
	perUser := map[int][]time.Time{}
	for _, d := range decisions {
		if d.allowed {
			perUser[d.user] = append(perUser[d.user], d.at)
		}
	}
	worstSpan := 0
	for _, ats := range perUser {
		for i, j := 0, 0; j < len(ats); j++ {
			for ats[j].Sub(ats[i]) >= window {
				i++
			}
			worstSpan = max(worstSpan, j-i+1)
		}
	}
	assert.LessOrEqual(t, worstSpan, 2*limit, "no more than two windows' limits in one window's span, as a healthy store's fixed windows allow")
	t.Logf("%d calls: %d from Redis (%d admitted), %d from the fallbacks (%d admitted, at most %d per process and window); "+
		"%d returns to Redis; most admitted per user in any %v: %d",
		len(decisions), fromRedis, admittedRedis, fromFallback, admittedFallback, worstFallback, backToRedis, window, worstSpan)
}
