package backend_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

var t0 = time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)

func TestValidateCall(t *testing.T) {
	p := throttler.PerMinute(10).Named("api")
	tests := []struct {
		name string
		op   throttler.Op
		key  string
		p    throttler.Policy
		cost int64
		want error
	}{
		{"take", throttler.OpTake, "k", p, 1, nil},
		{"take the whole limit", throttler.OpTake, "k", p, 10, nil},
		{"take above the limit", throttler.OpTake, "k", p, 11, throttler.ErrInvalidCost},
		{"take zero", throttler.OpTake, "k", p, 0, throttler.ErrInvalidCost},
		{"take negative", throttler.OpTake, "k", p, -1, throttler.ErrInvalidCost},
		{"peek ignores cost", throttler.OpPeek, "k", p, 0, nil},
		{"peek ignores a huge cost", throttler.OpPeek, "k", p, throttler.MaxLimit + 1, nil},
		{"refund above the limit clamps later", throttler.OpRefund, "k", p, throttler.MaxLimit, nil},
		{"refund above MaxLimit", throttler.OpRefund, "k", p, throttler.MaxLimit + 1, throttler.ErrInvalidCost},
		{"refund zero", throttler.OpRefund, "k", p, 0, throttler.ErrInvalidCost},
		{"empty key", throttler.OpTake, "", p, 1, throttler.ErrInvalidKey},
		{"longest key", throttler.OpTake, strings.Repeat("k", throttler.MaxKeyLen), p, 1, nil},
		{"key too long", throttler.OpPeek, strings.Repeat("k", throttler.MaxKeyLen+1), p, 1, throttler.ErrInvalidKey},
		{"binary key", throttler.OpTake, "\x00\xff{}: ", p, 1, nil},
		{"zero policy", throttler.OpPeek, "k", throttler.Policy{}, 1, throttler.ErrInvalidPolicy},
		{"name with a space", throttler.OpTake, "k", p.Named("a b"), 1, throttler.ErrInvalidPolicy},
		{"key checked before policy", throttler.OpTake, "", throttler.Policy{}, 0, throttler.ErrInvalidKey},
	}
	for _, tc := range tests {
		assertInputError(t, throttler.ValidateCall(tc.op, tc.key, tc.p, tc.cost, time.UnixMilli(1)), tc.want, tc.name)
	}
}

// recorder is a Backend that records which method was called with what.
type recorder struct{ calls []string }

// recorderValue is a backend held by value, not by pointer.
type recorderValue struct{ throttler.Backend }

func (r *recorder) Take(_ context.Context, key string, _ throttler.Policy, cost int64, _ time.Time) (throttler.Decision, error) {
	r.calls = append(r.calls, fmt.Sprintf("Take %s %d", key, cost))
	return throttler.Decision{Allowed: true}, nil
}

func (r *recorder) Peek(_ context.Context, key string, _ throttler.Policy, _ time.Time) (throttler.Decision, error) {
	r.calls = append(r.calls, "Peek "+key)
	return throttler.Decision{Allowed: true}, nil
}

func (r *recorder) Refund(_ context.Context, key string, _ throttler.Policy, cost int64, receipt, _ time.Time) (throttler.Decision, error) {
	r.calls = append(r.calls, fmt.Sprintf("Refund %s %d of %d", key, cost, receipt.UnixMilli()))
	return throttler.Decision{Allowed: true}, nil
}

func TestDo(t *testing.T) {
	p := throttler.PerMinute(10)
	tests := []struct {
		op      throttler.Op
		want    string // the call made; "" for none
		wantErr error
	}{
		{throttler.OpTake, "Take k 3", nil},
		{throttler.OpPeek, "Peek k", nil},
		{throttler.OpRefund, fmt.Sprintf("Refund k 3 of %d", t0.Add(time.Minute).UnixMilli()), nil},
		{0, "", backend.ErrUnknownOp},
		{4, "", backend.ErrUnknownOp},
		{255, "", backend.ErrUnknownOp},
	}
	for _, tc := range tests {
		rec := &recorder{}
		d, err := backend.Do(context.Background(), rec, tc.op, "k", p, 3, t0.Add(time.Minute), t0)
		if tc.wantErr != nil {
			assert.ErrorIs(t, err, tc.wantErr, "%v", tc.op)
			assert.ErrorContains(t, err, tc.op.String())
			assert.Empty(t, rec.calls, "%v: an unknown op calls nothing (it was once taken for a Take)", tc.op)
			assert.False(t, d.Allowed)
			assert.False(t, throttler.IsInputError(err), "a programming error, not a client's")
			continue
		}
		require.NoError(t, err, "%v", tc.op)
		assert.Equal(t, []string{tc.want}, rec.calls, "%v", tc.op)
	}
}

func TestOpFunc(t *testing.T) {
	type call struct {
		op           throttler.Op
		key          string
		cost         int64
		receipt, now time.Time
	}
	var got []call
	f := backend.OpFunc(func(_ context.Context, op throttler.Op, key string, _ throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
		got = append(got, call{op, key, cost, receipt, now})
		return throttler.Decision{Used: cost}, nil
	})
	ctx, p := context.Background(), throttler.PerSecond(5)
	_, _ = f.Take(ctx, "a", p, 2, t0)
	_, _ = f.Peek(ctx, "b", p, t0.Add(time.Second))
	_, _ = f.Refund(ctx, "c", p, 4, t0.Add(time.Second), t0.Add(2*time.Second))
	assert.Equal(t, []call{
		{throttler.OpTake, "a", 2, time.Time{}, t0},
		{throttler.OpPeek, "b", 1, time.Time{}, t0.Add(time.Second)},
		{throttler.OpRefund, "c", 4, t0.Add(time.Second), t0.Add(2 * time.Second)},
	}, got)

	// Do over an OpFunc hands the op and the receipt through unchanged.
	got = nil
	_, err := backend.Do(ctx, f, throttler.OpRefund, "d", p, 7, t0.Add(time.Second), t0)
	require.NoError(t, err)
	assert.Equal(t, []call{{throttler.OpRefund, "d", 7, t0.Add(time.Second), t0}}, got)
}

func TestRequired(t *testing.T) {
	var nilMemory *memory.Backend
	mem, err := memory.New(nil)
	require.NoError(t, err)
	tests := []struct {
		name string
		b    throttler.Backend
		want string // "" for no error
	}{
		{"nil", nil, "shadow.New control is nil"},
		{"typed nil pointer", nilMemory, "shadow.New control is a nil *memory.Backend"},
		{"nil OpFunc", backend.OpFunc(nil), "shadow.New control is a nil backend.OpFunc"},
		{"a backend", mem, ""},
		{"a value", recorderValue{}, ""},
		{"an OpFunc", backend.OpFunc(func(context.Context, throttler.Op, string, throttler.Policy, int64, time.Time, time.Time) (throttler.Decision, error) {
			return throttler.Decision{}, nil
		}), ""},
	}
	for _, tc := range tests {
		err := backend.Required("shadow.New control", tc.b)
		if tc.want == "" {
			assert.NoError(t, err, tc.name)
		} else {
			assert.EqualError(t, err, tc.want, tc.name)
		}
	}
}

func TestIdentity(t *testing.T) {
	named := []throttler.Policy{
		throttler.PerHour(3).Named("core"),
		throttler.PerMinute(2).Named("core"),
		throttler.PerSecond(1).Named("~!#$%"),
	}
	for _, p := range named {
		assert.Equal(t, p.Name, backend.Identity(p), "a named policy keeps its Name: stored windows stay where they are")
	}
	assert.Equal(t, backend.Identity(named[0]), backend.Identity(named[1]), "a named policy's Limit and Window may change without a fresh window")

	unnamed := []throttler.Policy{
		throttler.PerHour(3), throttler.PerMinute(2), throttler.PerMinute(3), throttler.PerHour(2),
		{Limit: 3, Window: 61 * time.Minute}, {Limit: throttler.MaxLimit, Window: time.Millisecond},
	}
	seen := map[string]throttler.Policy{}
	for _, p := range unnamed {
		id := backend.Identity(p)
		if prev, ok := seen[id]; ok {
			t.Errorf("%v and %v share the identity %q", prev, p, id)
		}
		seen[id] = p
		assert.True(t, strings.HasPrefix(id, " "), "%q: a space, which no Name may hold", id)
		assert.Error(t, throttler.PerHour(1).Named(id).Validate(), "%q is not a valid Name", id)
		assert.Equal(t, id, backend.Identity(p), "stable")
	}
	assert.Equal(t, " fw 3/3600000", backend.Identity(throttler.PerHour(3)))
}

func TestAppendIdentity(t *testing.T) {
	for _, p := range []throttler.Policy{throttler.PerHour(3), throttler.PerHour(3).Named("core")} {
		assert.Equal(t, "prefix:"+backend.Identity(p), string(backend.AppendIdentity([]byte("prefix:"), p)))
		buf := make([]byte, 0, 64)
		allocs := testing.AllocsPerRun(100, func() { buf = backend.AppendIdentity(buf[:0], p) })
		assert.Zero(t, allocs, "%v: a backend builds its keys without allocating", p)
	}
}

func TestWindowState(t *testing.T) {
	p := throttler.Policy{Limit: 10, Window: time.Minute}
	tests := []struct {
		name    string
		used    int64
		resetAt time.Time
		allowed bool
		want    throttler.Decision
	}{
		{"open", 4, t0.Add(30 * time.Second), true, throttler.Decision{Allowed: true, Limit: 10, Used: 4, Remaining: 6, ResetAt: t0.Add(30 * time.Second)}},
		{"denied", 10, t0.Add(30 * time.Second), false, throttler.Decision{Limit: 10, Used: 10, Remaining: 0, ResetAt: t0.Add(30 * time.Second), RetryAfter: 30 * time.Second}},
		{"over a lowered limit", 12, t0.Add(time.Second), false, throttler.Decision{Limit: 10, Used: 12, Remaining: 0, ResetAt: t0.Add(time.Second), RetryAfter: time.Second}},
		{"absent", 0, time.Time{}, true, throttler.Decision{Allowed: true, Limit: 10, Remaining: 10, ResetAt: t0.Add(time.Minute)}},
		{"ended at now", 7, t0, true, throttler.Decision{Allowed: true, Limit: 10, Remaining: 10, ResetAt: t0.Add(time.Minute)}},
		{"ended before now", 7, t0.Add(-time.Second), true, throttler.Decision{Allowed: true, Limit: 10, Remaining: 10, ResetAt: t0.Add(time.Minute)}},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, backend.WindowState(p, tc.used, tc.resetAt, t0, tc.allowed), tc.name)
	}
}

func TestPeekState(t *testing.T) {
	p := throttler.Policy{Limit: 10, Window: time.Minute}
	tests := []struct {
		name    string
		used    int64
		resetAt time.Time
		want    throttler.Decision
	}{
		{"room for one more", 9, t0.Add(time.Second), throttler.Decision{Allowed: true, Limit: 10, Used: 9, Remaining: 1, ResetAt: t0.Add(time.Second)}},
		{"full", 10, t0.Add(time.Second), throttler.Decision{Limit: 10, Used: 10, ResetAt: t0.Add(time.Second), RetryAfter: time.Second}},
		{"over a lowered limit", 15, t0.Add(2 * time.Second), throttler.Decision{Limit: 10, Used: 15, ResetAt: t0.Add(2 * time.Second), RetryAfter: 2 * time.Second}},
		{"absent", 0, time.Time{}, throttler.Decision{Allowed: true, Limit: 10, Remaining: 10, ResetAt: t0.Add(time.Minute)}},
		{"ended", 10, t0, throttler.Decision{Allowed: true, Limit: 10, Remaining: 10, ResetAt: t0.Add(time.Minute)}},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, backend.PeekState(p, tc.used, tc.resetAt, t0), tc.name)
	}
}

// counting is a wrapper written with OpFunc: one function for the three
// operations, forwarding with Do.
type counting struct {
	backend.OpFunc
	calls map[throttler.Op]int
}

func newCounting(next throttler.Backend) (*counting, error) {
	if err := backend.Required("counting: next", next); err != nil {
		return nil, err
	}
	c := &counting{calls: map[throttler.Op]int{}}
	c.OpFunc = func(ctx context.Context, op throttler.Op, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
		c.calls[op]++                                                // not safe for concurrent use: an example
		return backend.Do(ctx, next, op, key, p, cost, receipt, now) // no validation here: next validates
	}
	return c, nil
}

// A wrapper embeds an OpFunc instead of writing Take, Peek and Refund, and
// checks what it wraps when it is built.
func ExampleOpFunc() {
	mem, err := memory.New(nil)
	if err != nil {
		panic(err)
	}
	c, err := newCounting(mem)
	if err != nil {
		panic(err)
	}
	ctx, p := context.Background(), throttler.PerMinute(2)
	_, _ = c.Take(ctx, "alice", p, 1, t0)
	_, _ = c.Take(ctx, "alice", p, 1, t0)
	d, _ := c.Peek(ctx, "alice", p, t0)
	fmt.Println(c.calls, d.Allowed, d.Used)

	_, err = newCounting(nil)
	fmt.Println(err)
	// Output:
	// map[take:2 peek:1] false 2
	// counting: next is nil
}

func ExampleIdentity() {
	fmt.Printf("%q\n", backend.Identity(throttler.PerHour(3).Named("core")))
	fmt.Printf("%q\n", backend.Identity(throttler.PerHour(3)))
	fmt.Printf("%q\n", backend.Identity(throttler.PerMinute(2)))
	// Output:
	// "core"
	// " fw 3/3600000"
	// " fw 2/60000"
}

// A Refund also names its Take: a zero receipt is an input error of its
// own, checked after the call's other input.
func TestValidateCallOfARefund(t *testing.T) {
	p := throttler.PerMinute(10)
	tests := []struct {
		name    string
		key     string
		cost    int64
		receipt time.Time
		want    error
	}{
		{"a receipt", "k", 3, t0.Add(time.Minute), nil},
		{"a receipt before now is still one", "k", 3, t0.Add(-time.Hour), nil},
		{"zero receipt", "k", 3, time.Time{}, throttler.ErrInvalidReceipt},
		{"zero cost first", "k", 0, time.Time{}, throttler.ErrInvalidCost},
		{"empty key first", "", 1, time.Time{}, throttler.ErrInvalidKey},
	}
	for _, tc := range tests {
		assertInputError(t, throttler.ValidateCall(throttler.OpRefund, tc.key, p, tc.cost, tc.receipt), tc.want, tc.name)
	}
}

// assertInputError checks err against want: nil, or an input error
// matching want whose text names the throttler once.
func assertInputError(t *testing.T, err, want error, name string) {
	t.Helper()
	if want == nil {
		assert.NoError(t, err, name)
		return
	}
	assert.ErrorIs(t, err, want, name)
	assert.True(t, throttler.IsInputError(err), name)
	assert.Equal(t, 1, strings.Count(err.Error(), "throttler:"), "%s: one prefix in %q", name, err)
}
