package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/throttlekit/throttlekit/backend/backendtest"
	"github.com/throttlekit/throttlekit/throttler"
)

// TestConformanceThroughBatches runs the conformance suite (tables,
// differential traces, exactness under concurrency) with every operation
// answered by batch.lua: alone, or with whatever the suite's goroutines
// sent meanwhile; on one server, a Cluster of two masters, and two shards
// whose Peeks their replicas serve.
func TestConformanceThroughBatches(t *testing.T) {
	t.Run("Standalone", func(t *testing.T) {
		rdb, _ := startRedis(t)
		backendtest.Run(t, func(t *testing.T) throttler.Backend {
			return newBackend(t, rdb, &Options{Prefix: "batch:", alwaysBatch: true})
		})
	})
	t.Run("Cluster", func(t *testing.T) {
		cc, _, _ := twoMasters(t)
		backendtest.Run(t, func(t *testing.T) throttler.Backend {
			return newBackend(t, cc, &Options{Prefix: "batch:", alwaysBatch: true})
		})
	})
	t.Run("ShardsWithReplicas", func(t *testing.T) {
		var shards []Shard
		for range 2 {
			primary, port := startRedis(t, "--repl-diskless-sync-delay", "0")
			replica, _ := startRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(port))
			waitReplicaInSync(t, primary)
			shards = append(shards, Shard{Primary: primary, Replicas: []Client{replica}})
		}
		// Each write waits for the replica (WAIT), so that a Peek it serves
		// sees the writes before it. The suite checks answers, not how soon
		// a replica acknowledges (TestWaitWithReplica does): on a machine
		// starved of CPU that can take seconds, and the suite's windows of a
		// few ms must not expire from Redis meanwhile (ExpiryMargin).
		backendtest.Run(t, func(t *testing.T) throttler.Backend {
			b, err := NewSharded(shards, &Options{Prefix: "batch:", WaitReplicas: 1, WaitTimeout: 4 * time.Second,
				ExpiryMargin: time.Hour, alwaysBatch: true})
			if err != nil {
				t.Fatal(err)
			}
			return b
		})
	})
}

// alwaysBatch is one Backend's: a lone Take on it goes through batch.lua,
// while one on another Backend of the same client is sent alone.
func TestAlwaysBatchIsPerBackend(t *testing.T) {
	rdb, _ := startRedis(t)
	always := newBackend(t, rdb, &Options{Prefix: "always:", alwaysBatch: true})
	alone := newBackend(t, rdb, &Options{Prefix: "alone:"})
	for _, b := range []*Backend{always, alone} {
		if _, err := b.Take(context.Background(), "k", policy, 1, t0); err != nil {
			t.Fatal(err)
		}
	}
	if got := always.Stats().Batched; got != 1 {
		t.Errorf("alwaysBatch: %d operations batched, want the lone Take", got)
	}
	if got := alone.Stats().Batched; got != 0 {
		t.Errorf("default: %d operations batched, want none for a lone Take", got)
	}
}

// hold makes l's round trips all busy, so that what arrives queues; the
// returned func sends the queue as one batch and gives them back.
func hold(l *lane) (release func()) {
	l.mu.Lock()
	l.inFlight = l.slots
	l.mu.Unlock()
	return func() {
		for range l.slots {
			l.finish() // the first sends the queue, the second frees its slot
		}
	}
}

type result struct {
	d   throttler.Decision
	err error
}

// inOrder starts the calls one after the other, each once the previous one
// has queued on l (whose round trips are held), and returns a func that
// waits for their results.
func inOrder(t *testing.T, l *lane, calls ...func() (throttler.Decision, error)) (wait func() []result) {
	t.Helper()
	out := make([]result, len(calls))
	var wg sync.WaitGroup
	for i, call := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i].d, out[i].err = call()
		}()
		queued(t, l, i+1)
	}
	return func() []result {
		wg.Wait()
		return out
	}
}

// queued waits until n requests wait on l.
func queued(t *testing.T, l *lane, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		l.mu.Lock()
		q := len(l.queue)
		l.mu.Unlock()
		if q == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests queued, want %d", q, n)
		}
		time.Sleep(100 * time.Microsecond) // the callers' goroutines queueing
	}
}

// TestBatchErrorsGoToTheirCallers: a key of another type fails its own
// operation only, and the batch's others are answered as if sent alone; a
// store that cannot be reached fails every operation of the batch, each as
// a store failure.
func TestBatchErrorsGoToTheirCallers(t *testing.T) {
	rdb, _ := startRedis(t)
	ctx := context.Background()
	b := newBackend(t, rdb, &Options{Prefix: "errs:"})
	p := throttler.Policy{Name: "e", Limit: 5, Window: time.Minute}
	bad, _ := b.storageKey(p, "bad")
	if err := rdb.Set(ctx, bad, "a string", 0).Err(); err != nil {
		t.Fatal(err)
	}
	l := b.shards[0].primaryLane
	release := hold(l)
	wait := inOrder(t, l,
		func() (throttler.Decision, error) { return b.Take(ctx, "a", p, 2, t0) },
		func() (throttler.Decision, error) { return b.Take(ctx, "bad", p, 1, t0) },
		func() (throttler.Decision, error) { return b.Take(ctx, "a", p, 3, t0) },
	)
	release()
	res := wait()
	if res[0].err != nil || res[2].err != nil {
		t.Fatalf("the good keys failed: %v, %v", res[0].err, res[2].err)
	}
	if !res[0].d.Allowed || res[0].d.Used != 2 || !res[2].d.Allowed || res[2].d.Used != 5 {
		t.Errorf("answers %+v, %+v; want used 2 then 5", res[0].d, res[2].d)
	}
	if !errors.Is(res[1].err, throttler.ErrKeyState) || errors.Is(res[1].err, throttler.ErrUnavailable) {
		t.Errorf("the bad key: %v, want the key's failure", res[1].err)
	}
	if s := b.Stats(); s.BatchSizes[1] != 1 || s.Batched != 3 {
		t.Errorf("stats %+v: want one batch of 3", s)
	}

	// A window whose count is no integer fails its own Takes (HINCRBY's
	// error, as take.lua alone gives it), in the takes.lua call that
	// answers the batch's other windows.
	frac, _ := b.storageKey(p, "frac")
	if err := rdb.HSet(ctx, frac, "u", "1.5", "r", t0.Add(time.Hour).UnixMilli()).Err(); err != nil {
		t.Fatal(err)
	}
	_, aloneErr := newBackend(t, rdb, &Options{Prefix: "errs:", MaxBatch: 1}).Take(ctx, "frac", p, 1, t0)
	release = hold(l)
	wait = inOrder(t, l,
		func() (throttler.Decision, error) { return b.Take(ctx, "d", p, 3, t0) },
		func() (throttler.Decision, error) { return b.Take(ctx, "frac", p, 1, t0) },
		func() (throttler.Decision, error) { return b.Take(ctx, "c", p, 1, t0) },
		func() (throttler.Decision, error) { return b.Take(ctx, "frac", p, 1, t0) },
	)
	release()
	res = wait()
	// The windows before and after the failing one in the reply.
	if res[0].err != nil || !res[0].d.Allowed || res[0].d.Used != 3 {
		t.Errorf("the good key before: %+v, %v", res[0].d, res[0].err)
	}
	if res[2].err != nil || !res[2].d.Allowed || res[2].d.Used != 1 {
		t.Errorf("the good key after: %+v, %v", res[2].d, res[2].err)
	}
	for _, r := range []result{res[1], res[3]} {
		if aloneErr == nil || r.err == nil || !strings.Contains(r.err.Error(), "not an integer") ||
			errors.Is(r.err, throttler.ErrKeyState) || errors.Is(r.err, throttler.ErrUnavailable) {
			t.Errorf("the window counting 1.5: %v (alone: %v), want HINCRBY's error", r.err, aloneErr)
		}
	}
	// The failing window last in the reply: nothing of its answers stays.
	release = hold(l)
	wait = inOrder(t, l,
		func() (throttler.Decision, error) { return b.Take(ctx, "d", p, 1, t0) },
		func() (throttler.Decision, error) { return b.Take(ctx, "frac", p, 1, t0) },
	)
	release()
	res = wait()
	if res[0].err != nil || !res[0].d.Allowed || res[0].d.Used != 4 {
		t.Errorf("the good key before the failing last: %+v, %v", res[0].d, res[0].err)
	}
	if res[1].err == nil || !strings.Contains(res[1].err.Error(), "not an integer") {
		t.Errorf("the failing window last: %v, want HINCRBY's error", res[1].err)
	}
	if u, err := rdb.HGet(ctx, frac, "u").Result(); err != nil || u != "1.5" {
		t.Errorf("the window counting 1.5 now holds %q, %v", u, err)
	}

	// A server that is gone: every caller of the batch hears of it.
	gone := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = gone.Close() })
	b = newBackend(t, gone, nil)
	l = b.shards[0].primaryLane
	release = hold(l)
	wait = inOrder(t, l,
		func() (throttler.Decision, error) { return b.Take(ctx, "a", p, 1, t0) },
		func() (throttler.Decision, error) { return b.Peek(ctx, "b", p, t0) },
		func() (throttler.Decision, error) { return b.Refund(ctx, "c", p, 1, t0.Add(p.Window), t0) },
	)
	release()
	for i, r := range wait() {
		if !errors.Is(r.err, throttler.ErrUnavailable) {
			t.Errorf("call %d: %v, want a store failure", i, r.err)
		}
	}
}

// TestBatchCallerThatLeaves: a caller whose context ends while it waits for
// its batch returns at once, and its operation never runs; one that stays
// in the same batch is answered.
func TestBatchCallerThatLeaves(t *testing.T) {
	rdb, _ := startRedis(t)
	b := newBackend(t, rdb, &Options{Prefix: "leave:"})
	p := throttler.Policy{Name: "l", Limit: 5, Window: time.Minute}
	l := b.shards[0].primaryLane
	release := hold(l)
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan error)
	go func() {
		_, err := b.Take(ctx, "k", p, 1, t0)
		left <- err
	}()
	stay := make(chan result)
	queued(t, l, 1)
	go func() {
		d, err := b.Take(context.Background(), "k", p, 2, t0)
		stay <- result{d, err}
	}()
	queued(t, l, 2)
	cancel()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("the caller that left got %v", err)
	}
	release()
	r := <-stay
	if r.err != nil || !r.d.Allowed || r.d.Used != 2 {
		t.Fatalf("the caller that stayed: %+v, %v; want used 2 (the other never ran)", r.d, r.err)
	}
	if s := b.Stats(); s.Abandoned != 1 {
		t.Errorf("stats %+v, want 1 abandoned", s)
	}
}

// TestBatchLoadWithCallersLeaving: 64 goroutines, each call on a key of its
// own with a cost of its own, a third of them on contexts that end at a
// random instant: every caller gets its own answer or its context's error,
// a call that returned an answer was counted once, batches were formed, and
// no goroutine is left behind.
func TestBatchLoadWithCallersLeaving(t *testing.T) {
	rdb, _ := startRedis(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, alg := range []throttler.Algorithm{throttler.FixedWindow, throttler.TokenBucket, throttler.SlidingWindow, throttler.SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			b := newBackend(t, rdb, &Options{Prefix: "load:" + alg.String() + ":"})
			p := throttler.Policy{Name: "load", Limit: 1000, Window: time.Hour, Algorithm: alg}
			const goroutines, calls = 64, 60
			var wg sync.WaitGroup
			errs := make(chan error, goroutines)
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(g), 7))
					for i := range calls {
						key := fmt.Sprintf("g%d-%d", g, i)
						cost := int64(1 + (g*calls+i)%47)
						ctx, cancel := context.Background(), context.CancelFunc(func() {})
						if rng.IntN(3) == 0 {
							ctx, cancel = context.WithTimeout(ctx, time.Duration(rng.IntN(300))*time.Microsecond)
						}
						d, err := b.Take(ctx, key, p, cost, t0)
						// go-redis's own check of the deadline can fire a
						// moment before the context's timer.
						deadline, ok := ctx.Deadline()
						ended := ctx.Err() != nil || ok && !time.Now().Before(deadline)
						cancel()
						if err != nil {
							if !ended {
								errs <- fmt.Errorf("%s: %v", key, err)
								return
							}
							continue
						}
						if !d.Allowed || d.Used != cost {
							errs <- fmt.Errorf("%s cost %d: got %+v", key, cost, d)
							return
						}
						// The answer was this call's: Redis holds its cost
						// once.
						pd, err := b.Peek(context.Background(), key, p, t0)
						if err != nil || pd.Used != cost {
							errs <- fmt.Errorf("%s cost %d: peek %+v, %v", key, cost, pd, err)
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			s := b.Stats()
			if s.Batched == 0 {
				t.Errorf("no batch was formed: %+v", s)
			}
			t.Logf("%+v", s)
		})
	}
}

// TestBatchTakesOfOneWindow: the Takes of one fixed window in a batch go
// as one takes.lua call; its answers and what it leaves in Redis must be
// those of the same Takes sent one by one, windows ending in the middle, a
// Refund between Takes and costs above the limit's remainder included.
func TestBatchTakesOfOneWindow(t *testing.T) {
	rdb, _ := startRedis(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(5, 5))
	for round := range 40 {
		batched := newBackend(t, rdb, &Options{Prefix: fmt.Sprintf("tb%d:", round)})
		alone := newBackend(t, rdb, &Options{Prefix: fmt.Sprintf("ta%d:", round), MaxBatch: 1})
		// Two policies and instants that move: the batch's takes.lua call
		// carries several parameter sets.
		policies := []throttler.Policy{
			{Name: "w", Limit: 10, Window: 100 * time.Millisecond},
			{Name: "v", Limit: 7, Window: 60 * time.Millisecond},
		}
		type step struct {
			refund  bool
			key     string
			cost    int64
			now     time.Time
			p       throttler.Policy
			receipt time.Time // a Refund's: its window's ResetAt
		}
		var steps []step
		now := t0
		resetAt := map[string]time.Time{} // by policy/key: a Take of at most Limit opens a window
		for range 2 + rng.IntN(20) {
			now = now.Add(time.Duration(rng.IntN(40)) * time.Millisecond)
			s := step{rng.IntN(8) == 0, fmt.Sprint("k", rng.IntN(3)), int64(1 + rng.IntN(6)), now, policies[rng.IntN(2)], time.Time{}}
			w := s.p.Name + "/" + s.key
			if !s.refund && !resetAt[w].After(now) {
				resetAt[w] = now.Add(s.p.Window)
			}
			if s.receipt = resetAt[w]; s.receipt.IsZero() {
				s.receipt = now.Add(s.p.Window)
			}
			steps = append(steps, s)
		}
		do := func(b *Backend, s step) (throttler.Decision, error) {
			if s.refund {
				return b.Refund(ctx, s.key, s.p, s.cost, s.receipt, s.now)
			}
			return b.Take(ctx, s.key, s.p, s.cost, s.now)
		}
		l := batched.shards[0].primaryLane
		release := hold(l)
		calls := make([]func() (throttler.Decision, error), len(steps))
		for i, s := range steps {
			calls[i] = func() (throttler.Decision, error) { return do(batched, s) }
		}
		wait := inOrder(t, l, calls...)
		release()
		got := wait()
		for i, s := range steps {
			want, err := do(alone, s)
			if err != nil || got[i].err != nil {
				t.Fatalf("round %d step %d: %v, %v", round, i, got[i].err, err)
			}
			if !sameDecision(got[i].d, want) {
				t.Fatalf("round %d step %d %+v: batched %+v, alone %+v", round, i, s, got[i].d, want)
			}
		}
		for _, p := range policies {
			for _, key := range []string{"k0", "k1", "k2"} {
				sb, _ := batched.storageKey(p, key)
				sa, _ := alone.storageKey(p, key)
				hb, err1 := rdb.HGetAll(ctx, sb).Result()
				ha, err2 := rdb.HGetAll(ctx, sa).Result()
				if err1 != nil || err2 != nil || fmt.Sprint(hb) != fmt.Sprint(ha) {
					t.Fatalf("round %d %s %s: batched left %v, alone %v (%v, %v)", round, p.Name, key, hb, ha, err1, err2)
				}
				tb, err1 := rdb.PTTL(ctx, sb).Result()
				ta, err2 := rdb.PTTL(ctx, sa).Result()
				if err1 != nil || err2 != nil || (tb < 0) != (ta < 0) {
					t.Fatalf("round %d %s %s: batched expiry %v, alone %v (%v, %v)", round, p.Name, key, tb, ta, err1, err2)
				}
			}
		}
	}
}

// TestParseInts: the reply reader of scripts run outside batches (the
// lease scripts) refuses every shape but an array of len(out) integers,
// and passes a failure of the call through.
func TestParseInts(t *testing.T) {
	down := errors.New("down")
	for _, tt := range []struct {
		val     any
		err     error
		want    []int64
		wantErr error
	}{
		{val: []any{int64(1), int64(-2)}, want: []int64{1, -2}},
		{err: goredis.Nil, wantErr: ErrUnexpectedReply},
		{err: down, wantErr: down},
		{val: "x", wantErr: ErrUnexpectedReply},
		{val: []any{int64(1)}, wantErr: ErrUnexpectedReply},
		{val: []any{int64(1), "2"}, wantErr: ErrUnexpectedReply},
	} {
		cmd := goredis.NewCmd(context.Background())
		cmd.SetVal(tt.val)
		cmd.SetErr(tt.err)
		out := make([]int64, 2)
		err := parseInts(cmd, out)
		if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && fmt.Sprint(out) != fmt.Sprint(tt.want)) {
			t.Errorf("%v, %v: got %v, %v; want %v, %v", tt.val, tt.err, out, err, tt.want, tt.wantErr)
		}
	}
}

// TestBatchSecondStartsAtHalf: while one batch is under way, the requests
// that queue wait until half of the lane's callers have (lane.half), then
// go as a second batch without waiting for the first; none waits for a
// timer.
func TestBatchSecondStartsAtHalf(t *testing.T) {
	rdb, _ := startRedis(t)
	ctx := context.Background()
	b := newBackend(t, rdb, &Options{Prefix: "half:"})
	p := throttler.Policy{Name: "h", Limit: 100, Window: time.Minute}
	l := b.shards[0].primaryLane
	// A batch under way that never ends, of 3 of the lane's 6 callers.
	l.mu.Lock()
	l.inFlight, l.flushers, l.flying, l.active, l.lastBatch = 1, 1, 3, 6, 3
	l.mu.Unlock()
	answers := make(chan result, 3)
	for i := range 3 {
		go func() {
			d, err := b.Take(ctx, fmt.Sprint("k", i), p, 1, t0)
			answers <- result{d, err}
		}()
		if i < 2 {
			queued(t, l, i+1) // below half: they wait
		}
	}
	for range 3 {
		r := <-answers
		if r.err != nil || !r.d.Allowed || r.d.Used != 1 {
			t.Fatalf("answer %+v, %v", r.d, r.err)
		}
	}
	l.mu.Lock()
	inFlight, flushers := l.inFlight, l.flushers
	l.inFlight, l.flushers, l.flying = 0, 0, 0
	l.mu.Unlock()
	if inFlight != 1 || flushers != 1 {
		t.Errorf("after the second batch: %d round trips, %d batches under way; want the first's alone", inFlight, flushers)
	}
	if s := b.Stats(); s.RoundTrips != 1 || s.BatchSizes[1] != 1 {
		t.Errorf("stats %+v: want one batch of 3", s)
	}
}

// TestBatchLateReplyIsAnAnswer: a reply set before its caller, back from a
// wait for a CPU, sees both it and its context's end is the caller's answer.
// Go's select picks among ready cases at random, so 64 rounds would catch a
// caller that could take the deadline instead.
func TestBatchLateReplyIsAnAnswer(t *testing.T) {
	l := &lane{stats: new(counters)}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 64 {
		p := pendings.Get().(*pending)
		p.state.Store(sent)
		p.reply = int64(i)
		p.done <- struct{}{}
		reply, err := l.await(ctx, p)
		if err != nil || reply != int64(i) {
			t.Fatalf("round %d: got %v, %v; want the reply %d", i, reply, err, i)
		}
	}
	if s := l.stats.abandoned.Load(); s != 0 {
		t.Errorf("%d calls counted abandoned, want 0", s)
	}
}
