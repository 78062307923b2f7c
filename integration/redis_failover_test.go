package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/throttler"
)

// sentinelMaster is the name the sentinels monitor the primary under.
const sentinelMaster = "tk"

// sentinelTopology is a primary, one replica and three sentinels, each a
// container on the host's network listening on its own loopback port, so
// that the addresses the sentinels announce (127.0.0.1 and a port) are
// the ones the test process dials. On a bridge network they would announce
// container addresses, which a test process outside Docker may not reach.
type sentinelTopology struct {
	primary   int   // port
	replicas  []int // ports; the sentinels promote the first
	sentinels []string
}

// redisHostRun starts the redis image with cmd on the host's network and
// waits for ready in its log; the container ends with the test.
func redisHostRun(t *testing.T, ready string, cmd ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := testcontainers.Run(ctx, redisImage,
		containerLogger(t),
		testcontainers.WithCmd(cmd...),
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) { hc.NetworkMode = "host" }),
		testcontainers.WithWaitStrategy(wait.ForLog(ready).WithStartupTimeout(time.Minute)),
	)
	testcontainers.CleanupContainer(t, c)
	if err != nil {
		t.Fatalf("start %v: %v", cmd, err)
	}
}

// sentinelStart starts the topology with n replicas and waits until every
// sentinel knows them and the two other sentinels, so that a failover can
// run. The first replica has the best priority: it is the one promoted.
func sentinelStart(t *testing.T, n int) *sentinelTopology {
	t.Helper()
	ports := redisFreePorts(t, 4+n)
	top := &sentinelTopology{primary: ports[0], replicas: ports[1 : 1+n]}
	server := func(port int, args ...string) []string {
		p := strconv.Itoa(port)
		// Diskless sync at once: after the failover the old primary
		// resyncs from the new one without waiting 5s for others.
		return append(append([]string{"redis-server", "--port", p, "--bind", "127.0.0.1",
			"--repl-diskless-sync-delay", "0"}, redisNoPersistence...), args...)
	}
	redisHostRun(t, "Ready to accept connections", server(top.primary)...)
	for i, port := range top.replicas {
		redisHostRun(t, "MASTER <-> REPLICA sync: Finished with success", server(port,
			"--replicaof", "127.0.0.1", strconv.Itoa(top.primary), "--replica-priority", strconv.Itoa(10+i))...)
	}
	for _, port := range ports[1+n:] {
		// A sentinel rewrites its configuration file, so it needs one of
		// its own; redis-server --sentinel is redis-sentinel.
		conf := fmt.Sprintf("port %d\nbind 127.0.0.1\nsentinel monitor %s 127.0.0.1 %d 2\n"+
			"sentinel down-after-milliseconds %s 5000\nsentinel failover-timeout %s 20000\n",
			port, sentinelMaster, top.primary, sentinelMaster, sentinelMaster)
		redisHostRun(t, "+monitor master",
			"sh", "-c", fmt.Sprintf("printf '%s' > /data/sentinel.conf && exec redis-server /data/sentinel.conf --sentinel",
				strings.ReplaceAll(conf, "\n", `\n`)))
		top.sentinels = append(top.sentinels, "127.0.0.1:"+strconv.Itoa(port))
	}
	for _, addr := range top.sentinels {
		s := goredis.NewSentinelClient(&goredis.Options{Addr: addr})
		t.Cleanup(func() { s.Close() })
		waitFor(t, time.Minute, "sentinel "+addr+" knowing the replica and its peers", func(ctx context.Context) bool {
			replicas, err1 := s.Replicas(ctx, sentinelMaster).Result()
			peers, err2 := s.Sentinels(ctx, sentinelMaster).Result()
			return err1 == nil && err2 == nil && len(replicas) == n && len(peers) == 2
		})
	}
	return top
}

// failoverRun is what one load run across a failover saw.
type failoverRun struct {
	calls, errs, readonly, skipped atomic.Int64 // skipped: refused by an open breaker
	// lateErrs are errors after the failover had settled: a client stuck on
	// the old primary, which answers READONLY at once. Apart from them,
	// calls that timed out then (lateTimeouts: their flight outlasted the
	// Throttler's Timeout, with the CPU starved, as lag shows, or Redis
	// slow) and calls a breaker those failures opened refused (lateSkipped).
	lateErrs, lateTimeouts, lateSkipped atomic.Int64
	lateFlight, lag                     atomic.Int64              // the late timeouts' longest flight; the process's timers' lateness after settling
	switched, replicated                time.Duration             // from the failover
	start                               time.Time                 // of the failover
	firstErr, lastErr                   atomic.Int64              // Unix ns; 0: none
	admitted                            map[string][]failoverUnit // by policy name and key
	late                                []string                  // the first errors after settling, for the log
}

// failoverUnit is one admitted Take: the instant its Throttler used, and
// its window's reset-at (the one a fixed window keeps).
type failoverUnit struct{ t, reset int64 }

// failoverLoad runs workers against 20 keys under a sliding log and a
// fixed window (50 per 2s each), fails the primary over to the replica
// after lead of load, and keeps the load on until the new primary has
// served for tail. Each worker has its own Throttler (a process of its
// own) whose clock it sets before each call, so that every admitted unit's
// instant is known exactly, and its own keys, so that each key's calls
// reach Redis in the order of their clocks: a log's Take drops the units
// that ended by its now, which a call with an earlier now arriving after
// it would still have counted, and a correct store would then seem to
// admit over the limit.
func failoverLoad(t *testing.T, top *sentinelTopology, opts *redis.Options) *failoverRun {
	const (
		workers = 16
		keys    = 20
		lead    = 3 * time.Second
		tail    = 3 * time.Second
		settle  = 3 * time.Second // after the replicas are back, before errors count as late
		maxRun  = 30 * time.Second
	)
	policies := []throttler.Policy{
		{Name: "fo-log", Limit: 50, Window: 2 * time.Second, Algorithm: throttler.SlidingLog},
		{Name: "fo-fw", Limit: 50, Window: 2 * time.Second},
	}
	rdb := goredis.NewFailoverClient(&goredis.FailoverOptions{
		MasterName: sentinelMaster, SentinelAddrs: top.sentinels,
		ContextTimeoutEnabled: true, DialTimeout: 2 * time.Second,
	})
	t.Cleanup(func() { rdb.Close() })
	b, err := redis.New(rdb, opts)
	require.NoError(t, err)

	run := &failoverRun{admitted: map[string][]failoverUnit{}}
	var (
		mu      sync.Mutex
		stop    atomic.Bool
		settled atomic.Bool
		wg      sync.WaitGroup
	)
	prefix := strconv.FormatInt(time.Now().UnixNano(), 36)
	for w := range workers {
		var now time.Time
		th, err := throttler.New(b, &throttler.Options{
			Clock: func() time.Time { return now }, Timeout: time.Second, FailClosed: true,
			Observe: func(o throttler.Observation) {
				if o.Err == nil {
					return
				}
				run.errs.Add(1)
				at := time.Now().UnixNano()
				run.firstErr.CompareAndSwap(0, at)
				run.lastErr.Store(at) // roughly the last: enough for a log line
				skipped := strings.Contains(o.Err.Error(), "breaker opened")
				if strings.Contains(o.Err.Error(), "READONLY") {
					run.readonly.Add(1)
				}
				if skipped {
					run.skipped.Add(1)
				}
				var timeout net.Error
				switch {
				case !settled.Load():
				case errors.As(o.Err, &timeout) && timeout.Timeout():
					run.lateTimeouts.Add(1)
					storeMax(&run.lateFlight, int64(o.Latency))
				case skipped:
					// The failures that opened the breaker are counted
					// each as what it is.
					run.lateSkipped.Add(1)
				default:
					if run.lateErrs.Add(1) <= 5 {
						mu.Lock()
						run.late = append(run.late, fmt.Sprintf("+%v %v", time.Since(run.start).Round(time.Millisecond), o.Err))
						mu.Unlock()
					}
				}
			},
		})
		require.NoError(t, err)
		wg.Go(func() {
			var mine []struct {
				id string
				u  failoverUnit
			}
			for i := 0; !stop.Load() && i < 200_000; i++ {
				// The worker's own (policy, key) pairs, in turn.
				k := w + workers*(i%((len(policies)*keys-w+workers-1)/workers))
				p := policies[k%len(policies)]
				key := prefix + "-" + strconv.Itoa(k/len(policies))
				now = time.Now()
				d, err := th.Allow(context.Background(), key, p)
				run.calls.Add(1)
				if err != nil {
					time.Sleep(10 * time.Millisecond) // as a client would back off, not to spin on an open breaker
				}
				if err == nil && d.Allowed {
					mine = append(mine, struct {
						id string
						u  failoverUnit
					}{p.Name + " " + key, failoverUnit{now.UnixMilli(), d.ResetAt.UnixMilli()}})
				}
			}
			mu.Lock()
			for _, m := range mine {
				run.admitted[m.id] = append(run.admitted[m.id], m.u)
			}
			mu.Unlock()
		})
	}
	deadline := time.AfterFunc(maxRun, func() { stop.Store(true) })
	defer deadline.Stop()

	time.Sleep(lead) // load before the failover, in real time: the servers' clocks run
	s := goredis.NewSentinelClient(&goredis.Options{Addr: top.sentinels[0]})
	defer s.Close()
	ctx := context.Background()
	start := time.Now()
	run.start = start
	require.NoError(t, s.Failover(ctx, sentinelMaster).Err())
	want := strconv.Itoa(top.replicas[0])
	waitFor(t, 20*time.Second, "the sentinels promoting the replica", func(ctx context.Context) bool {
		addr, err := s.GetMasterAddrByName(ctx, sentinelMaster).Result()
		return err == nil && len(addr) == 2 && addr[1] == want
	})
	run.switched = time.Since(start)
	// The sentinels turn the other replicas, and seconds later the old
	// primary, into replicas of the new one. Until one has synchronised,
	// the new primary has no replica to acknowledge a WAIT. Settled: all
	// have, and a breaker that opened meanwhile has had time to probe and
	// close: its cooldown (1s), and once more if that probe still failed
	// (a replica that is online acknowledges a WAIT only with its next
	// REPLCONF ACK; a probe may time out at the Throttler's 1s). A client
	// stuck on the old primary keeps failing after that, through the tail.
	primary := redisClient(t, "127.0.0.1:"+want)
	waitFor(t, 30*time.Second, "the old primary replicating the new one", func(ctx context.Context) bool {
		info, err := primary.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, fmt.Sprintf("connected_slaves:%d", len(top.replicas))) &&
			strings.Count(info, "state=online") == len(top.replicas)
	})
	run.replicated = time.Since(start)
	time.Sleep(settle)
	settled.Store(true)
	wg.Go(func() { // how late this process's timers fire through the tail
		for !stop.Load() {
			start := time.Now()
			time.Sleep(10 * time.Millisecond)
			storeMax(&run.lag, int64(time.Since(start)-10*time.Millisecond))
		}
	})
	time.Sleep(tail)
	stop.Store(true)
	wg.Wait()
	return run
}

// over is how many units a key's admitted Takes exceed its limit by: a
// sliding log's most units in any window-long span ((t-w, t], which a
// correct store never lets exceed the limit, whatever order the calls
// arrived in), a fixed window's units in each run of windows that overlap
// (a correct store opens a window only once the previous one has ended).
func over(p throttler.Policy, units []failoverUnit) int64 {
	w := p.Window.Milliseconds()
	var worst int64
	if p.Algorithm == throttler.SlidingLog {
		ts := make([]int64, len(units))
		for i, u := range units {
			ts[i] = u.t
		}
		slices.Sort(ts)
		lo := 0
		for hi, t := range ts {
			for ts[lo] <= t-w {
				lo++
			}
			worst = max(worst, int64(hi-lo+1)-p.Limit)
		}
		return max(worst, 0)
	}
	resets := make([]int64, len(units))
	for i, u := range units {
		resets[i] = u.reset
	}
	slices.Sort(resets)
	var total, n int64
	end := int64(-1 << 62)
	for _, r := range resets {
		if r-w >= end { // a window that starts after the run ends
			total += max(n-p.Limit, 0)
			n = 0
		}
		n++
		end = max(end, r)
	}
	return total + max(n-p.Limit, 0)
}

// TestRedisSentinelFailover fails a Sentinel topology's primary over to
// its replica (SENTINEL FAILOVER) under load through a FailoverClient.
// Redis replicates asynchronously: without WAIT, the units the old primary
// admits after the replica's promotion, until the client follows the
// switch, are lost, and the keys admit them again (logged: the bound
// docs/backends-redis.md states). With WaitReplicas equal to the number of
// replicas, a write that not all acknowledged fails instead: no key admits
// a unit over its limit in any window (with 1 of 2 replicas it still can:
// logged). In every case no client stays on the old primary (no error once
// the new primary has its replicas back). By default go-redis's retries
// absorb the connections the failover closes without opening any
// Throttler's breaker; with WAIT, breakers open by design while too few
// replicas acknowledge.
func TestRedisSentinelFailover(t *testing.T) {
	wait := func(n int) *redis.Options { return &redis.Options{WaitReplicas: n, WaitTimeout: 50 * time.Millisecond} }
	for _, tc := range []struct {
		name     string
		replicas int
		opts     *redis.Options
		exact    bool // no unit over the limit
	}{
		{"default", 1, nil, false},
		{"wait 1 of 1", 1, wait(1), true},
		// The replica that did not get promoted acknowledges the old
		// primary's writes until the sentinels move it: logged, not exact.
		{"wait 1 of 2", 2, wait(1), false},
		{"wait 2 of 2", 2, wait(2), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			top := sentinelStart(t, tc.replicas)
			run := failoverLoad(t, top, tc.opts)
			type tally struct{ keys, units, worst, admitted int64 }
			by := map[string]*tally{"fo-log": {}, "fo-fw": {}}
			for id, units := range run.admitted {
				name := id[:strings.IndexByte(id, ' ')]
				p := throttler.Policy{Name: name, Limit: 50, Window: 2 * time.Second}
				if name == "fo-log" {
					p.Algorithm = throttler.SlidingLog
				}
				tl := by[name]
				tl.admitted += int64(len(units))
				if o := over(p, units); o > 0 {
					tl.keys++
					tl.units += o
					tl.worst = max(tl.worst, o)
					if tc.exact {
						t.Errorf("%s: %d units over the limit", id, o)
					}
				}
			}
			for name, tl := range by {
				t.Logf("%s %s: %d admitted; %d of 20 keys over, %d units over in all, worst key %d over its 50",
					tc.name, name, tl.admitted, tl.keys, tl.units, tl.worst)
			}
			failing := "none"
			if f := run.firstErr.Load(); f != 0 {
				failing = fmt.Sprintf("from %v to %v after SENTINEL FAILOVER",
					time.Unix(0, f).Sub(run.start).Round(time.Millisecond), time.Unix(0, run.lastErr.Load()).Sub(run.start).Round(time.Millisecond))
			}
			t.Logf("%s: %d calls, master switched in %v, replicated again after %v; errors %d (READONLY %d, breaker-skipped %d, after settling %d), failing %s; "+
				"after settling, %d calls timed out (flights up to %v; this process's timers up to %v late), %d refused by the breakers they opened",
				tc.name, run.calls.Load(), run.switched.Round(time.Millisecond), run.replicated.Round(time.Millisecond),
				run.errs.Load(), run.readonly.Load(), run.skipped.Load(), run.lateErrs.Load(), failing,
				run.lateTimeouts.Load(), time.Duration(run.lateFlight.Load()).Round(time.Millisecond), time.Duration(run.lag.Load()).Round(time.Millisecond), run.lateSkipped.Load())
			assert.Len(t, run.admitted, 40, "every key admitted")
			assert.Zero(t, run.lateErrs.Load(), "errors once the failover settled: a client stuck on the old primary; the first: %q", run.late)
			if tc.opts == nil {
				assert.Zero(t, run.skipped.Load(), "calls refused by an open breaker")
			}
		})
	}
}
