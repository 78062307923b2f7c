package backend_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/throttler"
)

// leaseRecorder records the lease calls it gets and answers held for a
// Release.
type leaseRecorder struct {
	recorder
	held  bool
	calls []string
}

func (r *leaseRecorder) Acquire(_ context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, _ time.Time) (throttler.Decision, error) {
	r.calls = append(r.calls, "acquire "+key)
	return throttler.Decision{Allowed: true, Limit: p.Limit, Used: int64(id)}, nil
}

func (r *leaseRecorder) Release(_ context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, _ time.Time) (bool, throttler.Decision, error) {
	r.calls = append(r.calls, "release "+key)
	return r.held, throttler.Decision{Limit: p.Limit, Used: int64(id)}, nil
}

func TestValidateLease(t *testing.T) {
	p := throttler.Concurrent(3, time.Second)
	tests := []struct {
		key  string
		p    throttler.ConcurrencyPolicy
		id   throttler.LeaseID
		want error
	}{
		{"k", p, 1, nil},
		{"", p, 1, throttler.ErrInvalidKey},
		{"k", throttler.Concurrent(0, time.Second), 1, throttler.ErrInvalidPolicy},
		{"k", throttler.Concurrent(1, 0), 1, throttler.ErrInvalidPolicy},
		{"k", p, 0, throttler.ErrInvalidLease},
	}
	for _, tc := range tests {
		err := throttler.ValidateLease(tc.key, tc.p, tc.id)
		if tc.want == nil {
			assert.NoError(t, err)
			continue
		}
		assert.ErrorIs(t, err, tc.want, "%q %v %d", tc.key, tc.p, tc.id)
		assert.True(t, throttler.IsInputError(err))
	}
}

func TestDoLease(t *testing.T) {
	r := &leaseRecorder{held: true}
	p := throttler.Concurrent(3, time.Second)
	ctx := context.Background()

	held, d, err := backend.DoLease(ctx, r, throttler.OpAcquire, "a", p, 7, t0)
	require.NoError(t, err)
	assert.False(t, held)
	assert.Equal(t, throttler.Decision{Allowed: true, Limit: 3, Used: 7}, d)

	held, d, err = backend.DoLease(ctx, r, throttler.OpRelease, "b", p, 8, t0)
	require.NoError(t, err)
	assert.True(t, held)
	assert.Equal(t, throttler.Decision{Limit: 3, Used: 8}, d)

	for _, op := range []throttler.Op{0, throttler.OpTake, throttler.OpPeek, throttler.OpRefund, 99} {
		_, _, err := backend.DoLease(ctx, r, op, "c", p, 9, t0)
		assert.ErrorIs(t, err, backend.ErrUnknownOp, "%v", op)
	}
	assert.Equal(t, []string{"acquire a", "release b"}, r.calls, "nothing is called for an op that is not a lease's")
}
