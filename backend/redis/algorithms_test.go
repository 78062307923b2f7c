package redis

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/backend/backendtest"
	"github.com/throttlekit/throttlekit/internal/algo"
	"github.com/throttlekit/throttlekit/internal/identity"
	"github.com/throttlekit/throttlekit/throttler"
)

// startRedis starts a redis-server of its own on a free local port, without
// persistence, for the test's lifetime, and returns a client on it; args
// are added to the server's command line. It skips the test when
// redis-server is not on PATH, and fails it then under CI=true, so that a
// green CI run has tested the scripts (see missingServer).
func startRedis(t testing.TB, args ...string) (*goredis.Client, int) {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		missingServer(t, "redis-server is not on PATH")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir := t.TempDir()
	cmd := exec.Command(path, append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "log")}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	rdb := goredis.NewClient(&goredis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), PoolSize: 64})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	for i := 0; ; i++ {
		if err := rdb.Ping(ctx).Err(); err == nil {
			return rdb, port
		} else if i == 200 {
			t.Fatalf("redis-server on port %d: %v", port, err)
		}
		time.Sleep(10 * time.Millisecond) // the server starting, not the clock
	}
}

// missingServer skips t for want of a server binary, or fails it under
// CI=true, where a skip would leave the Lua scripts untested.
func missingServer(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(why + ", and CI=true: install it (Debian: redis-server)")
	}
	t.Skip(why)
}

// Under CI=true the tests that need redis-server fail without it rather
// than skip: the test binary is run again with an empty PATH.
func TestMissingRedisServerFailsUnderCI(t *testing.T) {
	for ci, wantFail := range map[string]bool{"true": true, "": false} {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestConformanceLocalRedis$", "-test.count", "1", "-test.v")
		cmd.Env = append(os.Environ(), "PATH=", "CI="+ci)
		out, err := cmd.CombinedOutput()
		if failed := err != nil; failed != wantFail || !strings.Contains(string(out), "redis-server is not on PATH") {
			t.Errorf("CI=%q without redis-server: failed %v (%v), want %v; output:\n%s", ci, failed, err, wantFail, out)
		}
	}
}

// TestConformanceLocalRedis runs the whole conformance suite (the four
// algorithms, their tables, concurrency and differential traces) against a
// real Redis started for the test.
func TestConformanceLocalRedis(t *testing.T) {
	rdb, _ := startRedis(t)
	backendtest.Run(t, func(t *testing.T) throttler.Backend {
		b, err := NewSharded([]Shard{{Primary: rdb}}, &Options{Prefix: "conf:"})
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}

// TestAlgorithmsMatchGoAtTheBounds replays random traces on a real Redis and
// on internal/algo's functions (state kept here, never dropped), at the
// bounds of the doubles: capacity·window and limit·window at 2^53, costs up
// to 2^48, windows that do not divide the refill, instants before 1970,
// clocks going back, and named policies whose Limit, Burst or Window
// change under live state. Every Decision must be equal, Peek included.
func TestAlgorithmsMatchGoAtTheBounds(t *testing.T) {
	rdb, _ := startRedis(t)
	b, err := NewSharded([]Shard{{Primary: rdb}}, &Options{ExpiryMargin: time.Hour}) // nothing expires mid-trace
	if err != nil {
		t.Fatal(err)
	}
	const max48 = throttler.MaxLimit
	ms := time.Millisecond
	policies := []throttler.Policy{
		{Name: "tb-max", Limit: max48, Window: 32 * ms, Algorithm: throttler.TokenBucket},
		{Name: "tb-max", Limit: 3, Window: 31 * ms, Algorithm: throttler.TokenBucket, Burst: max48},
		{Name: "tb-max", Limit: 3, Window: 32 * ms, Algorithm: throttler.TokenBucket, Burst: max48},
		{Name: "tb-odd", Limit: 7, Window: 13 * ms, Algorithm: throttler.TokenBucket, Burst: 2},
		{Name: "tb-odd", Limit: 5, Window: 13 * ms, Algorithm: throttler.TokenBucket, Burst: 3},
		{Limit: 1_000_000_007, Window: 8191 * ms, Algorithm: throttler.TokenBucket, Burst: 1_000_000_000_000},
		{Name: "sw-max", Limit: 1 << 40, Window: 8191 * ms, Algorithm: throttler.SlidingWindow},
		{Name: "sw-max", Limit: max48, Window: 32 * ms, Algorithm: throttler.SlidingWindow},
		{Name: "sw-odd", Limit: 3, Window: 7 * ms, Algorithm: throttler.SlidingWindow},
		{Name: "sw-odd", Limit: 2, Window: 7 * ms, Algorithm: throttler.SlidingWindow},
		{Name: "sl", Limit: throttler.MaxLogLimit, Window: 50 * ms, Algorithm: throttler.SlidingLog},
		{Name: "sl", Limit: 7, Window: 13 * ms, Algorithm: throttler.SlidingLog},
		{Limit: 1, Window: ms, Algorithm: throttler.SlidingLog},
	}
	type state struct {
		bucket  algo.TokenBucketState
		counter algo.CounterState
		log     []algo.LogEntry
		stored  bool
	}
	ctx := context.Background()
	for _, start := range []int64{backendtest.T0.UnixMilli(), -1_000_003} {
		rng := rand.New(rand.NewPCG(uint64(start), 7))
		ref := map[string]*state{}
		receipts := map[string][]int64{} // the latest admitted Takes' ResetAt
		now := start
		for i := range 3000 {
			switch r := rng.IntN(10); {
			case r < 6:
				now += int64(rng.IntN(5))
			case r < 8:
				now -= int64(rng.IntN(30))
			default:
				now += int64(rng.IntN(20_000))
			}
			p := policies[rng.IntN(len(policies))]
			key := fmt.Sprint(start, []string{"a", "b"}[rng.IntN(2)])
			op := []throttler.Op{throttler.OpTake, throttler.OpTake, throttler.OpPeek, throttler.OpRefund}[rng.IntN(4)]
			c := p.Capacity()
			cost := []int64{1, 1 + rng.Int64N(c), c, c/2 + 1, 1 + rng.Int64N(min(c, 3))}[rng.IntN(5)]
			if op == throttler.OpRefund && rng.IntN(4) == 0 {
				cost = max48
			}
			id := identity.Rate(p) + "\x00" + key
			// A Refund names one of the latest Takes, or one never made.
			r := now + 1 + rng.Int64N(p.Window.Milliseconds())
			if l := receipts[id]; len(l) > 0 && rng.IntN(8) != 0 {
				r = l[max(0, len(l)-1-rng.IntN(3))]
			}
			got, err := backend.Do(ctx, b, op, key, p, cost, time.UnixMilli(r), time.UnixMilli(now))
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			if op == throttler.OpTake && got.Allowed {
				receipts[id] = append(receipts[id], got.ResetAt.UnixMilli())
			}
			st := ref[id]
			if st == nil {
				st = &state{}
				ref[id] = st
			}
			var want throttler.Decision
			switch p.Algorithm {
			case throttler.TokenBucket:
				d, next, write := algo.TokenBucket(p, st.bucket, st.stored, op, cost, r, now)
				if want = d; write {
					st.bucket, st.stored = next, true
				}
			case throttler.SlidingWindow:
				d, next, write := algo.Counter(p, st.counter, st.stored, op, cost, r, now)
				if want = d; write {
					st.counter, st.stored = next, true
				}
			case throttler.SlidingLog:
				d, next, write := algo.Log(p, slices.Clone(st.log), op, cost, r, now)
				if want = d; write {
					st.log = next
				}
			}
			if got != want {
				t.Fatalf("step %d: %v %d of %q under %+v at %d (receipt %d):\n got %+v\nwant %+v", i, op, cost, key, p, now, r, got, want)
			}
		}
	}
}

// algFake answers every script with reply and every HMGET with fields.
type algFake struct {
	goredis.Scripter // unused methods: nil, so they panic
	reply            any
	fields           []any
	calls            []string
	args             []any
}

func (f *algFake) EvalSha(ctx context.Context, _ string, _ []string, args ...any) *goredis.Cmd {
	f.calls, f.args = append(f.calls, "evalsha"), args
	cmd := goredis.NewCmd(ctx)
	cmd.SetVal(f.reply)
	return cmd
}

func (f *algFake) Eval(ctx context.Context, s string, keys []string, args ...any) *goredis.Cmd {
	return f.EvalSha(ctx, s, keys, args...)
}

func (f *algFake) HMGet(ctx context.Context, _ string, _ ...string) *goredis.SliceCmd {
	f.calls = append(f.calls, "hmget")
	cmd := goredis.NewSliceCmd(ctx)
	cmd.SetVal(f.fields)
	return cmd
}

func TestAlgorithmReplies(t *testing.T) {
	at := backendtest.T0
	ms := at.UnixMilli()
	tb := throttler.PerSecond(10).WithBurst(20).Named("tb")
	sw := throttler.PerSecond(10).WithAlgorithm(throttler.SlidingWindow).Named("sw")
	sl := throttler.PerSecond(10).WithAlgorithm(throttler.SlidingLog).Named("sl")
	k := ms / 1000
	tests := []struct {
		name  string
		op    throttler.Op
		p     throttler.Policy
		reply any
		want  throttler.Decision // zero: want ErrUnexpectedReply
	}{
		// A full bucket (no state): take 1 leaves 19 tokens of 1000 units.
		{"bucket take fresh", throttler.OpTake, tb, pack(1, 0, 0, 0, 0, 19000, ms),
			throttler.Decision{Allowed: true, Limit: 20, Used: 1, Remaining: 19, ResetAt: at.Add(100 * time.Millisecond)}},
		{"bucket take, script wrote but Go would not", throttler.OpRefund, tb, pack(1, 0, 0, 0, 0, 20000, ms), throttler.Decision{}},
		{"bucket next state differs", throttler.OpTake, tb, pack(1, 0, 0, 0, 0, 18999, ms), throttler.Decision{}},
		{"bucket stored out of range", throttler.OpTake, tb, pack(1, 2, 0, 0, 0, 19000, ms), throttler.Decision{}},
		{"bucket not stored but state", throttler.OpTake, tb, pack(1, 0, 5, 0, 0, 19000, ms), throttler.Decision{}},
		{"bucket state above 2^53", throttler.OpTake, tb, pack(1, 1, 1<<54, ms, 1000, 19000, ms), throttler.Decision{}},
		{"bucket short", throttler.OpTake, tb, pack(1, 0, 0, 0, 0, 19000), throttler.Decision{}},
		{"bucket as an array", throttler.OpTake, tb, []any{int64(1), int64(0), int64(0), int64(0), int64(0), int64(19000), ms}, throttler.Decision{}},
		{"bucket peek", throttler.OpPeek, tb, pack(0, 1, 5000, ms, 1000, 5000, ms),
			throttler.Decision{Allowed: true, Limit: 20, Used: 15, Remaining: 5, ResetAt: at.Add(1500 * time.Millisecond)}},
		{"bucket peek that wrote", throttler.OpPeek, tb, pack(1, 1, 5000, ms, 1000, 5000, ms), throttler.Decision{}},
		{"counter peek", throttler.OpPeek, sw, pack(0, 1, k, 4, 0, 1000, k, 4, 0),
			throttler.Decision{Allowed: true, Limit: 10, Used: 4, Remaining: 6, ResetAt: time.UnixMilli((k + 1) * 1000)}},
		{"counter take fresh", throttler.OpTake, sw, pack(1, 0, 0, 0, 0, 0, k, 1, 0),
			throttler.Decision{Allowed: true, Limit: 10, Used: 1, Remaining: 9, ResetAt: time.UnixMilli((k + 1) * 1000)}},
		{"counter next state differs", throttler.OpTake, sw, pack(1, 0, 0, 0, 0, 0, k+1, 1, 0), throttler.Decision{}},
		{"counter wrote flag 2", throttler.OpTake, sw, pack(2, 0, 0, 0, 0, 0, k, 1, 0), throttler.Decision{}},
		{"log denied", throttler.OpTake, sl, pack(0, 10, ms+900, 250),
			throttler.Decision{Limit: 10, Used: 10, ResetAt: at.Add(900 * time.Millisecond), RetryAfter: 250 * time.Millisecond}},
		{"log used above limit", throttler.OpPeek, sl, pack(0, 12, ms+900, 250),
			throttler.Decision{Limit: 10, Used: 12, ResetAt: at.Add(900 * time.Millisecond), RetryAfter: 250 * time.Millisecond}},
		{"log allowed with a wait", throttler.OpTake, sl, pack(1, 1, ms+1000, 5), throttler.Decision{}},
		{"log negative used", throttler.OpTake, sl, pack(1, -1, ms+1000, 0), throttler.Decision{}},
		{"log NaN", throttler.OpTake, sl, pack(1, math.NaN(), ms+1000, 0), throttler.Decision{}},
		{"log infinite", throttler.OpTake, sl, pack(1, 1, math.Inf(1), 0), throttler.Decision{}},
		{"log fraction", throttler.OpTake, sl, pack(1, 1.5, ms+1000, 0), throttler.Decision{}},
		{"log one byte more", throttler.OpTake, sl, pack(1, 1, ms+1000, 0) + "x", throttler.Decision{}},
		{"log not packed", throttler.OpTake, sl, "OK", throttler.Decision{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := NewSharded([]Shard{{Primary: &algFake{reply: tt.reply}}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			d, err := backend.Do(context.Background(), b, tt.op, "k", tt.p, 1, at.Add(time.Second), at)
			if tt.want == (throttler.Decision{}) {
				if !errors.Is(err, ErrUnexpectedReply) || !strings.HasPrefix(err.Error(), "redis: "+tt.op.String()+" ") {
					t.Fatalf("got %+v, %v; want a wrapped ErrUnexpectedReply", d, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !sameDecision(d, tt.want) {
				t.Errorf("got  %+v\nwant %+v", d, tt.want)
			}
		})
	}
}

// pack is a reply as the algorithm scripts send it: each value (an int,
// an int64 or a float64) as a little-endian double.
func pack(vals ...any) string {
	b := make([]byte, 0, 8*len(vals))
	for _, v := range vals {
		var f float64
		switch v := v.(type) {
		case int:
			f = float64(v)
		case int64:
			f = float64(v)
		case float64:
			f = v
		default:
			panic(fmt.Sprintf("pack: %T", v))
		}
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(f))
	}
	return string(b)
}

// TestAlgorithmScriptArgs pins what the scripts are sent: the op, now and
// the window in ms, the policy's numbers, cost and the expiry margin (a
// duration, never an absolute time), and last a Refund's receipt (the
// log's less the window).
func TestAlgorithmScriptArgs(t *testing.T) {
	at := backendtest.T0
	ms := at.UnixMilli()
	tests := []struct {
		p     throttler.Policy
		op    throttler.Op
		reply any
		want  []any
	}{
		{throttler.PerSecond(10).WithBurst(20), throttler.OpTake,
			pack(1, 0, 0, 0, 0, 19000, ms),
			[]any{1, ms, int64(1000), int64(10), int64(20), int64(1), int64(2000)}},
		{throttler.PerSecond(10).WithBurst(20), throttler.OpPeek,
			pack(0, 0, 0, 0, 0, 20000, ms),
			[]any{2, ms, int64(1000), int64(10), int64(20), int64(0), int64(2000)}},
		{throttler.PerSecond(10).WithAlgorithm(throttler.SlidingWindow), throttler.OpRefund,
			pack(0, 0, 0, 0, 0, 0, ms/1000, 0, 0),
			[]any{3, ms, int64(1000), int64(10), int64(1), int64(2000), ms + 300}},
		{throttler.PerSecond(10).WithBurst(20), throttler.OpRefund,
			pack(0, 0, 0, 0, 0, 20000, ms),
			[]any{3, ms, int64(1000), int64(10), int64(20), int64(1), int64(2000), ms + 300}},
		{throttler.PerSecond(10).WithAlgorithm(throttler.SlidingLog), throttler.OpRefund,
			pack(1, 0, ms+1000, 0),
			[]any{3, ms, int64(1000), int64(10), int64(1), int64(2000), ms - 1000, ms + 300 - 1000}},
		{throttler.PerSecond(10).WithAlgorithm(throttler.SlidingLog), throttler.OpPeek,
			pack(1, 0, ms+1000, 0),
			[]any{2, ms, int64(1000), int64(10), int64(0), int64(2000), ms - 1000}},
	}
	for _, tt := range tests {
		f := &algFake{reply: tt.reply}
		b, err := NewSharded([]Shard{{Primary: f}}, &Options{ExpiryMargin: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := backend.Do(context.Background(), b, tt.op, "k", tt.p, 1, at.Add(300*time.Millisecond), at.Add(700*time.Microsecond)); err != nil {
			t.Fatal(err)
		}
		if got, want := fmt.Sprint(f.args), fmt.Sprint(tt.want); got != want {
			t.Errorf("%v %v: args %s, want %s", tt.p.Algorithm, tt.op, got, want)
		}
	}
}

// TestAlgorithmStoredValues: the bucket's and the counter's scripts read a
// stored value as their state only if it is what they write, integers of
// magnitude <= 2^53 (a bucket's three doubles, a counter's decimals);
// anything else reads as no state, for a Peek (which writes nothing) as
// for a Take.
func TestAlgorithmStoredValues(t *testing.T) {
	rdb, _ := startRedis(t)
	b, err := NewSharded([]Shard{{Primary: rdb}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	at := backendtest.T0
	tms := at.UnixMilli()
	ftms := float64(tms)
	ms := fmt.Sprint(tms)
	k := fmt.Sprint(tms / 1000)
	tb := throttler.PerSecond(10).WithBurst(20).Named("tb")
	sw := throttler.PerSecond(10).WithAlgorithm(throttler.SlidingWindow).Named("sw")
	tests := []struct {
		name  string
		p     throttler.Policy
		value string
		state any // the state it reads as; nil: none
	}{
		{"bucket", tb, bucketValue(5000, ftms, 1000), algo.TokenBucketState{Tokens: 5000, At: tms, Window: 1000}},
		{"empty bucket", tb, bucketValue(0, ftms, 1000), algo.TokenBucketState{Tokens: 0, At: tms, Window: 1000}},
		{"negative tokens", tb, bucketValue(-7, ftms, 1000), algo.TokenBucketState{Tokens: -7, At: tms, Window: 1000}},
		{"2^53 tokens", tb, bucketValue(1<<53, ftms, 1000), algo.TokenBucketState{Tokens: 1 << 53, At: tms, Window: 1000}},
		{"-2^53 tokens", tb, bucketValue(-1<<53, ftms, 1000), algo.TokenBucketState{Tokens: -1 << 53, At: tms, Window: 1000}},
		{"another window", tb, bucketValue(0, ftms, 999), algo.TokenBucketState{Tokens: 0, At: tms, Window: 999}},
		{"negative zero", tb, bucketValue(math.Copysign(0, -1), ftms, 1000), algo.TokenBucketState{Tokens: 0, At: tms, Window: 1000}},
		{"above 2^53", tb, bucketValue(1<<53+2, ftms, 1000), nil},
		{"below -2^53", tb, bucketValue(-1<<53-2, ftms, 1000), nil},
		{"instant above 2^53", tb, bucketValue(0, 1<<53+2, 1000), nil},
		{"window above 2^53", tb, bucketValue(0, ftms, 1<<53+2), nil},
		{"a fraction", tb, bucketValue(0.5, ftms, 1000), nil},
		{"NaN", tb, bucketValue(math.NaN(), ftms, 1000), nil},
		{"infinity", tb, bucketValue(math.Inf(1), ftms, 1000), nil},
		{"23 bytes", tb, bucketValue(5000, ftms, 1000)[:23], nil},
		{"25 bytes", tb, bucketValue(5000, ftms, 1000) + "\x00", nil},
		{"the decimal layout, 24 bytes", tb, "50000:" + ms + ":1000", nil},
		{"empty", tb, "", nil},
		{"counter", sw, k + ":4:9:1000", algo.CounterState{K: at.UnixMilli() / 1000, Curr: 4, Prev: 9, Window: 1000}},
		{"counter, a space", sw, k + ":4: 9:1000", nil},
		{"counter, three fields", sw, k + ":4:1000", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sk, _ := b.algorithmKey(tt.p, "k")
			for _, op := range []throttler.Op{throttler.OpPeek, throttler.OpTake} {
				if err := rdb.Set(ctx, sk, tt.value, 0).Err(); err != nil {
					t.Fatal(err)
				}
				got, err := backend.Do(ctx, b, op, "k", tt.p, 1, time.Time{}, at)
				if err != nil {
					t.Fatal(err)
				}
				var want throttler.Decision
				switch st := tt.state.(type) {
				case algo.CounterState:
					want, _, _ = algo.Counter(tt.p, st, true, op, 1, 0, at.UnixMilli())
				case algo.TokenBucketState:
					want, _, _ = algo.TokenBucket(tt.p, st, true, op, 1, 0, at.UnixMilli())
				default:
					if tt.p.Algorithm == throttler.TokenBucket {
						want, _, _ = algo.TokenBucket(tt.p, algo.TokenBucketState{}, false, op, 1, 0, at.UnixMilli())
					} else {
						want, _, _ = algo.Counter(tt.p, algo.CounterState{}, false, op, 1, 0, at.UnixMilli())
					}
				}
				if !sameDecision(got, want) {
					t.Errorf("%v: got  %+v\nwant %+v", op, got, want)
				}
				if v := rdb.Get(ctx, sk).Val(); op == throttler.OpPeek && v != tt.value {
					t.Errorf("the peek wrote %q", v)
				}
			}
		})
	}
}

// bucketValue is a token bucket's stored state, as bucket.lua writes it:
// s, t, w as three little-endian doubles.
func bucketValue(s, t, w float64) string {
	var b [24]byte
	for i, v := range []float64{s, t, w} {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
	}
	return string(b[:])
}

// sameDecision compares Decisions with ResetAt as an instant, a
// composite's members included.
func sameDecision(a, b throttler.Decision) bool {
	if a.Allowed != b.Allowed || a.Degraded != b.Degraded || a.WouldDeny != b.WouldDeny || a.Limit != b.Limit ||
		a.Used != b.Used || a.Remaining != b.Remaining || a.ResetAt.UnixMilli() != b.ResetAt.UnixMilli() ||
		a.RetryAfter != b.RetryAfter || !a.At.Equal(b.At) {
		return false
	}
	// A composite's members: its Decisions compare == only as copies.
	var am, bm []throttler.Decision
	for _, d := range a.Members() {
		am = append(am, d)
	}
	for _, d := range b.Members() {
		bm = append(bm, d)
	}
	if len(am) != len(bm) {
		return false
	}
	for i := range am {
		if !sameDecision(am[i], bm[i]) {
			return false
		}
	}
	return true
}

// TestAlgorithmPeekOnReplica: a Peek of each algorithm runs on a read-only
// replica (the log's script there too: it writes nothing) and answers as
// the primary does once the replica has caught up.
func TestAlgorithmPeekOnReplica(t *testing.T) {
	primary, port := startRedis(t, "--repl-diskless-sync-delay", "0")
	replica, _ := startRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(port), "--replica-read-only", "yes")
	ctx := context.Background()
	for i := 0; ; i++ {
		info, err := replica.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			break
		} else if i == 300 {
			t.Fatalf("replica never synced: %v %s", err, info)
		}
		time.Sleep(10 * time.Millisecond) // the replica connecting, not the clock
	}
	onPrimary, err := NewSharded([]Shard{{Primary: primary}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	unused := &algFake{}
	onReplica, err := NewSharded([]Shard{{Primary: unused, Replicas: []Client{replica}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	at := backendtest.T0
	for _, p := range []throttler.Policy{
		throttler.PerSecond(10).WithBurst(20),
		throttler.PerSecond(10).WithAlgorithm(throttler.SlidingWindow),
		throttler.PerSecond(10).WithAlgorithm(throttler.SlidingLog),
	} {
		for i := range 4 {
			if _, err := onPrimary.Take(ctx, "k", p, 3, at.Add(time.Duration(i)*time.Millisecond)); err != nil {
				t.Fatal(err)
			}
		}
		if err := primary.Do(ctx, "WAIT", 1, 5000).Err(); err != nil {
			t.Fatal(err)
		}
		for _, now := range []time.Time{at.Add(5 * time.Millisecond), at.Add(999 * time.Millisecond), at.Add(3 * time.Second)} {
			want, err := onPrimary.Peek(ctx, "k", p, now)
			if err != nil {
				t.Fatal(err)
			}
			got, err := onReplica.Peek(ctx, "k", p, now)
			if err != nil {
				t.Fatalf("%v: Peek on the replica: %v", p.Algorithm, err)
			}
			if !sameDecision(got, want) {
				t.Errorf("%v at %v: replica %+v, primary %+v", p.Algorithm, now, got, want)
			}
		}
	}
	if len(unused.calls) != 0 {
		t.Errorf("the replica's primary was called: %v", unused.calls)
	}
}

// TestLogLongLogsMatchGo replays traces on sliding logs of thousands of
// units on a real Redis and on algo.Log: logs filled by clocks running
// ahead and back (units of one ms numbered after a later ms), Peeks and
// Takes too large to fit while the units end one by one (RetryAfter found
// by rank anywhere in the log), Takes of thousands of units, Refunds of
// many, and a log of the previous layout (one member per ms) at the
// unmarked key, which must be ignored. Every Decision must be equal.
func TestLogLongLogsMatchGo(t *testing.T) {
	rdb, _ := startRedis(t)
	b, err := NewSharded([]Shard{{Primary: rdb}}, &Options{ExpiryMargin: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ms := time.Millisecond
	policies := []throttler.Policy{
		{Name: "big", Limit: throttler.MaxLogLimit, Window: 4000 * ms, Algorithm: throttler.SlidingLog},
		{Name: "mid", Limit: 300, Window: 500 * ms, Algorithm: throttler.SlidingLog},
	}
	for _, p := range policies {
		t.Run(p.Name, func(t *testing.T) {
			w := p.Window.Milliseconds()
			now := backendtest.T0.UnixMilli()
			old, _ := b.storageKey(p, "k")
			sk, _ := b.algorithmKey(p, "k")
			for i := range int64(50) {
				if err := rdb.ZAdd(ctx, old, goredis.Z{Score: float64(now + i), Member: fmt.Sprintf("%d:%d", now+i, 7)}).Err(); err != nil {
					t.Fatal(err)
				}
			}
			var log []algo.LogEntry
			step := 0
			receipt := now + w // the latest admitted Take's ResetAt
			since := time.Now()
			call := func(op throttler.Op, cost int64) throttler.Decision {
				t.Helper()
				step++
				got, err := backend.Do(ctx, b, op, "k", p, cost, time.UnixMilli(receipt), time.UnixMilli(now))
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				if op == throttler.OpTake && got.Allowed {
					receipt = got.ResetAt.UnixMilli()
				}
				want, next, write := algo.Log(p, slices.Clone(log), op, cost, receipt, now)
				if write {
					log = next
				}
				if !sameDecision(got, want) {
					t.Fatalf("step %d: %v %d at %d (%d entries):\n got %+v\nwant %+v", step, op, cost, now, len(log), got, want)
				}
				if write {
					checkLogState(t, rdb, sk, now, w, time.Hour.Milliseconds(), op == throttler.OpTake, since)
				}
				return got
			}
			// Fill about a window, one unit a ms, with a clock that
			// sometimes runs ahead and comes back, and some ms taken
			// twice.
			rng := rand.New(rand.NewPCG(uint64(p.Limit), 1))
			for range w {
				now++
				if rng.IntN(20) == 0 {
					now += 3
					call(throttler.OpTake, 1)
					now -= 3
				}
				if rng.IntN(10) == 0 {
					call(throttler.OpTake, 1+rng.Int64N(3))
				}
				call(throttler.OpTake, 1)
			}
			// Peeks and Takes one unit too large, or needing a third or
			// two thirds of the live units to end, as the units end one
			// by one, from this clock and one behind it.
			base := now
			for _, frac := range []int64{0, 1, 5, 20, 33, 50, 51, 67, 90, 99, 100} {
				now = base + (w*frac)/100
				for range 2 {
					d := call(throttler.OpPeek, 0)
					for _, c := range []int64{d.Remaining + 1, d.Remaining + d.Used/3, d.Remaining + 2*d.Used/3, p.Limit} {
						if c >= 1 && c <= p.Limit {
							call(throttler.OpTake, c)
						}
					}
					now -= w / 3
				}
			}
			// Random steps: large costs, clocks back and ahead.
			now = base
			for range 3000 {
				switch r := rng.IntN(10); {
				case r < 6:
					now += int64(rng.IntN(3))
				case r < 8:
					now -= int64(rng.IntN(int(w)))
				default:
					now += int64(rng.IntN(int(w)))
				}
				op := []throttler.Op{throttler.OpTake, throttler.OpTake, throttler.OpPeek, throttler.OpRefund}[rng.IntN(4)]
				cost := []int64{1, 1, 1 + rng.Int64N(p.Limit), p.Limit, 1 + rng.Int64N(40)}[rng.IntN(5)]
				call(op, cost)
			}
			// After a pause: a log taken whole at one ms, refunded in
			// parts, then refilled unit by unit.
			now += 2 * w
			call(throttler.OpTake, p.Limit)
			for _, c := range []int64{1, 17, p.Limit / 2, p.Limit} {
				call(throttler.OpRefund, c)
				call(throttler.OpTake, 2)
			}
			for range 200 {
				now++
				call(throttler.OpTake, 1+rng.Int64N(3))
			}
			call(throttler.OpRefund, p.Limit)
			call(throttler.OpPeek, 0)
			if n, err := rdb.ZCard(ctx, old).Result(); err != nil || n != 50 {
				t.Errorf("the log of the previous layout: %d members, %v; want it untouched", n, err)
			}
		})
	}
}

// pttlSlack is what a PTTL read right after a write may lack beyond the
// time the test measured: Redis reads its clock in whole milliseconds, once
// for the script (its commands share the instant it started) and once for
// PTTL, and a fresh-clone CI run saw 2 ms with next to nothing elapsed.
const pttlSlack = 5 * time.Millisecond

// expiryRig runs an expiry table: a backend with a 2 s expiry margin on a
// Redis of its own, and the key of p's "k" there.
type expiryRig struct {
	t       *testing.T
	b       *Backend
	rdb     *goredis.Client
	p       throttler.Policy
	sk      string
	setSent time.Time // when the take that set the key's expiry was sent
}

// newExpiryRig starts the rig for p. The tables count from T0, which must
// lie offset ms into a period of period ms (a grid cell, or a window).
func newExpiryRig(t *testing.T, p throttler.Policy, period, offset int64) *expiryRig {
	t.Helper()
	if r := backendtest.T0.UnixMilli() % period; r != offset {
		t.Fatalf("T0 is %d ms into its %d ms period; the table assumes %d", r, period, offset)
	}
	rdb, _ := startRedis(t)
	b, err := NewSharded([]Shard{{Primary: rdb}}, &Options{ExpiryMargin: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	sk, _ := b.algorithmKey(p, "k")
	return &expiryRig{t: t, b: b, rdb: rdb, p: p, sk: sk}
}

// take takes cost at T0+at, wants it allowed or not, then wants the key's
// PTTL to be want, run down since the take that set it was sent (this one
// when sets) plus pttlSlack, however loaded the machine.
func (r *expiryRig) take(at time.Duration, cost int64, allowed bool, want time.Duration, sets bool) {
	r.t.Helper()
	if sent := time.Now(); sets {
		r.setSent = sent
	}
	ctx := context.Background()
	if d, err := r.b.Take(ctx, "k", r.p, cost, backendtest.T0.Add(at)); err != nil || d.Allowed != allowed {
		r.t.Fatalf("take of %d at T0%+v: %+v, %v; want allowed %v", cost, at, d, err, allowed)
	}
	ttl, err := r.rdb.PTTL(ctx, r.sk).Result()
	if err != nil {
		r.t.Fatal(err)
	}
	if ttl > want || ttl < want-time.Since(r.setSent)-pttlSlack {
		r.t.Errorf("after a take at T0%+v: PTTL %v, want %v", at, ttl, want)
	}
}

// checkLogState checks a log after a write at t: after a take, no unit
// that ended by t is stored, and the key expires no sooner than when the
// newest unit ends plus the margin, a duration from t (TestLogExpiry pins
// the grid it is set on); after a refund, it still expires. since is when
// the trace's first call was sent: the expiry was set by a call after it
// and has run down since.
func checkLogState(t *testing.T, rdb *goredis.Client, sk string, now, w, margin int64, took bool, since time.Time) {
	t.Helper()
	ctx := context.Background()
	top, err := rdb.ZRevRangeWithScores(ctx, sk, 0, 0).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(top) == 0 {
		return // a refund emptied the log: the key went with its last member
	}
	ttl := rdb.PTTL(ctx, sk).Val()
	elapsed := time.Since(since)
	if ttl <= 0 {
		t.Fatalf("PTTL %v: no expiry", ttl)
	}
	if !took {
		return
	}
	if n := rdb.ZCount(ctx, sk, "-inf", strconv.FormatInt(now-w, 10)).Val(); n != 0 {
		t.Errorf("%d units that ended by %d still stored after a take", n, now)
	}
	// The expiry runs down from when a script set it, after since: allow
	// what has elapsed since (a loaded machine can take hundreds of ms),
	// plus pttlSlack.
	want := time.Duration(int64(top[0].Score)+w-now+margin) * time.Millisecond
	if ttl < want-elapsed-pttlSlack {
		t.Errorf("PTTL %v after a take at %d, want at least %v", ttl, now, want)
	}
}

// TestLogExpiry pins the sliding log's expiry after a take: a duration from
// the caller's now to the end of the grid cell (min(window, margin) ms,
// aligned to the epoch) holding the newest unit's end, plus the margin. A
// take at or after the newest unit whose own unit ends in that cell leaves
// it as it was; a later cell, a clock behind the newest unit and a log whose
// units all ended set it again.
func TestLogExpiry(t *testing.T) {
	// T0 is 1250 ms into a 2 s cell: cells start at T0+750ms+2s·k.
	r := newExpiryRig(t, throttler.Policy{Name: "exp", Limit: 100, Window: 4 * time.Second, Algorithm: throttler.SlidingLog}, 2000, 1250)
	s, ms := time.Second, time.Millisecond
	for _, step := range []struct {
		at   time.Duration // the take's now from T0
		want time.Duration // the PTTL after it
		sets bool          // whether this take sets the expiry
	}{
		{0, 6750 * ms, true},           // newest ends at +4s, in [+2.75s, +4.75s)
		{500 * ms, 6750 * ms, false},   // ends at +4.5s: the same cell
		{1 * s, 7750 * ms, true},       // +5s: the next cell, to +6.75s
		{-2 * s, 10750 * ms, true},     // a clock behind the newest: from its own now
		{2700 * ms, 10750 * ms, false}, // ends at +6.7s: the newest's cell
		{2750 * ms, 8 * s, true},       // +6.75s: the next cell, to +8.75s
		{2750 * ms, 8 * s, false},      // the newest's ms again
		{10 * s, 6750 * ms, true},      // all ended (the key went): to +14.75s
	} {
		r.take(step.at, 1, true, step.want, step.sets)
	}
}

// TestBucketExpiry pins the token bucket's expiry after a write: a duration
// from the caller's now to the end of the grid cell (min(window, margin)
// ms, aligned to the epoch) holding the time the bucket is full again, plus
// the margin. A write whose end falls in the cell of the state it read, or
// an earlier one, keeps the expiry (a clock behind included); a later cell
// sets it; a denied take writes nothing.
func TestBucketExpiry(t *testing.T) {
	// One token a second, 4 at most: 4000 scaled units a token, 4 a ms.
	// T0 is 1250 ms into a 2 s cell: cells start at T0+750ms+2s·k.
	r := newExpiryRig(t, throttler.Policy{Name: "exp", Limit: 4, Window: 4 * time.Second, Algorithm: throttler.TokenBucket}, 2000, 1250)
	ms := time.Millisecond
	for _, step := range []struct {
		at      time.Duration // the take's now from T0
		cost    int64
		allowed bool
		want    time.Duration // the PTTL after it
		sets    bool          // whether this take sets the expiry
	}{
		{0, 1, true, 4750 * ms, true},            // 3 tokens left, full at +1s, in [+0.75s, +2.75s)
		{100 * ms, 1, true, 4750 * ms, false},    // 2.1 left, full at +2s: the same cell
		{200 * ms, 1, true, 6550 * ms, true},     // 1.2 left, full at +3s: the next cell, to +4.75s
		{-1000 * ms, 1, true, 6550 * ms, false},  // a clock behind: 0.2 left, full at +4s, that cell
		{3000 * ms, 1, true, 5750 * ms, true},    // 2 left, full at +5s: the next cell, to +6.75s
		{20000 * ms, 1, true, 4750 * ms, true},   // full long ago: 3 left, full at +21s, to +22.75s
		{20000 * ms, 4, false, 4750 * ms, false}, // denied: nothing written
	} {
		r.take(step.at, step.cost, step.allowed, step.want, step.sets)
	}
}

// TestCounterExpiry pins the sliding-window counter's expiry after a write:
// a duration from the caller's now to the end of the window after the
// counted one, plus the margin, set by the first write of a window and
// kept by the others (a clock behind, answered in the stored window,
// included).
func TestCounterExpiry(t *testing.T) {
	// T0 is 3250 ms into its 4 s window: windows start at T0+750ms+4s·j.
	r := newExpiryRig(t, throttler.Policy{Name: "exp", Limit: 100, Window: 4 * time.Second, Algorithm: throttler.SlidingWindow}, 4000, 3250)
	ms := time.Millisecond
	for _, step := range []struct {
		at   time.Duration // the take's now from T0
		want time.Duration // the PTTL after it
		sets bool          // whether this take sets the expiry
	}{
		{0, 6750 * ms, true},          // window to +0.75s: expires at +4.75s+2s
		{500 * ms, 6750 * ms, false},  // the same window
		{1000 * ms, 9750 * ms, true},  // the next: +8.75s+2s
		{100 * ms, 9750 * ms, false},  // a clock behind: answered in the stored window
		{20000 * ms, 6750 * ms, true}, // later windows: +24.75s+2s
	} {
		r.take(step.at, 1, true, step.want, step.sets)
	}
}

// TestAlgorithmKeys: the key of a token bucket, a sliding log or a
// sliding-window counter is its storage key with '+' after the tag (same
// slot and shard), which no fixed window's has there.
func TestAlgorithmKeys(t *testing.T) {
	b, err := NewSharded([]Shard{{Primary: &algFake{}}}, &Options{Prefix: "p:"})
	if err != nil {
		t.Fatal(err)
	}
	fw := throttler.PerSecond(3)
	plainFW, _ := b.storageKey(fw, "k{x}")
	tag := len("p:") + tagLen
	if c := plainFW[tag]; c < '0' || c > '9' {
		t.Errorf("fixed-window key %q has no digit after its tag", plainFW)
	}
	for _, a := range []throttler.Algorithm{throttler.TokenBucket, throttler.SlidingLog, throttler.SlidingWindow} {
		p := fw.WithAlgorithm(a)
		plain, h := b.storageKey(p, "k{x}")
		got, gotH := b.algorithmKey(p, "k{x}")
		if want := plain[:tag] + "+" + plain[tag:]; got != want || gotH != h {
			t.Errorf("%v: key %q (hash %x), want %q (hash %x)", a, got, gotH, want, h)
		}
	}
}

// TestLogNewestOfAnotherShape: log.lua reads the newest member's score from
// its name, "<at>:<j>"; a member named otherwise is read by its score, so a
// log holding one still answers from the scores.
func TestLogNewestOfAnotherShape(t *testing.T) {
	rdb, _ := startRedis(t)
	b, err := NewSharded([]Shard{{Primary: rdb}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p := throttler.Policy{Name: "shape", Limit: 3, Window: time.Second, Algorithm: throttler.SlidingLog}
	sk, _ := b.algorithmKey(p, "k")
	t0 := backendtest.T0
	if _, err := b.Take(ctx, "k", p, 1, t0); err != nil {
		t.Fatal(err)
	}
	newest := t0.Add(500 * time.Millisecond)
	if err := rdb.ZAdd(ctx, sk, goredis.Z{Score: float64(newest.UnixMilli()), Member: "another shape"}).Err(); err != nil {
		t.Fatal(err)
	}
	for _, op := range []throttler.Op{throttler.OpPeek, throttler.OpTake} {
		now := t0.Add(600 * time.Millisecond)
		var d throttler.Decision
		if op == throttler.OpPeek {
			d, err = b.Peek(ctx, "k", p, now)
		} else {
			d, err = b.Take(ctx, "k", p, 1, now)
		}
		want := throttler.Decision{Allowed: true, Limit: 3, Used: 2, Remaining: 1, ResetAt: newest.Add(time.Second)}
		if op == throttler.OpTake {
			want.Used, want.Remaining, want.ResetAt = 3, 0, now.Add(time.Second)
		}
		if err != nil || !d.ResetAt.Equal(want.ResetAt) || d.Allowed != want.Allowed || d.Used != want.Used || d.Remaining != want.Remaining || d.RetryAfter != want.RetryAfter {
			t.Errorf("%v at +600ms: %+v, %v; want %+v", op, d, err, want)
		}
	}
}

// FuzzPackedReplies feeds the bucket, counter and log scripts' replies of
// any bytes: each call must be an error or a Decision that keeps the
// contract's invariants, never a panic.
func FuzzPackedReplies(f *testing.F) {
	ms := backendtest.T0.UnixMilli()
	f.Add(uint8(0), []byte(pack(1, 0, 0, 0, 0, 19000, ms)))
	f.Add(uint8(1), []byte(pack(0, 1, ms/1000, 4, 0, 1000, ms/1000, 4, 0)))
	f.Add(uint8(2), []byte(pack(0, 10, ms+900, 250)))
	f.Add(uint8(2), []byte(pack(1, math.NaN(), ms, 0)))
	f.Add(uint8(1), []byte("OK"))
	policies := []throttler.Policy{
		throttler.PerSecond(10).WithBurst(20).Named("tb"),
		throttler.PerSecond(10).WithAlgorithm(throttler.SlidingWindow).Named("sw"),
		throttler.PerSecond(10).WithAlgorithm(throttler.SlidingLog).Named("sl"),
	}
	f.Fuzz(func(t *testing.T, which uint8, reply []byte) {
		p := policies[int(which)%len(policies)]
		b, err := NewSharded([]Shard{{Primary: &algFake{reply: string(reply)}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, op := range []throttler.Op{throttler.OpTake, throttler.OpPeek, throttler.OpRefund} {
			d, err := backend.Do(context.Background(), b, op, "k", p, 1, backendtest.T0.Add(time.Second), backendtest.T0)
			if err != nil {
				if !errors.Is(err, ErrUnexpectedReply) || !strings.HasPrefix(err.Error(), "redis: ") {
					t.Fatalf("%v: %v", op, err)
				}
				continue
			}
			if d.Used < 0 || d.Limit != p.Capacity() || d.Remaining != max(0, d.Limit-d.Used) || d.RetryAfter < 0 {
				t.Fatalf("%v: reply %x gave %+v", op, reply, d)
			}
		}
	})
}
