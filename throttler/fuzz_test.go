package throttler_test

import (
	"context"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// FuzzBadInputNeverFailsOpen: with the primary down and the Throttler
// failing open, any input is either refused as an input error (never
// allowed, never a panic) or, exactly when a backend would take it, allowed
// as a degraded decision.
func FuzzBadInputNeverFailsOpen(f *testing.F) {
	f.Add(uint8(throttler.OpTake), "client", "core", int64(5000), int64(3600_000_000_000), int64(1))
	f.Add(uint8(throttler.OpPeek), "", "", int64(0), int64(0), int64(0))
	f.Add(uint8(throttler.OpRefund), "k\x00\n", "a b", int64(-1), int64(1500_000), int64(-3))
	f.Add(uint8(throttler.OpTake), "k", "", int64(3), int64(1_000_000), int64(4))
	f.Fuzz(func(t *testing.T, op uint8, key, name string, limit, window, cost int64) {
		o := throttler.Op(op%3 + 1)
		p := throttler.Policy{Name: name, Limit: limit, Window: time.Duration(window)}
		th, err := throttler.New(&stubBackend{err: errDown}, nil)
		if err != nil {
			t.Fatal(err)
		}
		var d throttler.Decision
		// A Take that counted units in a window still open.
		taken := throttler.Decision{Allowed: true, ResetAt: time.Now().Add(time.Hour)}
		switch o {
		case throttler.OpTake:
			d, err = th.AllowN(context.Background(), key, p, cost)
		case throttler.OpPeek:
			d, err = th.Peek(context.Background(), key, p)
		case throttler.OpRefund:
			d, err = th.Refund(context.Background(), key, p, cost, taken)
		}
		want := throttler.ValidateCall(o, key, p, cost, taken.ResetAt)
		switch {
		case want != nil && (err == nil || !throttler.IsInputError(err) || d.Allowed):
			t.Fatalf("%v %q %v cost %d: want %v, got %v allowed=%v", o, key, p, cost, want, err, d.Allowed)
		case want == nil && (err != nil || !d.Allowed || !d.Degraded):
			t.Fatalf("%v %q %v cost %d: failing open, got %v %+v", o, key, p, cost, err, d)
		}
	})
}
