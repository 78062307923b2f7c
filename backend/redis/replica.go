package redis

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// Replicas on a bad day. A replica that fails a Peek fails that Peek with
// its own error, which names it and is marked as a failure of the shard's
// replicas' store: a Throttler observes it and counts it toward that
// store's breaker, never the primary's. The replica then rests for
// replicaRest: Peeks go to another replica of the shard, or to the primary
// at once, and Store names the primary while every replica of the shard
// rests. When its rest is over, one Peek probes it while the others keep
// going elsewhere: a success ends the rest, a failure fails that Peek and
// starts another rest. A dead replica so costs each process one Peek per
// rest (half that call's time, and its answer), not every Peek half its
// time unseen.

// replicaRest is how long a failed replica gets no Peek but one probe: long
// enough that a dead replica costs one call in many, short enough that a
// replica back in service soon serves again.
const replicaRest = time.Second

// processStart is the origin of Backend.mono's default.
var processStart = time.Now()

// sinceStart is monotonic wall time, on which rests are measured: the
// callers' now is for windows, not for a server's health.
func sinceStart() time.Duration { return time.Since(processStart) }

// replicaHealth is one replica's rest.
type replicaHealth struct {
	restUntil atomic.Int64 // Backend.mono in ns when the rest ends; 0: serving
	probing   atomic.Bool  // a Peek probes the replica after its rest
}

// serving reports whether some replica of s serves Peeks: not resting.
func (s *shard) serving() bool {
	for i := range s.health {
		if s.health[i].restUntil.Load() == 0 {
			return true
		}
	}
	return false
}

// pick returns the replica a Peek on s reads and its health: one whose
// rest ended, as that rest's one probe (probe true), else the next serving
// one, round robin; nil when every replica rests (the Peek goes to the
// primary).
func (s *shard) pick(now time.Duration) (l *lane, h *replicaHealth, probe bool) {
	for i := range s.health {
		h := &s.health[i]
		if until := h.restUntil.Load(); until != 0 && until <= int64(now) && h.probing.CompareAndSwap(false, true) {
			return s.replicaLanes[i], h, true
		}
	}
	n := uint32(len(s.replicaLanes))
	start := s.next.Add(1) - 1
	for i := range n {
		k := (start + i) % n
		if s.health[k].restUntil.Load() == 0 {
			return s.replicaLanes[k], &s.health[k], false
		}
	}
	return nil, nil, false
}

// read runs f, a Peek, on a replica of s (see pick), or on the primary when
// s has none or every one rests. A replica gets half of the call's
// remaining time, so that a paused one costs a Peek that half, not the
// whole Timeout. A replica's failure, a deadline of that half or an odd
// reply included, is the Peek's, marked as the replicas' store's (see the
// top of this file); a key's failure (WRONGTYPE) is the key's, and a caller
// whose context ended says nothing about the replica.
func (b *Backend) read(ctx context.Context, s *shard, f func(context.Context, *lane) error) error {
	if len(s.replicaLanes) == 0 {
		return f(ctx, s.primaryLane)
	}
	l, h, probe := s.pick(b.mono())
	if l == nil {
		return f(ctx, s.primaryLane)
	}
	rctx := ctx
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		rctx, cancel = context.WithDeadline(ctx, time.Now().Add(time.Until(deadline)/2))
		defer cancel()
	}
	err := f(rctx, l)
	switch {
	case err == nil || keyFailure(err):
		// The replica answered. Only a probe ends a rest: a read sent
		// before the failure that began it says nothing after.
		if probe {
			h.restUntil.Store(0)
		}
	case ctx.Err() != nil:
		// No news: a probe's turn passes to the next Peek.
	default:
		h.restUntil.Store(int64(b.mono() + replicaRest))
		err = throttler.StoreFailure(s.replicasName, err)
	}
	if probe {
		h.probing.Store(false)
	}
	return err
}
