package backend_test

import (
	"context"
	"errors"
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

// counting is a wrapper written with OpFunc: one function for the three
// operations, forwarding with Do.
type counting struct {
	backend.OpFunc
	calls map[throttler.Op]int
}

func newCounting(next throttler.Backend) (*counting, error) {
	if next == nil { // a wrapper refuses to be built around nothing
		return nil, errors.New("counting: next is nil")
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
