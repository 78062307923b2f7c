package integration

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/moby/client"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/testcontainers/testcontainers-go"

	"github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/throttler"
)

// clusterTimeout is the Throttler's Timeout in these tests: above the
// 100 ms default, so that a stall of this host's CPUs (shared by every
// container and the test's 16 or 32 workers) is not taken for a store's.
const clusterTimeout = 500 * time.Millisecond

// A Redis Cluster on a bad day is a store per master. One master paused for
// 3 s under load: the keys it serves fail open (Degraded, the default
// failure mode) until its breaker opens, and every key served by the other
// masters is decided by them throughout: 0 Degraded, and each key admitted
// exactly its Limit, which is what the store counted.
func TestRedisClusterPausedMaster(t *testing.T) {
	addrs := redisCluster(t, 3)
	cc := redisClusterClient(t, addrs)
	b := redisNew(t, cc, &redis.Options{Prefix: "paused:"})
	ctx := context.Background()
	require.NoError(t, b.Check(ctx), "every node answers PING")

	// One window for the whole test: the clock stands at redisT0.
	p := throttler.Policy{Name: "api", Limit: 40, Window: time.Hour}
	const workers, nKeys = 16, 48
	keys := make([]string, nKeys)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	owner := clusterOwners(t, addrs, "paused:", keys, func(k string) {
		_, err := b.Take(ctx, k, p, 1, redisT0)
		require.NoError(t, err)
	})
	paused := owner[keys[0]]

	type tally struct{ store, admitted, degraded atomic.Int64 }
	var byKey [nKeys]tally
	index := map[string]int{}
	for i, k := range keys {
		index[k] = i
	}
	th, err := throttler.New(b, &throttler.Options{
		Clock:   func() time.Time { return redisT0 },
		Timeout: clusterTimeout,
		Observe: func(o throttler.Observation) {
			k := &byKey[index[o.Key]]
			switch {
			case o.Decision.Degraded:
				k.degraded.Add(1)
			case o.Source == throttler.SourcePrimary:
				k.store.Add(1)
				if o.Decision.Allowed {
					k.admitted.Add(1)
				}
			}
		},
	})
	require.NoError(t, err)

	var stop atomic.Bool
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; !stop.Load(); i++ {
				_, _ = th.Allow(ctx, keys[i%nKeys], p)
			}
		})
	}
	defer func() { stop.Store(true); wg.Wait() }()

	time.Sleep(200 * time.Millisecond) // load on the healthy Cluster
	pauseClusterNode(t, addrs[paused])
	time.Sleep(3 * time.Second)
	unpauseClusterNode(t, addrs[paused])
	time.Sleep(1500 * time.Millisecond) // the paused master's breaker closes again
	stop.Store(true)
	wg.Wait()

	var calls, pausedDegraded, degraded int64
	for i, k := range keys {
		x := &byKey[i]
		calls += x.store.Load() + x.degraded.Load()
		if owner[k] == paused {
			pausedDegraded += x.degraded.Load()
			continue
		}
		degraded += x.degraded.Load()
		used, err := b.Peek(ctx, k, p, redisT0)
		require.NoError(t, err)
		// The warm-up Take counted one unit outside the Throttler.
		if x.degraded.Load() != 0 || x.admitted.Load()+1 != p.Limit || used.Used != p.Limit {
			t.Errorf("%s on %s: %d Degraded, %d admitted by the store (+1 warm-up), Used %d; want 0, %d, %d",
				k, addrs[owner[k]], x.degraded.Load(), x.admitted.Load(), used.Used, p.Limit-1, p.Limit)
		}
	}
	t.Logf("%s paused for 3s: %d calls; %d Degraded on its keys, %d on the other masters' keys",
		addrs[paused], calls, pausedDegraded, degraded)
	if pausedDegraded == 0 {
		t.Errorf("no call on the paused master's keys failed: it was never paused under load")
	}
}

// One slot in a move, and every other key limited as usual. 16 workers on
// one client key (a composite of a short and a long window, TagByKey)
// whose long window is spent, so the short member's key expires while the
// long one lives; 16 others on 48 other keys. Only the hot key's slot
// migrates, as redis-cli's reshard moves it (IMPORTING, MIGRATING, held
// with the key on the source, MIGRATE, held with it on the target, SETSLOT
// NODE), and back. All the while the hot key's composite finds one of its
// keys missing (TRYAGAIN). The hot key's calls are retried within the
// Timeout, then answered by the failure mode for that key alone: no key of
// another slot is ever answered by the failure mode, and no member's window
// admits more than its Limit among the store's decisions. The same holds
// failing closed: no key of another slot is refused.
func TestRedisClusterHotSlotMoving(t *testing.T) {
	addrs := redisCluster(t, 3)
	ctx := context.Background()
	nodes := make([]*goredis.Client, len(addrs))
	ids := make([]string, len(addrs))
	for i, a := range addrs {
		nodes[i] = redisClient(t, a)
		id, err := nodes[i].Do(ctx, "CLUSTER", "MYID").Text()
		require.NoError(t, err)
		ids[i] = id
	}
	cc := redisClusterClient(t, addrs)
	t.Run("FailOpen", func(t *testing.T) { hotSlotCampaign(t, cc, nodes, addrs, ids, "open:", false) })
	t.Run("FailClosed", func(t *testing.T) { hotSlotCampaign(t, cc, nodes, addrs, ids, "closed:", true) })
}

// hotSlotCampaign is TestRedisClusterHotSlotMoving's run, its keys under
// prefix, with the failure mode failClosed.
func hotSlotCampaign(t *testing.T, cc *goredis.ClusterClient, nodes []*goredis.Client, addrs, ids []string,
	prefix string, failClosed bool) {
	ctx := context.Background()
	// Keys expire 20 ms after their window: the short member's soon after
	// the long window stops admitting.
	b := redisNew(t, cc, &redis.Options{Prefix: prefix, TagByKey: true, ExpiryMargin: 20 * time.Millisecond})
	require.NoError(t, b.Check(ctx), "every node answers PING")

	short := throttler.Policy{Name: "short", Limit: 5, Window: 100 * time.Millisecond}
	long := throttler.Policy{Name: "long", Limit: 10, Window: time.Hour}
	c := throttler.All(short, long)
	const hot = "hot"
	others := make([]string, 48)
	for i := range others {
		others[i] = "other-" + strconv.Itoa(i)
	}
	owner := clusterOwners(t, addrs, prefix, append([]string{hot}, others...), func(k string) {
		_, err := b.Take(ctx, k, c, 1, time.Now())
		require.NoError(t, err)
	})
	slot := clusterSlotOf(t, nodes[owner[hot]], prefix, hot)
	for _, k := range others {
		if clusterSlotOf(t, nodes[owner[k]], prefix, k) == slot {
			t.Fatalf("%s shares the hot key's slot %d: pick other names", k, slot)
		}
	}

	type admission struct{ short, long int64 } // each member's window, by its reset-at
	var (
		mu        sync.Mutex
		admitted  = map[string][]admission{}
		failedHot atomic.Int64 // the hot key's calls answered by the failure mode
		failedOut atomic.Int64 // other keys' calls answered so
		calls     atomic.Int64
		errs      sync.Map // the other keys' errors, each with its key and when
		hotErrs   sync.Map // the hot key's errors, without key and policy, each with when
	)
	start := time.Now()
	th, err := throttler.New(b, &throttler.Options{
		Timeout:    clusterTimeout,
		FailClosed: failClosed,
		Observe: func(o throttler.Observation) {
			calls.Add(1)
			switch {
			case o.Source == throttler.SourceFailureMode && o.Key == hot:
				failedHot.Add(1)
				msg := fmt.Sprint(o.Err)
				msg = msg[strings.LastIndex(msg, "): ")+1:]
				hotErrs.LoadOrStore(msg, time.Now())
			case o.Source == throttler.SourceFailureMode:
				failedOut.Add(1)
				errs.LoadOrStore(fmt.Sprint(o.Err), fmt.Sprint(o.Key, " at ", time.Since(start)))
			case o.Source == throttler.SourcePrimary && o.Decision.Allowed:
				var a admission
				for i, m := range o.Decision.Members() {
					if i == 0 {
						a.short = m.ResetAt.UnixMilli()
					} else {
						a.long = m.ResetAt.UnixMilli()
					}
				}
				mu.Lock()
				admitted[o.Key] = append(admitted[o.Key], a)
				mu.Unlock()
			}
		},
	})
	require.NoError(t, err)

	var stop atomic.Bool
	var wg sync.WaitGroup
	var stall atomic.Int64 // the longest this process went without running a 5 ms ticker
	wg.Go(func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		last := time.Now()
		for !stop.Load() {
			now := <-tick.C
			if gap := now.Sub(last); gap > time.Duration(stall.Load()) {
				stall.Store(int64(gap))
			}
			last = now
		}
	})
	for w := range 32 {
		wg.Go(func() {
			for i := w; !stop.Load(); i++ {
				key := hot
				if w%2 == 1 {
					key = others[i%len(others)]
				}
				_, _ = th.Allow(ctx, key, c)
			}
		})
	}
	defer func() { stop.Store(true); wg.Wait() }()

	// The hot key spends its long window at once; its short member's key
	// then expires.
	time.Sleep(500 * time.Millisecond)
	from := owner[hot]
	to := (from + 1) % len(nodes)
	moved := time.Now()
	moveSlotSlowly(t, nodes, addrs, ids, slot, from, to)
	moveSlotSlowly(t, nodes, addrs, ids, slot, to, from)
	took := time.Since(moved)
	time.Sleep(300 * time.Millisecond)
	stop.Store(true)
	wg.Wait()

	var over int64
	where := ""
	for k, adm := range admitted {
		inShort, inLong := map[int64]int64{}, map[int64]int64{}
		for _, a := range adm {
			if inShort[a.short]++; inShort[a.short] > short.Limit {
				over++
				where = fmt.Sprintf("%s: short window ending %d", k, a.short)
			}
			if inLong[a.long]++; inLong[a.long] > long.Limit {
				over++
				where = fmt.Sprintf("%s: long window ending %d", k, a.long)
			}
		}
	}
	t.Logf("slot %d from %s to %s and back in %v: %d calls, the hot key's %d answered by the failure mode, other keys' %d; longest stall of this process %v",
		slot, addrs[from], addrs[to], took.Round(time.Millisecond), calls.Load(), failedHot.Load(), failedOut.Load(),
		time.Duration(stall.Load()).Round(time.Millisecond))
	hotErrs.Range(func(err, at any) bool {
		t.Logf("hot at %v: %s", at.(time.Time).Sub(start), err)
		return true
	})
	if failedOut.Load() != 0 {
		errs.Range(func(err, key any) bool {
			t.Logf("e.g. %s: %s", key, err)
			return true
		})
		t.Errorf("%d calls on keys whose slot never moved were answered by the failure mode, want 0", failedOut.Load())
	}
	if failedHot.Load() == 0 {
		t.Errorf("no call on the hot key failed: its slot never refused the composite (TRYAGAIN)")
	}
	if over > 0 {
		t.Errorf("%d units admitted by the store over a member's Limit; the last: %s", over, where)
	}
}

// moveSlotSlowly moves slot from node from to node to as reshardSlot does,
// holding it 700 ms MIGRATING with its keys on the source, then 300 ms with
// them on the target before the slot is the target's.
func moveSlotSlowly(t *testing.T, nodes []*goredis.Client, addrs, ids []string, slot int64, from, to int) {
	t.Helper()
	ctx := context.Background()
	do := func(i int, args ...any) {
		t.Helper()
		if err := nodes[i].Do(ctx, args...).Err(); err != nil {
			t.Fatalf("%v on %s: %v", args, addrs[i], err)
		}
	}
	do(to, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[from])
	do(from, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to])
	time.Sleep(700 * time.Millisecond)
	host, port, err := net.SplitHostPort(addrs[to])
	require.NoError(t, err)
	for {
		keys, err := nodes[from].ClusterGetKeysInSlot(ctx, int(slot), 100).Result()
		require.NoError(t, err)
		if len(keys) == 0 {
			break
		}
		do(from, append([]any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}, anys(keys)...)...)
	}
	time.Sleep(300 * time.Millisecond)
	for _, i := range append([]int{to, from}, others(len(nodes), from, to)...) {
		do(i, "CLUSTER", "SETSLOT", slot, "NODE", ids[to])
	}
}

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// others are the indexes below n but a and b.
func others(n, a, b int) []int {
	var out []int
	for i := range n {
		if i != a && i != b {
			out = append(out, i)
		}
	}
	return out
}

// clusterOwners writes each key once (write) and returns the index in addrs
// of the master that holds it, from the keys each master holds under
// prefix (a storage key ends with ":" and the client key).
func clusterOwners(t *testing.T, addrs []string, prefix string, keys []string, write func(key string)) map[string]int {
	t.Helper()
	ctx := context.Background()
	for _, k := range keys {
		write(k)
	}
	owner := map[string]int{}
	for i, a := range addrs {
		stored, err := redisClient(t, a).Keys(ctx, prefix+"*").Result()
		require.NoError(t, err)
		for _, sk := range stored {
			owner[sk[strings.LastIndexByte(sk, ':')+1:]] = i
		}
	}
	for _, k := range keys {
		if _, ok := owner[k]; !ok {
			t.Fatalf("no master holds %s", k)
		}
	}
	return owner
}

// clusterSlotOf is the slot of key's storage keys under prefix on node n.
func clusterSlotOf(t *testing.T, n *goredis.Client, prefix, key string) int64 {
	t.Helper()
	ctx := context.Background()
	stored, err := n.Keys(ctx, prefix+"*:"+key).Result()
	require.NoError(t, err)
	require.NotEmpty(t, stored, "%s on %s", key, n.Options().Addr)
	slot, err := n.ClusterKeySlot(ctx, stored[0]).Result()
	require.NoError(t, err)
	return slot
}

// pauseClusterNode freezes the container of the Cluster node at addr
// (redisCluster starts one per port) until unpauseClusterNode; the test's
// cleanup unpauses it so that it can be terminated.
func pauseClusterNode(t *testing.T, addr string) {
	t.Helper()
	cli, id := clusterNodeContainer(t, addr)
	defer cli.Close()
	_, err := cli.ContainerPause(context.Background(), id, client.ContainerPauseOptions{})
	require.NoError(t, err, "pause %s", addr)
	t.Cleanup(func() { unpauseClusterNode(t, addr) })
}

func unpauseClusterNode(t *testing.T, addr string) {
	t.Helper()
	cli, id := clusterNodeContainer(t, addr)
	defer cli.Close()
	if _, err := cli.ContainerUnpause(context.Background(), id, client.ContainerUnpauseOptions{}); err != nil &&
		!strings.Contains(err.Error(), "not paused") {
		t.Errorf("unpause %s: %v", addr, err)
	}
}

// clusterNodeContainer finds the container of the Cluster node at addr by
// the port in its command ("--port <port>").
func clusterNodeContainer(t *testing.T, addr string) (*testcontainers.DockerClient, string) {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	cli, err := testcontainers.NewDockerClientWithOpts(context.Background())
	require.NoError(t, err)
	list, err := cli.ContainerList(context.Background(), client.ContainerListOptions{})
	require.NoError(t, err)
	for _, c := range list.Items {
		if strings.Contains(c.Command+" ", "--port "+port+" ") {
			return cli, c.ID
		}
	}
	cli.Close()
	t.Fatalf("no container runs the Cluster node on port %s", port)
	return nil, ""
}
