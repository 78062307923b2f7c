package memory_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

// model is the fixed-window contract written as plainly as possible.
type model map[[2]string]struct{ used, resetAt int64 }

// receipt returns the reset-at of (key, p)'s stored window, 0 for none.
func (m model) receipt(key string, p throttler.Policy) int64 {
	return m[[2]string{p.Name, key}].resetAt
}

// do applies op at now; r is a Refund's receipt.
func (m model) do(op byte, key string, p throttler.Policy, cost, r, now int64) (allowed bool, used, resetAt int64) {
	id := [2]string{p.Name, key}
	w, ok := m[id]
	if !ok || w.resetAt <= now {
		w.used, w.resetAt = 0, 0
	}
	switch op {
	case 0: // Take
		if w.used+cost > p.Limit {
			allowed = false
		} else {
			if w.resetAt == 0 {
				w.resetAt = now + p.Window.Milliseconds()
			}
			w.used += cost
			m[id] = w
			allowed = true
		}
	case 1: // Peek
		allowed = w.used < p.Limit
	case 2: // Refund: only to the window the receipt names
		if w.resetAt != 0 && w.resetAt == r {
			w.used = max(0, w.used-cost)
			m[id] = w
		}
		allowed = w.used < p.Limit
	}
	if w.resetAt == 0 {
		return allowed, 0, now + p.Window.Milliseconds()
	}
	return allowed, w.used, w.resetAt
}

// FuzzAgainstModel drives the backend and the model with the same operations
// (each input byte pair: op, key, policy, cost and how far time moves) and
// requires the same answers, with MaxKeys and sweeps in play.
func FuzzAgainstModel(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 0, 2, 0, 3, 1, 0, 2, 5})
	f.Add([]byte{0x10, 0xff, 0x20, 0x81, 0x33, 0x42, 0x00, 0x00, 0xfe, 0x07})
	policies := []throttler.Policy{
		{Name: "a", Limit: 3, Window: 2 * time.Second},
		{Name: "b", Limit: 1, Window: 500 * time.Millisecond},
	}
	keys := []string{"k1", "k2", "k3"}
	f.Fuzz(func(t *testing.T, program []byte) {
		b, err := memory.New(&memory.Options{Shards: 1})
		if err != nil {
			t.Fatal(err)
		}
		m := model{}
		ctx := context.Background()
		now := backendtest0.UnixMilli()
		for i := 0; i+1 < len(program); i += 2 {
			x, y := program[i], program[i+1]
			op := x % 3
			key := keys[(x/3)%3]
			p := policies[(x/9)%2]
			cost := int64(y%4) + 1
			now += int64(y/4) * 37 // up to ~2.3s forward
			at := time.UnixMilli(now)
			// A refund names the stored window (as read before this
			// call's now), or, for odd x/18, a window 1 ms later.
			r := m.receipt(key, p)
			if r == 0 {
				r = now + p.Window.Milliseconds()
			}
			r += int64(x / 18 % 2)
			var d throttler.Decision
			var err error
			switch op {
			case 0:
				d, err = b.Take(ctx, key, p, cost, at)
			case 1:
				d, err = b.Peek(ctx, key, p, at)
			case 2:
				d, err = b.Refund(ctx, key, p, cost, time.UnixMilli(r), at)
			}
			if op == 0 && cost > p.Limit {
				if !errors.Is(err, throttler.ErrInvalidCost) {
					t.Fatalf("op %d: take %d of %d: got %v, want ErrInvalidCost", i/2, cost, p.Limit, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("op %d: %v", i/2, err)
			}
			allowed, used, resetAt := m.do(op, key, p, cost, r, now)
			if d.Allowed != allowed || d.Used != used || d.ResetAt.UnixMilli() != resetAt {
				t.Fatalf("op %d (%d %s %s cost %d at %d): got allowed=%v used=%d reset=%d, model %v %d %d",
					i/2, op, key, p.Name, cost, now, d.Allowed, d.Used, d.ResetAt.UnixMilli(), allowed, used, resetAt)
			}
		}
	})
}

var backendtest0 = time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
