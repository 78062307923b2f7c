package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/backendtest"
	"github.com/throttlekit/throttlekit/throttler"
)

var (
	compFW  = throttler.Policy{Name: "c-fw", Limit: 2, Window: time.Second}
	compSL  = throttler.Policy{Name: "c-sl", Limit: 5, Window: time.Minute, Algorithm: throttler.SlidingLog}
	compAll = throttler.All(compFW, compSL)
)

// Traits say Composites exactly where every member's key is sure to be on
// one server and in one slot: one *goredis.Client, or any layout with
// TagByKey; a Throttler over any other refuses a composite.
func TestCompositeTraits(t *testing.T) {
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = c.Close() })
	cluster := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	t.Cleanup(func() { _ = cluster.Close() })
	ring := goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	t.Cleanup(func() { _ = ring.Close() })
	ap, err := c.AutoPipeline()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ap.Close() })
	for _, tt := range []struct {
		name   string
		shards []Shard
		want   bool // without TagByKey; with it, always
	}{
		{"one client", []Shard{{Primary: c}}, true},
		{"one client with replicas", []Shard{{Primary: c, Replicas: []Client{c}}}, true},
		{"a Cluster", []Shard{{Primary: cluster}}, false},
		{"a Ring", []Shard{{Primary: ring}}, false},
		{"an AutoPipeliner", []Shard{{Primary: ap}}, false},
		{"another client", []Shard{{Primary: &fakeClient{}}}, false},
		{"two shards", []Shard{{Primary: c}, {Primary: c}}, false},
	} {
		for _, byKey := range []bool{false, true} {
			b, err := NewSharded(tt.shards, &Options{TagByKey: byKey})
			require.NoError(t, err)
			want := tt.want || byKey
			assert.Equal(t, want, b.Traits().Composites, "%s, TagByKey %v", tt.name, byKey)
			th, err := throttler.New(b, nil)
			require.NoError(t, err)
			assert.Equal(t, want, th.SupportsComposites(), "%s, TagByKey %v", tt.name, byKey)
		}
	}
}

// A Backend whose keys may be apart answers a composite with an input
// error, before any round trip, never a store failure that a Throttler's
// fail-open would turn into "allow all".
func TestCompositeRefusedWhereKeysMayBeApart(t *testing.T) {
	f0, f1 := &fakeClient{}, &fakeClient{}
	b, err := NewSharded([]Shard{{Primary: f0}, {Primary: f1}}, nil)
	require.NoError(t, err)
	for _, op := range []throttler.Op{throttler.OpTake, throttler.OpPeek} {
		var err error
		if op == throttler.OpTake {
			_, err = b.Take(context.Background(), "k", compAll, 1, t0)
		} else {
			_, err = b.Peek(context.Background(), "k", compAll, t0)
		}
		assert.ErrorIs(t, err, throttler.ErrInvalidPolicy, "%v", op)
		assert.NotErrorIs(t, err, throttler.ErrUnavailable, "%v", op)
		assert.Contains(t, fmt.Sprint(err), "Options.TagByKey", "%v", op)
	}
	assert.Empty(t, f0.calls)
	assert.Empty(t, f1.calls)
}

// The TagByKey layout: every key of one client key, whatever its policy,
// algorithm or lease, carries one tag, {k<16 hex digits>}, and is on one
// shard; the tag is part of the storage format (pinned here); the default
// layout's keys are untouched, and no key of one layout is a key of the
// other.
func TestTagByKeyLayout(t *testing.T) {
	shards := make([]Shard, 5)
	for i := range shards {
		shards[i] = Shard{Primary: &fakeClient{}}
	}
	byKey, err := NewSharded(shards, &Options{TagByKey: true})
	require.NoError(t, err)
	def, err := NewSharded(shards, nil)
	require.NoError(t, err)

	sk, _ := byKey.keyOf(compFW, "user-42")
	// FNV-1a 64 of "throttlekit:user-42", then MurmurHash3's finalizer.
	assert.Equal(t, "throttlekit:{kbbcb867461dab7c9}4:c-fw:user-42", sk, "the storage format")
	sk, _ = byKey.keyOf(compSL, "user-42")
	assert.Equal(t, "throttlekit:{kbbcb867461dab7c9}+7:c-sl sl:user-42", sk, "the storage format")

	policies := []throttler.Policy{compFW, compSL, throttler.PerHour(3),
		throttler.PerMinute(9).WithBurst(3).Named("tb"), throttler.PerMinute(9).WithAlgorithm(throttler.SlidingWindow)}
	shardsSeen := map[*shard]bool{}
	for i := range 200 {
		key := fmt.Sprint("user-", i)
		var tag string
		var s *shard
		for _, p := range policies {
			sk, h := byKey.keyOf(p, key)
			ds, _ := def.keyOf(p, key)
			require.NotEqual(t, ds, sk)
			require.True(t, strings.HasPrefix(sk, "throttlekit:{k"), sk)
			got := sk[:strings.IndexByte(sk, '}')+1]
			if tag == "" {
				tag, s = got, byKey.shardFor(h)
			}
			require.Equal(t, tag, got, "%v %q", p, key)
			require.Same(t, s, byKey.shardFor(h), "%v %q", p, key)
			require.Equal(t, byKey.store(throttler.OpTake, key, p), byKey.store(throttler.OpTake, key, compAll))
		}
		lk, lh := byKey.leaseKey(throttler.ConcurrencyPolicy{Name: "jobs", Limit: 1, TTL: time.Minute}, key)
		require.True(t, strings.HasPrefix(lk, tag), lk)
		require.Same(t, s, byKey.shardFor(lh))
		shardsSeen[s] = true
	}
	assert.Len(t, shardsSeen, 5, "keys spread over every shard")
}

// The composite's one script reaches the shard that Store names, the
// shard of each of its members alone, and its Peek a replica.
func TestCompositeGoesToTheStoreNamed(t *testing.T) {
	fakes := make([]*fakeClient, 3)
	shards := make([]Shard, 3)
	for i := range fakes {
		fakes[i] = &fakeClient{evalVal: pack(1, 1, 1, reset, 1, 1, ms+60000, 0)}
		shards[i] = Shard{Primary: fakes[i]}
	}
	replica := &fakeClient{evalVal: pack(0, 1, 0, ms, 1, 0, ms+60000, 0)}
	shards[1].Replicas = []Client{replica}
	b, err := NewSharded(shards, &Options{TagByKey: true})
	require.NoError(t, err)
	for i := range 60 {
		key := fmt.Sprint("user-", i)
		for _, f := range append(fakes, replica) {
			f.calls = nil
		}
		_, err := b.Take(context.Background(), key, compAll, 1, t0)
		require.NoError(t, err)
		name := b.store(throttler.OpTake, key, compAll)
		for j, f := range fakes {
			require.Equal(t, name == fmt.Sprint("redis shard ", j), len(f.calls) > 0, "%q: Store %q", key, name)
		}
		for _, f := range fakes {
			require.LessOrEqual(t, len(f.calls), 1, "one script, not one per member")
		}
		if name == "redis shard 1" {
			_, err := b.Peek(context.Background(), key, compAll, t0)
			require.NoError(t, err)
			assert.Equal(t, "redis shard 1 replicas", b.store(throttler.OpPeek, key, compAll))
			assert.Len(t, replica.calls, 1, "the Peek went to the replica")
		}
	}
}

// all.lua's reply is checked, member by member: a wrong shape, a flag out
// of range, or members that disagree with the composite's own flag is
// ErrUnexpectedReply, never a Decision.
func TestCompositeReplies(t *testing.T) {
	r, m := reset, ms
	hour := ms + time.Hour.Milliseconds()
	for _, tt := range []struct {
		name  string
		op    throttler.Op
		reply any
		want  []throttler.Decision // the members'; nil: ErrUnexpectedReply
	}{
		{"admitted", throttler.OpTake, pack(1, 1, 1, r, 1, 1, m+60000, 0), []throttler.Decision{
			{Allowed: true, Limit: 2, Used: 1, Remaining: 1, ResetAt: time.UnixMilli(reset)},
			{Allowed: true, Limit: 5, Used: 1, Remaining: 4, ResetAt: time.UnixMilli(ms + 60000)}}},
		{"denied by the window, the log as it stands", throttler.OpTake, pack(0, 0, 2, r, 1, 3, m+60000, 0), []throttler.Decision{
			{Limit: 2, Used: 2, Remaining: 0, ResetAt: time.UnixMilli(reset), RetryAfter: time.Minute},
			{Allowed: true, Limit: 5, Used: 3, Remaining: 2, ResetAt: time.UnixMilli(ms + 60000)}}},
		{"peek", throttler.OpPeek, pack(0, 1, 0, m, 1, 0, m+60000, 0), []throttler.Decision{
			{Allowed: true, Limit: 2, Remaining: 2, ResetAt: time.UnixMilli(ms + 1000)},
			{Allowed: true, Limit: 5, Remaining: 5, ResetAt: time.UnixMilli(ms + 60000)}}},
		{"not a string", throttler.OpTake, []any{int64(1)}, nil},
		{"short", throttler.OpTake, pack(1, 1, 1, r, 1, 1, m), nil},
		{"long", throttler.OpTake, pack(1, 1, 1, r, 1, 1, m, 0, 0), nil},
		{"admitted out of range", throttler.OpTake, pack(2, 1, 1, r, 1, 1, m, 0), nil},
		{"an admitted peek", throttler.OpPeek, pack(1, 1, 1, r, 1, 1, m, 0), nil},
		{"admitted, a member denied", throttler.OpTake, pack(1, 0, 2, r, 1, 1, m, 0), nil},
		{"denied, every member admitted", throttler.OpTake, pack(0, 1, 1, r, 1, 1, m, 0), nil},
		{"a member admits more than it has", throttler.OpTake, pack(0, 1, 2, r, 0, 5, hour, 1000), nil},
		{"a window's flag out of range", throttler.OpTake, pack(0, 3, 1, r, 0, 5, hour, 1000), nil},
	} {
		f := &fakeClient{evalVal: tt.reply}
		b := newBackend(t, f, &Options{TagByKey: true}) // a fake may be anything: TagByKey vouches
		require.True(t, b.Traits().Composites)
		var d throttler.Decision
		var err error
		if tt.op == throttler.OpTake {
			d, err = b.Take(context.Background(), "k", compAll, 1, t0)
		} else {
			d, err = b.Peek(context.Background(), "k", compAll, t0)
		}
		if tt.want == nil {
			assert.ErrorIs(t, err, ErrUnexpectedReply, tt.name)
			continue
		}
		require.NoError(t, err, tt.name)
		var got []throttler.Decision
		for _, md := range d.Members() {
			md.At, md.ResetAt = time.Time{}, time.UnixMilli(md.ResetAt.UnixMilli())
			got = append(got, md)
		}
		assert.Equal(t, tt.want, got, tt.name)
		assert.Equal(t, throttler.Combine(tt.want).Allowed, d.Allowed, tt.name)
		assert.Len(t, f.lastKeys, 2, tt.name)
	}
}

// TestCompositeConformanceShardedByKey runs the conformance suite on three
// servers as independent shards with TagByKey, then checks that each
// key's state is on one server whatever its policies.
func TestCompositeConformanceShardedByKey(t *testing.T) {
	var shards []Shard
	var servers []*goredis.Client
	for range 3 {
		rdb, _ := startRedis(t)
		shards = append(shards, Shard{Primary: rdb})
		servers = append(servers, rdb)
	}
	backendtest.Run(t, func(t *testing.T) throttler.Backend {
		b, err := NewSharded(shards, &Options{Prefix: "bykey:", TagByKey: true})
		require.NoError(t, err)
		return b
	})
	ctx := context.Background()
	byTag := map[string]int{} // the server holding each tag
	for i, s := range servers {
		keys, err := s.Keys(ctx, "bykey:*").Result()
		require.NoError(t, err)
		for _, k := range keys {
			tag := k[:strings.IndexByte(k, '}')+1]
			if j, ok := byTag[tag]; ok && j != i {
				t.Fatalf("tag %s on servers %d and %d", tag, j, i)
			}
			byTag[tag] = i
		}
		assert.NotEmpty(t, keys, "server %d", i)
	}
}

// A Throttler refunds a composite member by member, each under its own
// receipt, on Redis as on every backend: both members get the units back.
func TestCompositeRefundThroughThrottler(t *testing.T) {
	rdb, _ := startRedis(t)
	b := newBackend(t, rdb, &Options{Prefix: "refund:"})
	now := t0
	th, err := throttler.New(b, &throttler.Options{Clock: func() time.Time { return now }})
	require.NoError(t, err)
	ctx := context.Background()
	d, err := th.AllowN(ctx, "k", compAll, 2)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	now = now.Add(10 * time.Millisecond)
	_, err = th.Refund(ctx, "k", compAll, 2, d)
	require.NoError(t, err)
	for _, p := range []throttler.Policy{compFW, compSL} {
		got, err := b.Peek(ctx, "k", p, now)
		require.NoError(t, err)
		assert.Zero(t, got.Used, "%v", p)
	}
}

// In a batch, a composite comes between the Takes of its members' windows
// sent before it and those sent after: a Take of a member's window queued
// after the composite must see the composite's units, and one queued
// before must not, on a client of one server too, where the Takes of
// windows nothing else touches go as one takes.lua call.
func TestBatchCompositeAmongTakesOfItsMember(t *testing.T) {
	rdb, _ := startRedis(t)
	ctx := context.Background()
	// A script the server has not cached is sent again after the batch's
	// others (NOSCRIPT), which would reorder the calls on its own.
	for _, s := range append([]*goredis.Script{takeScript, takesScript}, allScripts[1:]...) {
		require.NoError(t, s.Load(ctx, rdb).Err())
	}
	c := throttler.All(compSL, compFW) // the window is not the first key
	other := throttler.Policy{Name: "c-other", Limit: 9, Window: time.Minute}
	for i, tt := range []struct {
		name    string
		before  int64 // units the window holds before the batch
		calls   []throttler.Policy
		allowed []bool
	}{
		{"the window's Takes on both sides", 0, []throttler.Policy{compFW, c, compFW}, []bool{true, true, false}},
		{"a joined window before, the member's after", 1, []throttler.Policy{other, c, compFW}, []bool{true, true, false}},
	} {
		prefix := fmt.Sprintf("order%d:", i)
		b := newBackend(t, rdb, &Options{Prefix: prefix, alwaysBatch: true})
		if tt.before > 0 {
			// Through another backend, never batched: b's lane stays idle
			// until it is held.
			_, err := newBackend(t, rdb, &Options{Prefix: prefix, MaxBatch: 1}).Take(ctx, "k", compFW, tt.before, t0)
			require.NoError(t, err)
		}
		l := b.shards[0].primaryLane
		release := hold(l)
		calls := make([]func() (throttler.Decision, error), len(tt.calls))
		for j, p := range tt.calls {
			calls[j] = func() (throttler.Decision, error) { return b.Take(ctx, "k", p, 1, t0) }
		}
		wait := inOrder(t, l, calls...)
		release()
		var allowed []bool
		for j, r := range wait() {
			require.NoError(t, r.err, "%s: call %d", tt.name, j)
			allowed = append(allowed, r.d.Allowed)
		}
		assert.Equal(t, tt.allowed, allowed, "%s: in the order sent", tt.name)
		assert.Equal(t, uint64(len(tt.calls)), b.Stats().Batched, "%s: one batch", tt.name)
	}
}

// A composite's script that fails on one member's key (another program's
// value of another type) fails the call as that key's, and writes nothing
// in the others.
func TestCompositeWrongTypeWritesNothing(t *testing.T) {
	rdb, _ := startRedis(t)
	b := newBackend(t, rdb, &Options{Prefix: "wt:"})
	ctx := context.Background()
	sk, _ := b.keyOf(compSL, "k")
	require.NoError(t, rdb.Set(ctx, sk, "x", 0).Err())
	_, err := b.Take(ctx, "k", throttler.All(compFW, compSL), 1, t0)
	assert.ErrorIs(t, err, throttler.ErrKeyState)
	assert.False(t, errors.Is(err, throttler.ErrUnavailable))
	fk, _ := b.keyOf(compFW, "k")
	n, err := rdb.Exists(ctx, fk).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the window was written")
}

// all.lua is built for each mix of algorithms with only their functions:
// every mix runs, a Take admitted and counted by each member, a Peek, and
// a Take denied by one member that counts nothing anywhere.
func TestCompositeEveryMix(t *testing.T) {
	rdb, _ := startRedis(t)
	b := newBackend(t, rdb, &Options{Prefix: "mix:"})
	ctx := context.Background()
	algs := []throttler.Algorithm{throttler.FixedWindow, throttler.TokenBucket, throttler.SlidingLog, throttler.SlidingWindow}
	for mix := 1; mix < 1<<len(algs); mix++ {
		var ms []throttler.Policy
		for _, a := range algs {
			if mix&(1<<a) != 0 {
				ms = append(ms, throttler.PerMinute(5).WithAlgorithm(a).Named(fmt.Sprintf("m%d-%d", mix, a)))
			}
		}
		if len(ms) == 1 { // a composite of one algorithm: two policies of it
			ms = append(ms, throttler.PerHour(7).WithAlgorithm(ms[0].Algorithm).Named(fmt.Sprint("h", mix)))
		}
		c, key := throttler.All(ms...), fmt.Sprint("k", mix)
		d, err := b.Take(ctx, key, c, 3, t0)
		require.NoError(t, err, "mix %b", mix)
		require.True(t, d.Allowed, "mix %b", mix)
		d, err = b.Take(ctx, key, c, 3, t0)
		require.NoError(t, err, "mix %b", mix)
		require.False(t, d.Allowed, "mix %b", mix)
		p, err := b.Peek(ctx, key, c, t0)
		require.NoError(t, err, "mix %b", mix)
		for i, m := range p.Members() {
			assert.Equal(t, int64(3), m.Used, "mix %b member %d", mix, i)
		}
	}
}
