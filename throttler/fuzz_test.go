package throttler_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// FuzzValidateCall: any input gets nil or one of the input errors, never a
// panic, and nil only for input every backend can take.
func FuzzValidateCall(f *testing.F) {
	f.Add("client", "core", int64(5000), int64(3600_000_000_000), int64(1))
	f.Add("", "", int64(0), int64(0), int64(0))
	f.Add("k\x00\n", "a b", int64(-1), int64(1500_000), int64(-3))
	f.Add(strings.Repeat("x", 5000), "ok", int64(1), int64(1_000_000), int64(1))
	f.Fuzz(func(t *testing.T, key, name string, limit, window, cost int64) {
		p := throttler.Policy{Name: name, Limit: limit, Window: time.Duration(window)}
		err := throttler.ValidateCall(key, p, cost)
		if err != nil {
			if !throttler.IsInputError(err) {
				t.Fatalf("%v is not an input error", err)
			}
			if errors.Is(err, throttler.ErrInvalidKey) && key != "" && len(key) <= throttler.MaxKeyLen {
				t.Fatalf("key %q rejected: %v", key, err)
			}
			return
		}
		if key == "" || len(key) > throttler.MaxKeyLen || cost <= 0 || cost > throttler.MaxLimit || limit <= 0 || limit > throttler.MaxLimit || p.Window < time.Millisecond || p.Window%time.Millisecond != 0 {
			t.Fatalf("accepted key=%q %v cost=%d", key, p, cost)
		}
		for _, c := range []byte(name) {
			if c <= ' ' || c > '~' {
				t.Fatalf("accepted name %q", name)
			}
		}
		_ = p.String()
	})
}
