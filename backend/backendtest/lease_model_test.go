package backendtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/throttler"
)

// The models pass the suite: its hand-computed tables agree with the
// contract as the model reads it.
func TestLeaseModelPassesRunLeases(t *testing.T) {
	store := struct {
		*Model
		*LeaseModel
	}{NewModel(), NewLeaseModel()}
	RunLeases(t, func(*testing.T) LeaseStore { return store })
}

// backend.LeaseSet, the arithmetic the Go backends share, answers as the
// model on long random traces: many leases per key, refreshes, releases of
// held, expired and unknown IDs, policies sharing a name with other
// Limits and TTLs, the clock going back and jumping ahead.
func TestLeaseSetMatchesModel(t *testing.T) {
	ctx := context.Background()
	policies := []throttler.ConcurrencyPolicy{
		{Name: "n", Limit: 40, TTL: 200 * time.Millisecond},
		{Name: "n", Limit: 25, TTL: 70 * time.Millisecond},
		{Limit: 1, TTL: time.Millisecond},
		{Limit: 3, TTL: 20 * time.Millisecond},
	}
	for seed := uint64(1); seed <= 4; seed++ {
		rng := rand.New(rand.NewPCG(seed, 5))
		m := NewLeaseModel()
		sets := map[string]*backend.LeaseSet{}
		now := T0.UnixMilli()
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
			s := sets[backend.LeaseIdentity(p)]
			if s == nil {
				s = new(backend.LeaseSet)
				sets[backend.LeaseIdentity(p)] = s
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
