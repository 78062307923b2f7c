package redis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/internal/algo"
	"github.com/throttlekit/throttlekit/throttler"
)

// pausedReplica is a replica whose reads hang until their context ends, as
// a paused server's do with ContextTimeoutEnabled. It records the deadline
// it was given.
type pausedReplica struct {
	fakeClient
	deadline time.Time
}

func (r *pausedReplica) HMGet(ctx context.Context, key string, fields ...string) *goredis.SliceCmd {
	r.deadline, _ = ctx.Deadline()
	<-ctx.Done()
	cmd := goredis.NewSliceCmd(ctx)
	cmd.SetErr(ctx.Err())
	return cmd
}

// EvalSha hangs like HMGet: a bucket's or a counter's Peek runs its script
// on the replica.
func (r *pausedReplica) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *goredis.Cmd {
	r.deadline, _ = ctx.Deadline()
	<-ctx.Done()
	cmd := goredis.NewCmd(ctx)
	cmd.SetErr(ctx.Err())
	return cmd
}

// noStateReply is what bucket.lua or counter.lua answers a Peek at t on a
// key with no state: nothing written or stored, and the state Go computes.
func noStateReply(p throttler.Policy, t int64) string {
	if p.Algorithm == throttler.TokenBucket {
		_, next, _ := algo.TokenBucket(p, algo.TokenBucketState{}, false, throttler.OpPeek, 1, 0, t)
		return pack(0, 0, 0, 0, 0, next.Tokens, next.At)
	}
	_, next, _ := algo.Counter(p, algo.CounterState{}, false, throttler.OpPeek, 1, 0, t)
	return pack(0, 0, 0, 0, 0, 0, next.K, next.Curr, next.Prev)
}

// A paused replica costs a Peek half of the call's time, and the Peek fails
// with the replica's error, marked as the replicas' store's, for every
// algorithm; the replica then rests, and the next Peek goes to the primary
// without waiting.
func TestPeekOnAPausedReplicaFailsInHalfTheTimeThenGoesToThePrimary(t *testing.T) {
	for _, alg := range []throttler.Algorithm{throttler.FixedWindow, throttler.TokenBucket, throttler.SlidingWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			p := policy
			p.Algorithm = alg
			primary := &fakeClient{hmgetVal: []any{"1", fmt.Sprint(reset)}}
			if alg != throttler.FixedWindow {
				primary.evalVal = noStateReply(p, t0.UnixMilli())
			}
			replica := &pausedReplica{}
			b, err := NewSharded([]Shard{{Primary: primary, Replicas: []Client{replica}}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			b.mono = func() time.Duration { return time.Hour } // a rest never ends here
			ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
			defer cancel()
			callDeadline, _ := ctx.Deadline()
			_, err = b.Peek(ctx, "k", p, t0)
			wantReplicaFailure(t, err)
			if left := time.Until(callDeadline); !replica.deadline.Before(callDeadline) || callDeadline.Sub(replica.deadline) < left {
				t.Errorf("replica deadline %v before the call's, want at least half", callDeadline.Sub(replica.deadline))
			}
			if len(primary.calls) != 0 {
				t.Errorf("primary calls %v, want none: the replica's failure is the Peek's", primary.calls)
			}
			if got := b.store(throttler.OpPeek, "k", p); got != "redis" {
				t.Errorf("Store of a Peek while the replica rests = %q, want the primary's", got)
			}
			replica.deadline = time.Time{}
			d, err := b.Peek(context.Background(), "k", p, t0) // no deadline: a paused replica would hang it
			if err != nil {
				t.Fatalf("Peek while the replica rests: %v; want the primary's answer", err)
			}
			if !replica.deadline.IsZero() {
				t.Error("a Peek reached the resting replica")
			}
			if alg == throttler.FixedWindow && d.Used != 1 {
				t.Errorf("Used %d, want the primary's 1", d.Used)
			}
		})
	}
}

// wantReplicaFailure checks a Peek's failure on the replica of a single
// shard: named after the replica, and charged to the replicas' store.
func wantReplicaFailure(t *testing.T, err error) {
	t.Helper()
	switch {
	case err == nil:
		t.Fatal("Peek succeeded; want the replica's failure")
	case !errors.Is(err, throttler.ErrUnavailable) || blamedStore(t, err) != "redis replicas":
		t.Errorf("Peek: %v; want a store failure of \"redis replicas\"", err)
	case !strings.Contains(err.Error(), "redis replica: "):
		t.Errorf("Peek: %v does not name the replica", err)
	}
}

// Any failure of a replica, an odd reply included, fails the Peek and rests
// the replica: Peeks go to the primary (and Store names it) until the rest
// is over, when one Peek probes the replica, which serves again if it
// answers. A caller's context that ends says nothing about the replica.
func TestAnyReplicaFailureRestsTheReplica(t *testing.T) {
	for _, replica := range []*fakeClient{
		{hmgetErr: ErrUnexpectedReply}, {hmgetErr: replyErr("LOADING Redis is loading")},
		{hmgetErr: context.DeadlineExceeded}, {hmgetErr: io.EOF}, {hmgetVal: []any{"4"}},
	} {
		primary := &fakeClient{hmgetVal: []any{"2", fmt.Sprint(reset)}}
		b, err := NewSharded([]Shard{{Primary: primary, Replicas: []Client{replica}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		var mono time.Duration
		b.mono = func() time.Duration { return mono }
		what := fmt.Sprint(replica.hmgetErr, replica.hmgetVal)
		_, err = b.Peek(context.Background(), "k", policy, t0)
		wantReplicaFailure(t, err)
		for _, elapsed := range []time.Duration{0, replicaRest - 1} {
			mono = elapsed
			if d, err := b.Peek(context.Background(), "k", policy, t0); err != nil || d.Used != 2 {
				t.Errorf("%s, %v later: Peek = %+v, %v; want the primary's Used 2", what, elapsed, d, err)
			}
		}
		if len(replica.calls) != 1 || b.store(throttler.OpPeek, "k", policy) != "redis" {
			t.Errorf("%s: replica calls %v, Store %q; want 1 and the primary while it rests", what, replica.calls, b.store(throttler.OpPeek, "k", policy))
		}
		mono = replicaRest
		replica.hmgetErr, replica.hmgetVal = nil, []any{"3", fmt.Sprint(reset)}
		if d, err := b.Peek(context.Background(), "k", policy, t0); err != nil || d.Used != 3 {
			t.Errorf("%s, probe after the rest: Peek = %+v, %v; want the replica's Used 3", what, d, err)
		}
		if got := b.store(throttler.OpPeek, "k", policy); got != "redis replicas" {
			t.Errorf("%s: Store %q after a probe succeeded, want the replicas'", what, got)
		}
	}

	replica := &fakeClient{hmgetErr: context.Canceled}
	b, _ := NewSharded([]Shard{{Primary: &fakeClient{}, Replicas: []Client{replica}}}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.Peek(ctx, "k", policy, t0); !errors.Is(err, context.Canceled) || errors.Is(err, throttler.ErrUnavailable) {
		t.Errorf("Peek with a cancelled context: %v; want context.Canceled alone", err)
	}
	if got := b.store(throttler.OpPeek, "k", policy); got != "redis replicas" {
		t.Errorf("Store %q after a cancelled Peek, want the replicas' (no rest)", got)
	}
}

// replyErr is a Redis error reply, as go-redis returns one.
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

// Failures of the server are the shard's (throttler.ErrUnavailable); a key
// holding another type is the key's (throttler.ErrKeyState); the rest is
// neither, and a context's end is left to the caller.
func TestFailuresAreClassified(t *testing.T) {
	const store, key, neither = "store", "key", ""
	tests := []struct {
		err  error
		want string
	}{
		{replyErr("LOADING Redis is loading the dataset in memory"), store},
		{replyErr("READONLY You can't write against a read only replica."), store},
		{replyErr("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), store},
		{replyErr("CLUSTERDOWN The cluster is down"), store},
		// One slot in a move, or served by no node: the key's condition.
		{replyErr("TRYAGAIN Multiple keys request during rehashing of slot"), key},
		{replyErr("ASK 3999 127.0.0.1:6381"), key},
		{replyErr("MOVED 3999 127.0.0.1:6381"), key},
		{replyErr("CLUSTERDOWN Hash slot not served"), key},
		{replyErr("BUSY Redis is busy running a script."), store},
		{replyErr("OOM command not allowed when used memory > 'maxmemory'."), store},
		{replyErr("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk."), store},
		{replyErr("NOREPLICAS Not enough good replicas to write."), store},
		{replyErr("ERR max number of clients reached"), store},
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, store},
		{fmt.Errorf("read: %w", io.EOF), store},
		{goredis.ErrPoolTimeout, store},
		{replyErr("WRONGTYPE Operation against a key holding the wrong kind of value"), key},
		{replyErr("ERR Error running script (call to f_1): @user_script:3: WRONGTYPE Operation against a key holding the wrong kind of value"), key},
		{replyErr("ERR unknown command 'EVALSHA'"), neither},
		{context.DeadlineExceeded, neither},
		{context.Canceled, neither},
		{errors.New("LOADING but not a reply from Redis"), neither},
	}
	for _, tt := range tests {
		t.Run(tt.err.Error(), func(t *testing.T) {
			for _, op := range []string{"take", "refund"} {
				f := &fakeClient{evalErr: tt.err}
				b := newBackend(t, f, nil)
				var err error
				if op == "take" {
					_, err = b.Take(context.Background(), "k", policy, 1, t0)
				} else {
					_, err = b.Refund(context.Background(), "k", policy, 1, t0.Add(policy.Window), t0)
				}
				if !errors.Is(err, tt.err) || !strings.HasPrefix(err.Error(), "redis: "+op+" ") {
					t.Errorf("%s: %v, want %v wrapped once", op, err, tt.err)
				}
				if got := errors.Is(err, throttler.ErrUnavailable); got != (tt.want == store) {
					t.Errorf("%s: store failure %v, want %v", op, got, tt.want == store)
				}
				if got := errors.Is(err, throttler.ErrKeyState); got != (tt.want == key) {
					t.Errorf("%s: key failure %v, want %v", op, got, tt.want == key)
				}
			}
		})
	}
}

// Each shard is a store of its own, named with its address when the client
// tells it; the name is the shard every operation on the key goes to.
func TestStoreNamesTheKeysShard(t *testing.T) {
	shards := make([]Shard, 3)
	fakes := make([]*fakeClient, 3)
	for i := range shards {
		fakes[i] = &fakeClient{evalVal: []any{int64(1), int64(1), reset}}
		shards[i] = Shard{Primary: fakes[i]}
	}
	b, err := NewSharded(shards, nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i := range 100 {
		key := fmt.Sprint("user-", i)
		for _, f := range fakes {
			f.calls = nil
		}
		if _, err := b.Take(context.Background(), key, policy, 1, t0); err != nil {
			t.Fatal(err)
		}
		name := b.store(throttler.OpTake, key, policy)
		seen[name] = true
		for j, f := range fakes {
			if (len(f.calls) > 0) != (name == fmt.Sprint("redis shard ", j)) {
				t.Fatalf("%q: Store says %q, the Take went to shard %d: %v", key, name, j, f.calls)
			}
		}
	}
	if len(seen) != 3 {
		t.Errorf("stores seen %v, want all 3 shards", seen)
	}

	c := goredis.NewClient(&goredis.Options{Addr: "10.0.0.1:6379"})
	defer c.Close()
	single := newBackend(t, c, nil)
	if got := single.store(throttler.OpTake, "k", policy); got != "redis (10.0.0.1:6379)" {
		t.Errorf("single client: Store %q", got)
	}
	two, err := NewSharded([]Shard{{Primary: c}, {Primary: fakes[0]}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for i := range 50 {
		names[two.store(throttler.OpTake, fmt.Sprint(i), policy)] = true
	}
	if !names["redis shard 0 (10.0.0.1:6379)"] || !names["redis shard 1"] || len(names) != 2 {
		t.Errorf("two shards: names %v", names)
	}
}

// A shard's primary and its replicas are stores apart. With the primary
// down and a replica answering Peeks, the replica's answers used to reset
// the primary's failures, so its breaker never opened and every Take paid
// the Timeout; and an open primary breaker must not stop the Peeks the
// replica answers. Peeks are named for the replicas, Takes for the primary.
func TestPrimaryAndReplicasFailApart(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	primary := &fakeClient{evalErr: refused, hmgetErr: refused}
	replica := &fakeClient{hmgetVal: []any{"3", fmt.Sprint(reset)}}
	b, err := NewSharded([]Shard{{Primary: primary, Replicas: []Client{replica}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var stores []string
	th, err := throttler.New(b, &throttler.Options{
		Clock: func() time.Time { return t0 }, BreakerThreshold: 3, BreakerCooldown: time.Hour,
		Observe: func(o throttler.Observation) { stores = append(stores, o.Op.String()+" "+o.Store) },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 5 {
		primary.calls = nil
		d, err := th.Allow(ctx, "k", policy)
		if !d.Degraded || err != nil {
			t.Fatalf("Take %d: %+v, %v; want failed open", i, d, err)
		}
		if reached, want := len(primary.calls) > 0, i < 3; reached != want {
			t.Errorf("Take %d reached the primary: %v, want %v (breaker opens after 3 failures)", i, reached, want)
		}
		d, err = th.Peek(ctx, "k", policy)
		if err != nil || d.Degraded || d.Used != 3 {
			t.Errorf("Peek %d: %+v, %v; want the replica's answer, Used 3", i, d, err)
		}
	}
	if want := []string{"take redis", "peek redis replicas"}; stores[0] != want[0] || stores[1] != want[1] {
		t.Errorf("observed stores %q, want %q", stores[:2], want)
	}
}

// A dead replica is seen and skipped: each Peek that reaches it fails,
// observed with the replica's name and counted toward the replicas'
// breaker, which opens; between its probes, once a rest, Peeks are
// answered by the primary, whose breaker stays closed. Takes are the
// primary's throughout.
func TestADeadReplicaIsObservedAndSkipped(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	primary := &fakeClient{evalVal: []any{int64(1), int64(1), reset}, hmgetVal: []any{"2", fmt.Sprint(reset)}}
	replica := &fakeClient{hmgetErr: refused}
	b, err := NewSharded([]Shard{{Primary: primary, Replicas: []Client{replica}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mono time.Duration
	b.mono = func() time.Duration { return mono }
	var observed []string
	th, err := throttler.New(b, &throttler.Options{
		Clock: func() time.Time { return t0 }, BreakerThreshold: 2, BreakerCooldown: time.Hour,
		Observe: func(o throttler.Observation) {
			if o.Err != nil {
				observed = append(observed, o.Err.Error())
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const rests = 4
	for i := range rests {
		mono = time.Duration(i) * replicaRest
		replica.calls = nil
		if d, _ := th.Peek(ctx, "k", policy); !d.Degraded {
			t.Errorf("rest %d: the probing Peek answered %+v, want the failure mode's", i, d)
		}
		for j := range 3 {
			if d, err := th.Peek(ctx, "k", policy); err != nil || d.Degraded || d.Used != 2 {
				t.Errorf("rest %d, Peek %d: %+v, %v; want the primary's Used 2", i, j, d, err)
			}
		}
		if len(replica.calls) != 1 {
			t.Errorf("rest %d: %d Peeks reached the replica, want 1", i, len(replica.calls))
		}
		if d, err := th.Allow(ctx, "k", policy); err != nil || d.Degraded {
			t.Errorf("rest %d: Take %+v, %v; want the primary's answer", i, d, err)
		}
	}
	if len(observed) != rests {
		t.Errorf("observed %d errors, want %d: %q", len(observed), rests, observed)
	}
	for _, e := range observed {
		if !strings.Contains(e, "redis replica: ") {
			t.Errorf("observed %q, which does not name the replica", e)
		}
	}
	for _, br := range th.Breakers() {
		if open := br.Store == "redis replicas"; br.Open != open {
			t.Errorf("breaker %q open: %v, want %v", br.Store, br.Open, open)
		}
	}
}

// A shard's replicas are named apart from its primary, with their
// addresses when the clients tell them.
func TestReplicasStoreName(t *testing.T) {
	c := func(addr string) *goredis.Client { return goredis.NewClient(&goredis.Options{Addr: addr}) }
	p, r1, r2 := c("10.0.0.1:6379"), c("10.0.0.2:6379"), c("10.0.0.3:6379")
	defer p.Close()
	defer r1.Close()
	defer r2.Close()
	b, err := NewSharded([]Shard{{Primary: p, Replicas: []Client{r1, r2}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for op, want := range map[throttler.Op]string{
		throttler.OpTake:   "redis (10.0.0.1:6379)",
		throttler.OpRefund: "redis (10.0.0.1:6379)",
		throttler.OpPeek:   "redis replicas (10.0.0.2:6379, 10.0.0.3:6379)",
	} {
		if got := b.store(op, "k", policy); got != want {
			t.Errorf("%v: Store %q, want %q", op, got, want)
		}
	}
}
