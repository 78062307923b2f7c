// Package flagstest holds what the tests and benchmarks of package flags
// and flags/unleash share: keys of every shape, a backend that does
// nothing, and the keys an Enforcer refuses.
package flagstest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

// T is what Refused needs of a test (*testing.T and *testing.B have it):
// taking it rather than testing.TB keeps package testing out of non-test
// code.
type T interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Keys returns n distinct keys of several shapes, including long and
// non-ASCII ones.
func Keys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		switch i % 4 {
		case 0:
			keys[i] = "user-" + strconv.Itoa(i)
		case 1:
			keys[i] = fmt.Sprintf("203.0.%d.%d", i/256%256, i%256)
		case 2:
			keys[i] = "clé-ü-" + strconv.Itoa(i*7919)
		default:
			keys[i] = strings.Repeat("k", 150+i%100) + strconv.Itoa(i)
		}
	}
	return keys
}

// BenchKeys are the 1,024 keys the benchmarks cycle through.
func BenchKeys() []string {
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "user-" + strconv.Itoa(i*7919)
	}
	return keys
}

// Nop answers at once, so a benchmark through a Router measures the
// Router's own cost.
type Nop struct{ _ int }

func (*Nop) Take(_ context.Context, _ string, p throttler.Policy, _ int64, now time.Time) (throttler.Decision, error) {
	return throttler.Decision{Allowed: true, Limit: p.Limit, ResetAt: now}, nil
}
func (*Nop) Peek(_ context.Context, _ string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	return throttler.Decision{Allowed: true, Limit: p.Limit, ResetAt: now}, nil
}
func (*Nop) Refund(_ context.Context, _ string, p throttler.Policy, _ int64, _, now time.Time) (throttler.Decision, error) {
	return throttler.Decision{Allowed: true, Limit: p.Limit, ResetAt: now}, nil
}

// Refused takes one unit twice for every key, at now, under a fixed window
// of one unit an hour enforced by e, through a Throttler over a fresh memory
// backend, and returns the keys whose second call was refused. Every other
// second call must be admitted and reported as a would-be denial, which t
// checks.
func Refused(t T, e throttler.Enforcer, keys []string, now time.Time) map[string]bool {
	t.Helper()
	m, err := memory.New(nil)
	if err != nil {
		t.Fatalf("%v", err)
	}
	th, err := throttler.New(m, &throttler.Options{Clock: func() time.Time { return now }})
	if err != nil {
		t.Fatalf("%v", err)
	}
	p := throttler.PerHour(1).Named("enforced").EnforcedBy(e)
	refused := map[string]bool{}
	ctx := context.Background()
	for _, k := range keys {
		for i := range 2 {
			d, err := th.Allow(ctx, k, p)
			switch {
			case err != nil:
				t.Fatalf("key %q: %v", k, err)
			case i == 0 && (!d.Allowed || d.WouldDeny):
				t.Fatalf("key %q: the first call was not simply admitted: %+v", k, d)
			case i == 1 && d.Allowed && !d.WouldDeny:
				t.Fatalf("key %q: the second call was admitted without a would-be denial: %+v", k, d)
			case i == 1 && !d.Allowed:
				refused[k] = true
			}
		}
	}
	return refused
}
