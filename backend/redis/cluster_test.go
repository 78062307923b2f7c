package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/throttler"
)

// twoMasters starts a Redis Cluster of two masters on redis-server
// binaries, the first serving slots 0-8191 and the second 8192-16383, and
// returns a ClusterClient of it, each master's own client and its ID.
func twoMasters(t testing.TB) (cc *goredis.ClusterClient, nodes [2]*goredis.Client, ids [2]string) {
	t.Helper()
	ctx := context.Background()
	var ports [2]int
	for i := range nodes {
		nodes[i], ports[i] = startRedis(t, "--cluster-enabled", "yes")
		lo, hi := i*clusterSlots/2, (i+1)*clusterSlots/2-1
		if err := nodes[i].Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			t.Fatal(err)
		}
		id, err := nodes[i].Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	if err := nodes[0].ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(ports[1])).Err(); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ { // the handshake and gossip, not the clock
		ok := true
		for _, n := range nodes {
			info, err := n.ClusterInfo(ctx).Result()
			ok = ok && err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, "cluster_known_nodes:2")
		}
		if ok {
			break
		} else if i == 500 {
			t.Fatal("the two masters never formed a cluster")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cc = goredis.NewClusterClient(&goredis.ClusterOptions{
		Addrs: []string{nodes[0].Options().Addr}, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = cc.Close() })
	return cc, nodes, ids
}

// Redis's own examples of its hash slots (the Cluster specification), and
// the backend's keys: keySlot and hashSlot give the slot Redis computes
// (CLUSTER KEYSLOT).
func TestKeySlot(t *testing.T) {
	for _, c := range []struct {
		key  string
		slot uint16
	}{
		{"123456789", 0x31c3 % clusterSlots},
		{"foo", 12182},
		{"{user1000}.following", 3443},
		{"{user1000}.followers", 3443},
		{"foo{}{bar}", crc16("foo{}{bar}") % clusterSlots},
		{"foo{{bar}}zap", crc16("{bar") % clusterSlots},
		{"foo{bar}{zap}", crc16("bar") % clusterSlots},
	} {
		if got := keySlot(c.key); got != c.slot {
			t.Errorf("keySlot(%q) = %d, want %d", c.key, got, c.slot)
		}
	}
	srv, _ := startRedis(t, "--cluster-enabled", "yes")
	ctx := context.Background()
	for _, byKey := range []bool{false, true} {
		b := newBackend(t, srv, &Options{TagByKey: byKey})
		for i := range 200 {
			p := throttler.Policy{Name: "p" + strconv.Itoa(i%3), Limit: 1, Window: time.Second}
			sk, h := b.keyOf(p, "key-"+strconv.Itoa(i))
			want, err := srv.ClusterKeySlot(ctx, sk).Result()
			if err != nil {
				t.Fatal(err)
			}
			if got := keySlot(sk); int64(got) != want {
				t.Fatalf("keySlot(%q) = %d, Redis says %d", sk, got, want)
			}
			if got := hashSlot(h, byKey); int64(got) != want {
				t.Fatalf("hashSlot of %q (TagByKey %v) = %d, Redis says %d", sk, byKey, got, want)
			}
		}
	}
}

// A Cluster is a store per master: Traits().Store names the master that
// serves the key's slot, for every op and for leases, once the slot map is
// loaded (until then the Cluster as a whole, "redis"), and a reshard
// renames a moved slot's keys at the next load.
func TestClusterStorePerMaster(t *testing.T) {
	cc, nodes, ids := twoMasters(t)
	b := newBackend(t, cc, &Options{TagByKey: true})
	tr := b.Traits()
	m := b.shards[0].cluster
	p := throttler.Policy{Name: "api", Limit: 10, Window: time.Second}
	lease := throttler.ConcurrencyPolicy{Name: "jobs", Limit: 2, TTL: time.Second}
	if got := tr.Store(throttler.OpTake, "k", p); got != "redis" && m.table.Load() == nil {
		t.Errorf("before the slot map loads: %q, want redis", got)
	}
	m.load()
	names := [2]string{masterName(nodes[0].Options().Addr), masterName(nodes[1].Options().Addr)}
	ctx := context.Background()
	seen := map[string]int{}
	for i := range 64 {
		key := "key-" + strconv.Itoa(i)
		sk, _ := b.keyOf(p, key)
		slot, err := cc.ClusterKeySlot(ctx, sk).Result()
		if err != nil {
			t.Fatal(err)
		}
		want := names[slot*2/clusterSlots]
		for _, op := range []throttler.Op{throttler.OpTake, throttler.OpPeek, throttler.OpRefund} {
			if got := tr.Store(op, key, p); got != want {
				t.Fatalf("%v %s (slot %d): %q, want %q", op, key, slot, got, want)
			}
		}
		if got := tr.Store(throttler.OpTake, key, throttler.All(p, throttler.Policy{Name: "day", Limit: 100, Window: 24 * time.Hour})); got != want {
			t.Errorf("a composite on %s: %q, want %q", key, got, want)
		}
		if got := tr.LeaseStore(key, lease); got != want {
			t.Errorf("leases of %s: %q, want %q", key, got, want)
		}
		seen[want]++
	}
	if len(seen) != 2 {
		t.Errorf("64 keys named %v, want both masters", seen)
	}

	// Move the first key's slot to the other master; the next load names it.
	sk, _ := b.keyOf(p, "key-0")
	slot := keySlot(sk)
	from := int(slot) * 2 / clusterSlots
	for i := range nodes {
		if err := nodes[i].Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", ids[1-from]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	m.load()
	if got := tr.Store(throttler.OpTake, "key-0", p); got != names[1-from] {
		t.Errorf("after its slot moved: %q, want %q", got, names[1-from])
	}
	if got := tr.Store(throttler.OpTake, "key-0", p); got != names[1-from] {
		t.Errorf("after its slot moved: %q, want %q", got, names[1-from])
	}
}

// Store allocates nothing and does no I/O: it runs before every call.
func TestClusterStoreAllocs(t *testing.T) {
	cc, _, _ := twoMasters(t)
	b := newBackend(t, cc, nil)
	b.shards[0].cluster.load()
	tr := b.Traits()
	p := throttler.Policy{Name: "api", Limit: 10, Window: time.Second}
	if n := testing.AllocsPerRun(100, func() { tr.Store(throttler.OpTake, "some-key", p) }); n != 0 {
		t.Errorf("Store: %v allocations per call, want 0", n)
	}
}

// A slot in a move is its key's condition. A composite whose members' keys
// the move split is refused before it runs (TRYAGAIN) for as long as the
// slot migrates: the call is tried again within its deadline, then fails
// as the key's failure (throttler.ErrKeyState), never as its master's
// (ErrUnavailable). A Throttler over it answers
// that key by its failure mode and keeps deciding every other key, on the
// same master included, from the store: no breaker opens.
func TestClusterSlotInAMove(t *testing.T) {
	cc, nodes, ids := twoMasters(t)
	b := newBackend(t, cc, &Options{TagByKey: true})
	b.shards[0].cluster.load()
	ctx := context.Background()
	short := throttler.Policy{Name: "minute", Limit: 5, Window: time.Minute}
	long := throttler.Policy{Name: "hour", Limit: 100, Window: time.Hour}
	c := throttler.All(short, long)
	if _, err := b.Take(ctx, "hot", c, 1, t0); err != nil {
		t.Fatal(err)
	}
	// The hot key's slot migrates from its master; its short member's key
	// has moved, the long one's not yet.
	shortKey, _ := b.keyOf(short, "hot")
	slot := keySlot(shortKey)
	from := int(slot) * 2 / clusterSlots
	to := 1 - from
	must := func(i int, args ...any) {
		t.Helper()
		if err := nodes[i].Do(ctx, args...).Err(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	must(to, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[from])
	must(from, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to])
	host, port, _ := strings.Cut(nodes[to].Options().Addr, ":")
	must(from, "MIGRATE", host, port, shortKey, 0, 5000)

	callCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := b.Take(callCtx, "hot", c, 1, t0)
	cancel()
	if !errors.Is(err, throttler.ErrKeyState) || errors.Is(err, throttler.ErrUnavailable) ||
		!strings.Contains(fmt.Sprint(err), "TRYAGAIN") {
		t.Errorf("a composite split by the move: %v; want the key's failure (ErrKeyState), TRYAGAIN", err)
	}

	var degraded []string
	// A Timeout this host's stalls under -race never reach: only the slot
	// may fail these calls.
	th, err := throttler.New(b, &throttler.Options{Clock: func() time.Time { return t0 }, BreakerThreshold: 2,
		Timeout: 500 * time.Millisecond,
		Observe: func(o throttler.Observation) {
			if o.Err != nil {
				degraded = append(degraded, fmt.Sprintf("%s: %v", o.Key, o.Err))
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		d, err := th.Allow(ctx, "hot", c)
		if err != nil || !d.Degraded || !d.Allowed {
			t.Errorf("the hot key: %+v, %v; want failed open", d, err)
		}
	}
	// A key of another slot on the hot key's master, and one on the other.
	for _, key := range []string{sameMaster(t, b, from), sameMaster(t, b, to)} {
		d, err := th.Allow(ctx, key, c)
		if err != nil || d.Degraded || !d.Allowed || d.Remaining != 4 {
			t.Errorf("%s, beside the hot key's failures: %+v, %v; want decided by the store", key, d, err)
		}
	}
	if len(degraded) != 3 {
		t.Errorf("observed failures: %d, want the hot key's 3: %q", len(degraded), degraded)
	}

	// The move ends; the hot key is decided by the store again.
	must(from, "MIGRATE", host, port, "", 0, 5000, "KEYS", mustKey(b, long, "hot"))
	for i := range nodes {
		must(i, "CLUSTER", "SETSLOT", slot, "NODE", ids[to])
	}
	d, err := th.Allow(ctx, "hot", c)
	if err != nil || d.Degraded || d.Remaining != 3 {
		t.Errorf("the hot key after the move: %+v, %v; want decided by the store, Remaining 3", d, err)
	}
}

// sameMaster is a client key, other than the test's hot key's slot, on
// master i of twoMasters.
func sameMaster(t *testing.T, b *Backend, i int) string {
	t.Helper()
	p := throttler.Policy{Name: "minute", Limit: 5, Window: time.Minute}
	hot, _ := b.keyOf(p, "hot")
	for n := 0; n < 1000; n++ {
		key := "other-" + strconv.Itoa(n)
		sk, _ := b.keyOf(p, key)
		if s := keySlot(sk); int(s)*2/clusterSlots == i && s != keySlot(hot) {
			return key
		}
	}
	t.Fatal("no key on that master")
	return ""
}

func mustKey(b *Backend, p throttler.Policy, key string) string {
	sk, _ := b.keyOf(p, key)
	return sk
}

// settle tries a call again while its slot is moving, within its deadline,
// and leaves every other outcome alone: at the deadline the error is the
// slot's (a key's failure), never the deadline's.
func TestSettle(t *testing.T) {
	moving := fmt.Errorf("redis master x: %w", replyError("TRYAGAIN Multiple keys request during rehashing of slot"))
	down := fmt.Errorf("redis master x: %w", replyError("LOADING Redis is loading the dataset in memory"))
	for _, c := range []struct {
		name    string
		replies []error // the tries' outcomes; the last repeats
		budget  time.Duration
		tries   int // exactly; at least while the slot is still moving
		want    error
	}{
		{"answered at once", []error{nil}, time.Second, 1, nil},
		{"the move ends", []error{moving, moving, moving, nil}, time.Second, 4, nil},
		{"another failure", []error{down}, time.Second, 1, down},
		{"the slot's failure, then another", []error{moving, down}, time.Second, 2, down},
		{"still moving at the deadline", []error{moving}, 100 * time.Millisecond, 6, moving},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := &masters{}
			ctx, cancel := context.WithTimeout(context.Background(), c.budget)
			defer cancel()
			n := 0
			err := m.settle(ctx, func(context.Context) error {
				n++
				return c.replies[min(n, len(c.replies))-1]
			})
			if !errors.Is(err, c.want) || (err == nil) != (c.want == nil) {
				t.Errorf("settle: %v, want %v", err, c.want)
			}
			if c.want == moving && n < c.tries || c.want != moving && n != c.tries {
				t.Errorf("%d tries, want %d", n, c.tries)
			}
		})
	}
}

// replyError is an error reply of Redis, as go-redis gives one (goredis.Error).
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// What naming a Cluster call's master costs a Throttler before every call
// (the key's hash, its slot and the map's entry), beside naming the shard of
// two (the same hash, then jump hashing): go test -bench ClusterStore.
func BenchmarkClusterStore(b *testing.B) {
	cc, nodes, _ := twoMasters(b)
	cluster, err := New(cc, &Options{TagByKey: true})
	if err != nil {
		b.Fatal(err)
	}
	cluster.shards[0].cluster.load()
	shards, err := NewSharded([]Shard{{Primary: nodes[0]}, {Primary: nodes[1]}}, &Options{TagByKey: true})
	if err != nil {
		b.Fatal(err)
	}
	p := throttler.Policy{Name: "api", Limit: 10, Window: time.Second}
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "client-" + strconv.Itoa(i)
	}
	for _, c := range []struct {
		name string
		b    *Backend
	}{{"cluster", cluster}, {"two shards", shards}} {
		b.Run(c.name, func(b *testing.B) {
			store := c.b.Traits().Store
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				store(throttler.OpTake, keys[i%len(keys)], p)
			}
		})
	}
}
