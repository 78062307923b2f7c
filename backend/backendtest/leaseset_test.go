package backendtest_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/backendtest"
	"github.com/throttlekit/throttlekit/backend/backendtest/internal/model"
	"github.com/throttlekit/throttlekit/internal/identity"
	"github.com/throttlekit/throttlekit/internal/leaseset"
	"github.com/throttlekit/throttlekit/throttler"
)

// The lease arithmetic the Go backends share (internal/leaseset) answers
// as the reference model. These tests live here because the model is
// internal to this package.

// FuzzSetMatchesModel: any sequence of calls (each 4 bytes: which
// call, which ID, how far the clock moves, back or forward, and which of
// two policies sharing a name) answers as model.LeaseModel, and Hold
// and Drop agree with Acquire and Release.
func FuzzSetMatchesModel(f *testing.F) {
	f.Add([]byte{0, 1, 0, 0, 0, 2, 1, 0, 1, 1, 200, 1})
	f.Add([]byte{0, 1, 0, 0, 0, 1, 0, 1, 0, 2, 130, 0, 1, 1, 255, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		policies := []throttler.ConcurrencyPolicy{
			{Name: "f", Limit: 2, TTL: 50 * time.Millisecond},
			{Name: "f", Limit: 3, TTL: 20 * time.Millisecond},
		}
		m := model.NewLeaseModel()
		var s, twin leaseset.Set
		now := backendtest.T0.UnixMilli()
		for i := 0; i+4 <= len(ops); i += 4 {
			op, id, step, pi := ops[i], throttler.LeaseID(1+ops[i+1]%6), int64(int8(ops[i+2])), ops[i+3]%2
			now += step
			p := policies[pi]
			at := time.UnixMilli(now)
			if op%2 == 0 {
				want, err := m.Acquire(context.Background(), "k", p, id, at)
				require.NoError(t, err)
				got, _ := s.Acquire(p, id, now)
				require.Equal(t, want, got, "call %d", i/4)
				used, earliest, allowed, _ := twin.Hold(p, id, now)
				require.Equal(t, got, leaseset.Decision(p, used, earliest, now, allowed))
			} else {
				wantHeld, want, err := m.Release(context.Background(), "k", p, id, at)
				require.NoError(t, err)
				held, got, _ := s.Release(p, id, now)
				require.Equal(t, want, got, "call %d", i/4)
				require.Equal(t, wantHeld, held, "call %d", i/4)
				held, used, earliest, _ := twin.Drop(id, now)
				require.Equal(t, wantHeld, held)
				require.Equal(t, got, leaseset.Decision(p, used, earliest, now, used < p.Limit))
			}
		}
	})
}

// leaseset.Set, the arithmetic the Go backends share, answers as the
// model on long random traces: many leases per key, refreshes, releases of
// held, expired and unknown IDs, policies sharing a name with other
// Limits and TTLs, the clock going back and jumping ahead.
func TestSetMatchesModel(t *testing.T) {
	ctx := context.Background()
	policies := []throttler.ConcurrencyPolicy{
		{Name: "n", Limit: 40, TTL: 200 * time.Millisecond},
		{Name: "n", Limit: 25, TTL: 70 * time.Millisecond},
		{Limit: 1, TTL: time.Millisecond},
		{Limit: 3, TTL: 20 * time.Millisecond},
	}
	for seed := uint64(1); seed <= 4; seed++ {
		rng := rand.New(rand.NewPCG(seed, 5))
		m := model.NewLeaseModel()
		sets := map[string]*leaseset.Set{}
		now := backendtest.T0.UnixMilli()
		for i := 0; i < 20000; i++ {
			p := policies[rng.IntN(len(policies))]
			switch r := rng.IntN(100); {
			case r < 80:
				now += int64(rng.IntN(3))
			case r < 92:
				now -= int64(rng.IntN(30))
			default:
				now += int64(rng.IntN(300))
			}
			id := throttler.LeaseID(1 + rng.IntN(60))
			s := sets[identity.Lease(p)]
			if s == nil {
				s = new(leaseset.Set)
				sets[identity.Lease(p)] = s
			}
			msg := fmt.Sprintf("seed %d step %d: id %d under %v at %d", seed, i, id, p, now)
			if rng.IntN(3) < 2 {
				want, err := m.Acquire(ctx, "k", p, id, time.UnixMilli(now))
				require.NoError(t, err)
				got, _ := s.Acquire(p, id, now)
				require.Equal(t, want, got, msg)
			} else {
				wantHeld, want, err := m.Release(ctx, "k", p, id, time.UnixMilli(now))
				require.NoError(t, err)
				held, got, _ := s.Release(p, id, now)
				require.Equal(t, want, got, msg)
				require.Equal(t, wantHeld, held, msg)
			}
			if end, ok := m.End("k", p); ok {
				require.Equal(t, end, s.End(), msg)
			} else {
				require.Empty(t, *s, msg)
			}
		}
	}
}
