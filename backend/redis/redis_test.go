package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/throttler"
)

// fakeClient answers with canned replies and records what it was sent. It
// checks reply handling only; the semantics are proven against real Redis
// servers in the integration module.
type fakeClient struct {
	goredis.Scripter // the methods the backend must not call: nil, so they panic

	evalVal   any
	refundVal any // refund's reply, when set: its script has 3 arguments
	evalErr   error
	noScript  bool // EVALSHA fails with NOSCRIPT
	hmgetVal  []any
	hmgetErr  error
	calls     []string
	lastKeys  []string
	lastArgs  []any
}

func (f *fakeClient) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *goredis.Cmd {
	f.calls = append(f.calls, "evalsha")
	if f.noScript {
		cmd := goredis.NewCmd(ctx)
		cmd.SetErr(goredis.ErrNoScript)
		return cmd
	}
	return f.eval(ctx, keys, args)
}

func (f *fakeClient) Eval(ctx context.Context, script string, keys []string, args ...any) *goredis.Cmd {
	f.calls = append(f.calls, "eval")
	return f.eval(ctx, keys, args)
}

func (f *fakeClient) eval(ctx context.Context, keys []string, args []any) *goredis.Cmd {
	f.lastKeys, f.lastArgs = keys, args
	cmd := goredis.NewCmd(ctx)
	cmd.SetVal(f.evalVal)
	if f.refundVal != nil && len(args) == 3 {
		cmd.SetVal(f.refundVal)
	}
	cmd.SetErr(f.evalErr)
	return cmd
}

func (f *fakeClient) HMGet(ctx context.Context, key string, fields ...string) *goredis.SliceCmd {
	f.calls = append(f.calls, "hmget")
	f.lastKeys = []string{key}
	cmd := goredis.NewSliceCmd(ctx)
	cmd.SetVal(f.hmgetVal)
	cmd.SetErr(f.hmgetErr)
	return cmd
}

// newBackend is New for a client that cannot be wrong.
func newBackend(t testing.TB, c Client, opts *Options) *Backend {
	t.Helper()
	b, err := New(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var (
	t0     = time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	policy = throttler.Policy{Name: "api", Limit: 10, Window: time.Minute}
	ms     = t0.UnixMilli()
	reset  = ms + time.Minute.Milliseconds()
)

func TestTakeSendsWindowAsDurations(t *testing.T) {
	f := &fakeClient{evalVal: []any{int64(1), int64(3), reset}}
	b := newBackend(t, f, &Options{ExpiryMargin: 2 * time.Second})
	d, err := b.Take(context.Background(), "k", policy, 3, t0.Add(700*time.Microsecond))
	if err != nil {
		t.Fatal(err)
	}
	// now, reset-at of a window opened now, limit, cost, expiry as a duration.
	want := fmt.Sprint([]any{ms, reset, int64(10), int64(3), int64(62000)})
	if got := fmt.Sprint(f.lastArgs); got != want {
		t.Errorf("script args = %s, want %s", got, want)
	}
	if sk, _ := b.storageKey(policy, "k"); len(f.lastKeys) != 1 || f.lastKeys[0] != sk {
		t.Errorf("script keys = %q, want [%q]", f.lastKeys, sk)
	}
	wantD := throttler.Decision{Allowed: true, Limit: 10, Used: 3, Remaining: 7, ResetAt: time.UnixMilli(reset)}
	if d != wantD {
		t.Errorf("Take = %+v, want %+v", d, wantD)
	}
}

func TestScriptFallsBackToEvalOnNoScript(t *testing.T) {
	f := &fakeClient{noScript: true, evalVal: []any{int64(1), int64(1), reset}}
	if _, err := newBackend(t, f, nil).Take(context.Background(), "k", policy, 1, t0); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(f.calls, ","); got != "evalsha,eval" {
		t.Errorf("calls = %s, want evalsha,eval", got)
	}
}

func TestTakeReplies(t *testing.T) {
	tests := []struct {
		name  string
		reply any
		err   error
		want  throttler.Decision
		isErr error
	}{
		{name: "allowed", reply: []any{int64(1), int64(10), reset},
			want: throttler.Decision{Allowed: true, Limit: 10, Used: 10, Remaining: 0, ResetAt: time.UnixMilli(reset)}},
		{name: "denied in open window", reply: []any{int64(0), int64(10), reset},
			want: throttler.Decision{Limit: 10, Used: 10, ResetAt: time.UnixMilli(reset), RetryAfter: time.Minute}},
		{name: "denied, no window", reply: []any{int64(0), int64(0), ms},
			want: throttler.Decision{Limit: 10, Remaining: 10, ResetAt: t0.Add(time.Minute), RetryAfter: time.Minute}},
		{name: "server error", err: errors.New("LOADING"), isErr: nil},
		{name: "nil", reply: nil, err: goredis.Nil, isErr: ErrUnexpectedReply},
		{name: "not an array", reply: "OK", isErr: ErrUnexpectedReply},
		{name: "short", reply: []any{int64(1), int64(1)}, isErr: ErrUnexpectedReply},
		{name: "long", reply: []any{int64(1), int64(1), reset, int64(0)}, isErr: ErrUnexpectedReply},
		{name: "string value", reply: []any{int64(1), "1", reset}, isErr: ErrUnexpectedReply},
		{name: "nil value", reply: []any{int64(1), nil, reset}, isErr: ErrUnexpectedReply},
		{name: "allowed out of range", reply: []any{int64(2), int64(1), reset}, isErr: ErrUnexpectedReply},
		{name: "negative used", reply: []any{int64(1), int64(-1), reset}, isErr: ErrUnexpectedReply},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeClient{evalVal: tt.reply, evalErr: tt.err}
			d, err := newBackend(t, f, nil).Take(context.Background(), "k", policy, 1, t0)
			if tt.err != nil || tt.isErr != nil {
				if err == nil {
					t.Fatalf("Take = %+v, want an error", d)
				}
				if !strings.HasPrefix(err.Error(), "redis: take ") {
					t.Errorf("error %q lacks the package prefix", err)
				}
				if tt.isErr != nil && !errors.Is(err, tt.isErr) {
					t.Errorf("error %v, want %v", err, tt.isErr)
				}
				if tt.isErr == nil && !errors.Is(err, tt.err) {
					t.Errorf("error %v does not wrap %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d != tt.want {
				t.Errorf("Take = %+v, want %+v", d, tt.want)
			}
		})
	}
}

func TestRefundReplies(t *testing.T) {
	tests := []struct {
		name  string
		reply any
		want  throttler.Decision
		isErr bool
	}{
		{name: "open window", reply: []any{int64(4), reset},
			want: throttler.Decision{Allowed: true, Limit: 10, Used: 4, Remaining: 6, ResetAt: time.UnixMilli(reset)}},
		{name: "no window", reply: []any{int64(0), ms},
			want: throttler.Decision{Allowed: true, Limit: 10, Remaining: 10, ResetAt: t0.Add(time.Minute)}},
		{name: "short", reply: []any{int64(4)}, isErr: true},
		{name: "negative used", reply: []any{int64(-4), reset}, isErr: true},
		{name: "bulk string", reply: []any{"4", reset}, isErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeClient{evalVal: tt.reply}
			d, err := newBackend(t, f, nil).Refund(context.Background(), "k", policy, 2, t0.Add(policy.Window), t0)
			if tt.isErr {
				if !errors.Is(err, ErrUnexpectedReply) || !strings.HasPrefix(err.Error(), "redis: refund ") {
					t.Fatalf("Refund = %+v, %v; want a wrapped ErrUnexpectedReply", d, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d != tt.want {
				t.Errorf("Refund = %+v, want %+v", d, tt.want)
			}
			if got := fmt.Sprint(f.lastArgs); got != fmt.Sprint([]any{ms, int64(2), ms + time.Minute.Milliseconds()}) {
				t.Errorf("script args = %s", got)
			}
		})
	}
}

func TestPeekReplies(t *testing.T) {
	r := fmt.Sprint(reset)
	tests := []struct {
		name  string
		reply []any
		now   time.Time
		want  throttler.Decision
		isErr bool
	}{
		{name: "open window", reply: []any{"4", r}, now: t0,
			want: throttler.Decision{Allowed: true, Limit: 10, Used: 4, Remaining: 6, ResetAt: time.UnixMilli(reset)}},
		{name: "full window", reply: []any{"12", r}, now: t0,
			want: throttler.Decision{Limit: 10, Used: 12, ResetAt: time.UnixMilli(reset), RetryAfter: time.Minute}},
		{name: "absent", reply: []any{nil, nil}, now: t0,
			want: throttler.Decision{Allowed: true, Limit: 10, Remaining: 10, ResetAt: t0.Add(time.Minute)}},
		// A replica still holding a window that ended: fresh, never "denied
		// with Remaining == Limit".
		{name: "ended, still stored", reply: []any{"10", r}, now: time.UnixMilli(reset),
			want: throttler.Decision{Allowed: true, Limit: 10, Remaining: 10, ResetAt: time.UnixMilli(reset).Add(time.Minute)}},
		{name: "garbage fields read as absent", reply: []any{"x", r}, now: t0,
			want: throttler.Decision{Allowed: true, Limit: 10, Remaining: 10, ResetAt: t0.Add(time.Minute)}},
		{name: "wrong count", reply: []any{"4"}, now: t0, isErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeClient{hmgetVal: tt.reply}
			d, err := newBackend(t, f, nil).Peek(context.Background(), "k", policy, tt.now)
			if tt.isErr {
				if !errors.Is(err, ErrUnexpectedReply) || !strings.HasPrefix(err.Error(), "redis: peek ") {
					t.Fatalf("Peek = %+v, %v; want a wrapped ErrUnexpectedReply", d, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d != tt.want {
				t.Errorf("Peek = %+v, want %+v", d, tt.want)
			}
		})
	}
}

// Peeks read the replicas in turn; one that fails fails its Peek and is
// skipped while it rests, the others serving in its place.
func TestPeekReadsReplicasInTurnSkippingAFailedOne(t *testing.T) {
	r := fmt.Sprint(reset)
	primary := &fakeClient{hmgetVal: []any{"1", r}}
	good := &fakeClient{hmgetVal: []any{"2", r}}
	down := &fakeClient{hmgetErr: errors.New("dial tcp: connection refused")}
	b, err := NewSharded([]Shard{{Primary: primary, Replicas: []Client{good, down}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.mono = func() time.Duration { return 0 }
	var used []string
	for range 4 {
		d, err := b.Peek(context.Background(), "k", policy, t0)
		if err != nil {
			used = append(used, "failed")
			continue
		}
		used = append(used, fmt.Sprint(d.Used))
	}
	if got := fmt.Sprint(used); got != "[2 failed 2 2]" {
		t.Errorf("Used over 4 peeks = %s, want [2 failed 2 2] (in turn, then the good replica while the other rests)", got)
	}
	if len(primary.calls) != 0 || len(good.calls) != 3 || len(down.calls) != 1 {
		t.Errorf("calls: primary %d, good replica %d, failing replica %d; want 0, 3, 1", len(primary.calls), len(good.calls), len(down.calls))
	}
	if got := b.store(throttler.OpPeek, "k", policy); got != "redis replicas" {
		t.Errorf("Store %q with one replica serving, want the replicas'", got)
	}
}

func TestWritesGoToTheKeysShard(t *testing.T) {
	shards := make([]Shard, 4)
	fakes := make([]*fakeClient, 4)
	for i := range shards {
		fakes[i] = &fakeClient{evalVal: []any{int64(1), int64(1), reset}, refundVal: []any{int64(0), reset}, hmgetVal: []any{nil, nil}}
		shards[i] = Shard{Primary: fakes[i], Replicas: []Client{fakes[i]}}
	}
	b, err := NewSharded(shards, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		key := fmt.Sprint("user-", i)
		_, h := b.storageKey(policy, key)
		want := fakes[jumpHash(h, 4)]
		for _, op := range []string{"take", "refund", "peek"} {
			for _, f := range fakes {
				f.calls = nil
			}
			var err error
			switch op {
			case "take":
				_, err = b.Take(context.Background(), key, policy, 1, t0)
			case "refund":
				_, err = b.Refund(context.Background(), key, policy, 1, t0.Add(policy.Window), t0)
			case "peek":
				_, err = b.Peek(context.Background(), key, policy, t0)
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range fakes {
				if (len(f.calls) > 0) != (f == want) {
					t.Fatalf("%s %q: shard calls %v, want only shard %d", op, key, f.calls, jumpHash(h, 4))
				}
			}
		}
	}
}

func TestBadInput(t *testing.T) {
	f := &fakeClient{}
	b := newBackend(t, f, nil)
	ctx := context.Background()
	tests := []struct {
		name string
		key  string
		p    throttler.Policy
		cost int64
		want error
	}{
		{"empty key", "", policy, 1, throttler.ErrInvalidKey},
		{"zero limit", "k", throttler.Policy{Window: time.Second}, 1, throttler.ErrInvalidPolicy},
		{"zero cost", "k", policy, 0, throttler.ErrInvalidCost},
		{"limit above MaxLimit", "k", throttler.Policy{Limit: MaxLimit + 1, Window: time.Second}, 1, throttler.ErrInvalidPolicy},
		{"cost above MaxLimit", "k", policy, MaxLimit + 1, throttler.ErrInvalidCost},
		// A Take above the limit could never be admitted; a Refund of as
		// much is fine (it clamps), so it is checked below.
		{"take above the limit", "k", policy, policy.Limit + 1, throttler.ErrInvalidCost},
	}
	for _, tt := range tests {
		if _, err := b.Take(ctx, tt.key, tt.p, tt.cost, t0); !errors.Is(err, tt.want) {
			t.Errorf("%s: Take error %v, want %v", tt.name, err, tt.want)
		}
		if tt.name == "take above the limit" {
			continue
		}
		if _, err := b.Refund(ctx, tt.key, tt.p, tt.cost, t0.Add(time.Second), t0); !errors.Is(err, tt.want) {
			t.Errorf("%s: Refund error %v, want %v", tt.name, err, tt.want)
		}
		if tt.want != throttler.ErrInvalidCost {
			if _, err := b.Peek(ctx, tt.key, tt.p, t0); !errors.Is(err, tt.want) {
				t.Errorf("%s: Peek error %v, want %v", tt.name, err, tt.want)
			}
		}
	}
	if len(f.calls) != 0 {
		t.Errorf("bad input reached Redis: %v", f.calls)
	}
}

func TestConstructionErrors(t *testing.T) {
	var nilClient *goredis.Client // a typed nil: an unassigned variable
	good := &fakeClient{}
	tests := []struct {
		name   string
		new    func() (*Backend, error)
		want   string // a fragment naming the bad field
		wantIs error
	}{
		{"New nil client", func() (*Backend, error) { return New(nil, nil) }, "redis: the Client is nil", nil},
		{"New typed-nil client", func() (*Backend, error) { return New(nilClient, nil) }, "redis: the Client is a nil *redis.Client", nil},
		{"New prefix with {", func() (*Backend, error) { return New(good, &Options{Prefix: "a{b"}) },
			`redis: Options.Prefix "a{b" holds a brace, which would move the hash tag`, nil},
		{"New prefix with }", func() (*Backend, error) { return New(good, &Options{Prefix: "a}"}) }, "Options.Prefix", nil},
		{"New prefix with a tag", func() (*Backend, error) { return New(good, &Options{Prefix: "x{y}:"}) }, "Options.Prefix", nil},
		{"New negative ExpiryMargin", func() (*Backend, error) { return New(good, &Options{ExpiryMargin: -time.Second}) },
			"redis: Options.ExpiryMargin must be >= 0 (0: the default, 1s), got -1s", nil},
		{"NewSharded nil", func() (*Backend, error) { return NewSharded(nil, nil) }, "redis: no shards", ErrNoShards},
		{"NewSharded empty", func() (*Backend, error) { return NewSharded([]Shard{}, nil) }, "redis: no shards", ErrNoShards},
		{"NewSharded no primary", func() (*Backend, error) { return NewSharded([]Shard{{Primary: good}, {}}, nil) },
			"redis: shards[1].Primary is nil", nil},
		{"NewSharded typed-nil primary", func() (*Backend, error) { return NewSharded([]Shard{{Primary: nilClient}}, nil) },
			"redis: shards[0].Primary is a nil *redis.Client", nil},
		{"NewSharded nil replica", func() (*Backend, error) {
			return NewSharded([]Shard{{Primary: good}, {Primary: good, Replicas: []Client{good, nil}}}, nil)
		}, "redis: shards[1].Replicas[1] is nil", nil},
		{"NewSharded typed-nil replica", func() (*Backend, error) {
			return NewSharded([]Shard{{Primary: good, Replicas: []Client{nilClient}}}, nil)
		}, "redis: shards[0].Replicas[0] is a nil *redis.Client", nil},
		{"NewSharded prefix with a brace", func() (*Backend, error) {
			return NewSharded([]Shard{{Primary: good}}, &Options{Prefix: "{"})
		}, "redis: Options.Prefix", nil},
		{"NewSharded negative ExpiryMargin", func() (*Backend, error) {
			return NewSharded([]Shard{{Primary: good}}, &Options{ExpiryMargin: -1})
		}, "redis: Options.ExpiryMargin", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := tt.new()
			if err == nil || b != nil {
				t.Fatalf("got %v, %v; want an error", b, err)
			}
			if !strings.Contains(err.Error(), tt.want) || strings.Count(err.Error(), "redis:") != 1 {
				t.Errorf("error %q, want one prefix and %q", err, tt.want)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("error %v, want %v", err, tt.wantIs)
			}
		})
	}
}

// TestOptionDefaults: zero means the default, and a margin below a
// millisecond still keeps the key a millisecond past its reset-at.
func TestOptionDefaults(t *testing.T) {
	for _, tt := range []struct {
		opts     *Options
		prefix   string
		marginMS int64
	}{
		{nil, "throttlekit:", 1000},
		{&Options{}, "throttlekit:", 1000},
		{&Options{Prefix: "rl:", ExpiryMargin: 2500 * time.Millisecond}, "rl:", 2500},
		{&Options{ExpiryMargin: time.Microsecond}, "throttlekit:", 1},
	} {
		b := newBackend(t, &fakeClient{}, tt.opts)
		if b.prefix != tt.prefix || b.marginMS != tt.marginMS {
			t.Errorf("%+v: prefix %q margin %dms, want %q %dms", tt.opts, b.prefix, b.marginMS, tt.prefix, tt.marginMS)
		}
	}
}

// FuzzReplies feeds Take, Refund and Peek replies of every shape: each
// must be an error or a Decision that keeps the contract's invariants,
// never a panic.
func FuzzReplies(f *testing.F) {
	f.Add(uint8(0), int64(1), int64(3), reset, "4", fmt.Sprint(reset))
	f.Add(uint8(1), int64(0), int64(0), ms, "", "")
	f.Add(uint8(2), int64(-1), int64(1<<62), int64(-1<<62), "x", "-5")
	f.Add(uint8(5), int64(2), int64(1), int64(0), "9223372036854775807", "9223372036854775807")
	f.Fuzz(func(t *testing.T, shape uint8, a, b, c int64, s1, s2 string) {
		var reply any
		switch shape % 6 {
		case 0:
			reply = []any{a, b, c}
		case 1:
			reply = []any{a, b}
		case 2:
			reply = []any{a, s1, c}
		case 3:
			reply = s1
		case 4:
			reply = []any{[]any{a}, b, c}
		case 5:
			reply = a
		}
		var hm []any
		switch shape / 6 % 4 {
		case 0:
			hm = []any{s1, s2}
		case 1:
			hm = []any{nil, s2}
		case 2:
			hm = []any{s1}
		case 3:
			hm = []any{a, b}
		}
		fc := &fakeClient{evalVal: reply, hmgetVal: hm}
		be := newBackend(t, fc, nil)
		ctx := context.Background()
		check := func(op string, d throttler.Decision, err error) {
			if err != nil {
				if !strings.HasPrefix(err.Error(), "redis: ") {
					t.Fatalf("%s: error %q lacks the package prefix", op, err)
				}
				return
			}
			if d.Used < 0 || d.Remaining != max(0, d.Limit-d.Used) || !d.ResetAt.After(t0) {
				t.Fatalf("%s: reply %v / %v gave %+v", op, reply, hm, d)
			}
		}
		d, err := be.Take(ctx, "k", policy, 1, t0)
		check("take", d, err)
		d, err = be.Refund(ctx, "k", policy, 1, t0.Add(policy.Window), t0)
		check("refund", d, err)
		d, err = be.Peek(ctx, "k", policy, t0)
		check("peek", d, err)
	})
}

// Only an AutoPipeliner, on any shard, makes the backend say it ignores
// its context: its blocking calls wait for their batch whatever the context
// says, so a Throttler must detach them.
func TestIgnoresContextOnlyOverAnAutoPipeliner(t *testing.T) {
	plain := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = plain.Close() })
	ap, err := plain.AutoPipeline()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		shards []Shard
		want   bool
	}{
		{"plain client", []Shard{{Primary: plain}}, false},
		{"fake clients", []Shard{{Primary: &fakeClient{}, Replicas: []Client{&fakeClient{}}}}, false},
		{"autopipeliner", []Shard{{Primary: ap}}, true},
		{"autopipeliner replica of a second shard", []Shard{{Primary: plain}, {Primary: plain, Replicas: []Client{ap}}}, true},
	} {
		b, err := NewSharded(tc.shards, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := b.ignoresContext(); got != tc.want {
			t.Errorf("%s: ignoresContext() = %v, want %v", tc.name, got, tc.want)
		}
	}
}
