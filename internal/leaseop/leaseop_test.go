package leaseop_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/internal/leaseop"
	"github.com/throttlekit/throttlekit/throttler"
)

var t0 = time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)

// recorder records the lease calls it gets and answers held for a Release.
type recorder struct {
	held  bool
	calls []string
}

func (r *recorder) Acquire(_ context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, _ time.Time) (throttler.Decision, error) {
	r.calls = append(r.calls, "acquire "+key)
	return throttler.Decision{Allowed: true, Limit: p.Limit, Used: int64(id)}, nil
}

func (r *recorder) Release(_ context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, _ time.Time) (bool, throttler.Decision, error) {
	r.calls = append(r.calls, "release "+key)
	return r.held, throttler.Decision{Limit: p.Limit, Used: int64(id)}, nil
}

func TestDo(t *testing.T) {
	r := &recorder{held: true}
	p := throttler.Concurrent(3, time.Second)
	ctx := context.Background()

	held, d, err := leaseop.Do(ctx, r, throttler.OpAcquire, "a", p, 7, t0)
	require.NoError(t, err)
	assert.False(t, held)
	assert.Equal(t, throttler.Decision{Allowed: true, Limit: 3, Used: 7}, d)

	held, d, err = leaseop.Do(ctx, r, throttler.OpRelease, "b", p, 8, t0)
	require.NoError(t, err)
	assert.True(t, held)
	assert.Equal(t, throttler.Decision{Limit: 3, Used: 8}, d)

	for _, op := range []throttler.Op{0, throttler.OpTake, throttler.OpPeek, throttler.OpRefund, 99} {
		_, _, err := leaseop.Do(ctx, r, op, "c", p, 9, t0)
		assert.ErrorIs(t, err, backend.ErrUnknownOp, "%v", op)
	}
	assert.Equal(t, []string{"acquire a", "release b"}, r.calls, "nothing is called for an op that is not a lease's")
}
