package memcached

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// TestTakeStalledBeforeCounting: a Take reads the key's state at its now
// (room for one unit left), then stalls before counting. Meanwhile its items expire (real time passes
// beyond the window's end and the expiry margin) and, in the "replaced"
// cases, another process at a later now fills a new state. The stalled
// call must get the contract's answer for its now against what the store
// holds when it counts: in the newer state (full: denied), or, with no
// state left, a fresh one opened at its own now; never a count in a window
// whose items expired with its units.
func TestTakeStalledBeforeCounting(t *testing.T) {
	const limit = 5
	late := t0.Add(500 * time.Millisecond)   // the stalled call's now
	other := t0.Add(1500 * time.Millisecond) // the other process's now, after the first window ended
	tests := []struct {
		alg       throttler.Algorithm
		replaced  bool
		allowed   bool
		used      int64
		resetAt   time.Time
		writeOpOf string // the command that counts: the stall comes just before it
	}{
		{throttler.FixedWindow, true, false, limit, other.Add(time.Second), "incr"},
		{throttler.FixedWindow, false, true, 1, late.Add(time.Second), "incr"},
		{throttler.TokenBucket, true, false, limit, other.Add(time.Second), "cas"},
		{throttler.TokenBucket, false, true, 1, late.Add(200 * time.Millisecond), "add"},
		{throttler.SlidingLog, true, false, limit, other.Add(time.Second), "cas"},
		{throttler.SlidingLog, false, true, 1, late.Add(time.Second), "add"},
		{throttler.SlidingWindow, true, false, limit, other.Add(time.Second - 500*time.Millisecond), "cas"},
		{throttler.SlidingWindow, false, true, 1, t0.Add(time.Second), "add"},
	}
	for _, tt := range tests {
		name := tt.alg.String() + "/expired"
		if tt.replaced {
			name += "+replaced"
		}
		t.Run(name, func(t *testing.T) {
			p := throttler.Policy{Name: "stall", Limit: limit, Window: time.Second, Algorithm: tt.alg}
			ctx := context.Background()
			f := newFakeClient()
			others := mustNew(t, f, nil)  // the processes that keep going
			stalled := mustNew(t, f, nil) // the process stopped mid-call
			if d, err := others.Take(ctx, "k", p, limit-1, t0); err != nil || !d.Allowed {
				t.Fatalf("counting in the first window: %+v, %v", d, err)
			}
			if tt.alg == throttler.FixedWindow {
				// The stalled call's state read is its last read: a Take
				// that went back to the head afterwards would read the
				// newer state, so the stall is after every read of it.
				stalled.opts.NoCache = true
			}
			var armed atomic.Bool
			armed.Store(true)
			var stalls atomic.Int32
			f.setBefore(func(op, key string) error {
				if op == "get" || op == "getm" || !armed.CompareAndSwap(true, false) {
					return nil
				}
				stalls.Add(1)
				f.mu.Lock()
				clear(f.items) // every item of the first window expired
				f.mu.Unlock()
				if tt.replaced {
					if d, err := others.Take(ctx, "k", p, limit, other); err != nil || !d.Allowed {
						t.Errorf("filling the newer window: %+v, %v", d, err)
					}
				}
				return nil
			})
			d, err := stalled.Take(ctx, "k", p, 1, late)
			if err != nil {
				t.Fatal(err)
			}
			if stalls.Load() != 1 {
				t.Fatalf("the stall ran %d times, want 1", stalls.Load())
			}
			if d.Allowed != tt.allowed || d.Used != tt.used || !d.ResetAt.Equal(tt.resetAt) {
				t.Errorf("got Allowed %v Used %d ResetAt %v; want %v %d %v",
					d.Allowed, d.Used, d.ResetAt.Format(time.StampMilli), tt.allowed, tt.used, tt.resetAt.Format(time.StampMilli))
			}
		})
	}
}

// TestCompositeTakeStalledBeforeCounting: a composite's fixed-window member
// read before the stall is counted in the window the head names when the
// composite counts, as a Take of the member alone is.
func TestCompositeTakeStalledBeforeCounting(t *testing.T) {
	const limit = 5
	late, other := t0.Add(500*time.Millisecond), t0.Add(1500*time.Millisecond)
	first := throttler.Policy{Name: "stall", Limit: limit, Window: time.Second}
	all := throttler.All(first, second)
	ctx := context.Background()
	f := newFakeClient()
	others, stalled := mustNew(t, f, nil), mustNew(t, f, nil)
	if d, err := others.Take(ctx, "k", all, limit-1, t0); err != nil || !d.Allowed {
		t.Fatalf("counting in the first window: %+v, %v", d, err)
	}
	var armed atomic.Bool
	armed.Store(true)
	f.setBefore(func(op, key string) error {
		if op != "incr" || !armed.CompareAndSwap(true, false) {
			return nil
		}
		f.mu.Lock()
		clear(f.items)
		f.mu.Unlock()
		if d, err := others.Take(ctx, "k", first, limit, other); err != nil || !d.Allowed {
			t.Errorf("filling the newer window: %+v, %v", d, err)
		}
		return nil
	})
	d, err := stalled.Take(ctx, "k", all, 1, late)
	if err != nil {
		t.Fatal(err)
	}
	if armed.Load() {
		t.Fatal("the stall never ran")
	}
	if d.Allowed || d.Remaining != 0 || !d.ResetAt.Equal(other.Add(time.Second)) {
		t.Errorf("got Allowed %v Remaining %d ResetAt %v; want denied by the newer window ending %v",
			d.Allowed, d.Remaining, d.ResetAt.Format(time.StampMilli), other.Add(time.Second).Format(time.StampMilli))
	}
	if n := peekMember(t, stalled, "k", second, late); n.Used != 0 {
		t.Errorf("second member Used %d after a denied composite, want 0 (its items expired)", n.Used)
	}
}
