package backend_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/internal/identity"
	"github.com/throttlekit/throttlekit/throttler"
)

// FuzzValidateCall: any input gets nil or one of the input errors, never a
// panic, and nil only for input every backend can take.
func FuzzValidateCall(f *testing.F) {
	f.Add(uint8(throttler.OpTake), "client", "core", int64(5000), int64(3600_000_000_000), int64(1))
	f.Add(uint8(0), "", "", int64(0), int64(0), int64(0))
	f.Add(uint8(throttler.OpPeek), "k\x00\n", "a b", int64(-1), int64(1500_000), int64(-3))
	f.Add(uint8(throttler.OpRefund), strings.Repeat("x", 5000), "ok", int64(1), int64(1_000_000), int64(1))
	f.Add(uint8(throttler.OpTake), "k", "", int64(3), int64(1_000_000), int64(4))
	f.Add(uint8(throttler.OpRefund), "k", "", int64(3), int64(1_000_000), int64(throttler.MaxLimit))
	f.Fuzz(func(t *testing.T, op uint8, key, name string, limit, window, cost int64) {
		o := throttler.Op(op)
		p := throttler.Policy{Name: name, Limit: limit, Window: time.Duration(window)}
		err := throttler.ValidateCall(o, key, p, cost, time.UnixMilli(1)) // a receipt of a Take
		if err != nil {
			if !throttler.IsInputError(err) {
				t.Fatalf("%v is not an input error", err)
			}
			if strings.Count(err.Error(), "throttler:") != 1 {
				t.Fatalf("%q: not one prefix", err)
			}
			if errors.Is(err, throttler.ErrInvalidKey) && key != "" && len(key) <= throttler.MaxKeyLen {
				t.Fatalf("key %q rejected: %v", key, err)
			}
			if errors.Is(err, throttler.ErrInvalidCost) && o == throttler.OpPeek {
				t.Fatalf("a Peek's cost was checked: %v", err)
			}
			return
		}
		if key == "" || len(key) > throttler.MaxKeyLen || limit <= 0 || limit > throttler.MaxLimit || p.Window < time.Millisecond || p.Window%time.Millisecond != 0 {
			t.Fatalf("accepted key=%q %v", key, p)
		}
		if o != throttler.OpPeek && (cost <= 0 || cost > throttler.MaxLimit) {
			t.Fatalf("accepted %v of %d", o, cost)
		}
		if o == throttler.OpTake && cost > limit {
			t.Fatalf("accepted a Take of %d above the limit %d", cost, limit)
		}
		for _, c := range []byte(name) {
			if c <= ' ' || c > '~' {
				t.Fatalf("accepted name %q", name)
			}
		}
		if id := identity.Rate(p); name != "" && id != name || name == "" && !strings.HasPrefix(id, " ") {
			t.Fatalf("identity %q of %v", id, p)
		}
		_ = p.String()
	})
}
