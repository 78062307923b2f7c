package integration

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/throttler"
)

// A reshard moves a Cluster's slots one at a time: the slot is set
// IMPORTING on the target and MIGRATING on the source, its keys are moved
// with MIGRATE, and the target is made its owner. Meanwhile a command on
// the source for a key it still holds runs there, one for a key it no
// longer holds is redirected (ASK), and after the move every node answers
// MOVED. Under load on every algorithm, with short windows so that keys go
// idle between Takes (a log whose units have all ended: the case that
// failed), the slots holding the test's keys go from three masters to a
// fourth and back. Every Take is answered (0 errors) and no key is
// admitted more than its algorithm's bound over its recorded Takes.
func TestRedisClusterReshard(t *testing.T) {
	addrs := redisClusterOwned(t, 4, 3)
	ctx := context.Background()
	nodes := make([]*goredis.Client, len(addrs))
	ids := make([]string, len(addrs))
	for i, a := range addrs {
		nodes[i] = redisClient(t, a)
		id, err := nodes[i].Do(ctx, "CLUSTER", "MYID").Text()
		require.NoError(t, err)
		ids[i] = id
	}
	for i, n := range nodes { // SETSLOT NODE needs every node to know the others as masters
		waitFor(t, time.Minute, "4 masters known to "+addrs[i], func(ctx context.Context) bool {
			out, err := n.ClusterNodes(ctx).Result()
			return err == nil && strings.Count(out, "master") == len(nodes) && !strings.Contains(out, "handshake")
		})
	}
	// go-redis's own retries on (MaxRetries left as is): the backend's
	// scripts must run once whatever the client re-sends.
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { cc.Close() })
	b := redisNew(t, cc, &redis.Options{Prefix: "reshard:"})
	require.NoError(t, b.Check(ctx), "every node answers PING")

	// A worker visits its keys in turn and makes a burst of Takes on each,
	// more than its Limit: every burst meets the bound, and between two
	// visits (its other keys' bursts) a key's units have all ended.
	const window = 50 * time.Millisecond
	policies := []throttler.Policy{
		{Name: "fixed", Limit: 3, Window: window, Algorithm: throttler.FixedWindow},
		{Name: "bucket", Limit: 3, Window: window, Algorithm: throttler.TokenBucket},
		{Name: "counter", Limit: 3, Window: window, Algorithm: throttler.SlidingWindow},
		{Name: "log", Limit: 3, Window: window, Algorithm: throttler.SlidingLog},
	}
	const workers, keysPerPolicy, burst = 16, 48, 5
	type admission struct{ t, reset int64 }
	type series struct {
		p   throttler.Policy
		key string
		adm []admission // this worker's alone: no lock
	}
	var all [workers][]*series
	for w := range workers {
		for _, p := range policies {
			for k := w; k < keysPerPolicy; k += workers {
				all[w] = append(all[w], &series{p: p, key: fmt.Sprint("key-", k)})
			}
		}
	}
	var calls, admitted, failed atomic.Int64
	// A failure's flight tells a call starved past its timeout from one
	// that kept meeting the move.
	type failures struct {
		n       int
		longest time.Duration
	}
	var errMu sync.Mutex
	errs := map[string]*failures{}
	var longest [workers]time.Duration // each worker's longest Take
	var stop atomic.Bool
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for !stop.Load() {
				for i := 0; i < len(all[w])*burst && !stop.Load(); i++ {
					s := all[w][i/burst]
					now := time.Now()
					callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
					d, err := b.Take(callCtx, s.key, s.p, 1, now)
					cancel()
					flight := time.Since(now)
					longest[w] = max(longest[w], flight)
					calls.Add(1)
					switch {
					case err != nil:
						failed.Add(1)
						msg := err.Error()
						if i := strings.Index(msg, "): "); i >= 0 {
							msg = msg[i+3:] // without the key and policy
						}
						errMu.Lock()
						f := errs[s.p.Algorithm.String()+": "+msg]
						if f == nil {
							f = &failures{}
							errs[s.p.Algorithm.String()+": "+msg] = f
						}
						f.n, f.longest = f.n+1, max(f.longest, flight)
						errMu.Unlock()
					case d.Allowed:
						admitted.Add(1)
						s.adm = append(s.adm, admission{now.UnixMilli(), d.ResetAt.UnixMilli()})
					}
				}
			}
		})
	}
	defer func() { stop.Store(true); wg.Wait() }() // also when a check below fails

	time.Sleep(300 * time.Millisecond) // every key written once at least
	// The slots that hold the test's keys, and their owners.
	owner := map[int64]int{}
	for i, n := range nodes[:3] {
		keys, err := n.Keys(ctx, "reshard:*").Result()
		require.NoError(t, err)
		for _, k := range keys {
			slot, err := n.ClusterKeySlot(ctx, k).Result()
			require.NoError(t, err)
			owner[slot] = i
		}
	}
	slots := make([]int64, 0, len(owner))
	for s := range owner {
		slots = append(slots, s)
	}
	sort.Slice(slots, func(i, j int) bool { return slots[i] < slots[j] })
	start := time.Now()
	for _, s := range slots {
		reshardSlot(t, nodes, addrs, ids, s, owner[s], 3)
	}
	for _, s := range slots {
		reshardSlot(t, nodes, addrs, ids, s, 3, owner[s])
	}
	took := time.Since(start)
	time.Sleep(100 * time.Millisecond) // load on the settled cluster
	stop.Store(true)
	wg.Wait()

	var over, worst int64
	where := ""
	for w := range all {
		for _, s := range all[w] {
			if s.p.Algorithm == throttler.FixedWindow {
				// A fixed window opens at its first Take: count by the
				// window each admission was counted in.
				in := map[int64]int64{}
				for _, a := range s.adm {
					if in[a.reset]++; in[a.reset] > s.p.Limit {
						over++
						where = fmt.Sprintf("%s %s: window ending %d", s.p.Name, s.key, a.reset)
					}
				}
				continue
			}
			adm := make([]rampAdmission, len(s.adm))
			for i, a := range s.adm {
				adm[i] = rampAdmission{t: a.t, cost: 1}
			}
			bound := map[throttler.Algorithm]rampBound{
				throttler.TokenBucket: rampBucketBound, throttler.SlidingWindow: rampWindowBound, throttler.SlidingLog: rampLogBound,
			}[s.p.Algorithm]
			if x := bound(s.p, adm); x.over() > 0 {
				over += x.over()
				if x.over() > worst {
					worst, where = x.over(), fmt.Sprintf("%s %s: %d units in [%d, %d], at most %d", s.p.Name, s.key, x.units, x.from, x.to, x.most)
				}
			}
		}
	}
	t.Logf("%d slots to the fourth master and back in %v under load: %d Takes, %d admitted, %d failed, the longest Take %v",
		len(slots), took.Round(time.Millisecond), calls.Load(), admitted.Load(), failed.Load(), slices.Max(longest[:]).Round(time.Millisecond))
	for msg, f := range errs {
		t.Errorf("%d Takes failed, the longest after %v: %s", f.n, f.longest.Round(time.Millisecond), msg)
	}
	if over > 0 {
		t.Errorf("%d units admitted over the limit; the worst: %s", over, where)
	}
}

// reshardSlot moves slot from node from to node to as redis-cli's reshard
// does, holding it a while MIGRATING with its keys still on the source,
// and a while with them moved (the source then answers ASK), so that the
// load meets both states.
func reshardSlot(t *testing.T, nodes []*goredis.Client, addrs, ids []string, slot int64, from, to int) {
	t.Helper()
	ctx := context.Background()
	do := func(i int, args ...any) {
		if err := nodes[i].Do(ctx, args...).Err(); err != nil {
			t.Fatalf("%v on %s: %v", args, addrs[i], err)
		}
	}
	do(to, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[from])
	do(from, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to])
	time.Sleep(10 * time.Millisecond)
	host, port, err := net.SplitHostPort(addrs[to])
	require.NoError(t, err)
	for {
		keys, err := nodes[from].ClusterGetKeysInSlot(ctx, int(slot), 100).Result()
		require.NoError(t, err)
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		do(from, args...)
	}
	time.Sleep(3 * time.Millisecond)
	do(to, "CLUSTER", "SETSLOT", slot, "NODE", ids[to])
	do(from, "CLUSTER", "SETSLOT", slot, "NODE", ids[to])
	for i := range nodes {
		if i != from && i != to {
			do(i, "CLUSTER", "SETSLOT", slot, "NODE", ids[to])
		}
	}
}
