package redis

import (
	"context"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/throttler"
)

// blamedStore is the store a Throttler charges err to: the one whose
// breaker counts it, as err names it (throttler.StoreFailure); "" for the
// call's own store, or for an error that is no store failure.
func blamedStore(t testing.TB, err error) string {
	t.Helper()
	failing := backend.OpFunc(func(context.Context, throttler.Op, string, throttler.Policy, int64, time.Time, time.Time) (throttler.Decision, error) {
		return throttler.Decision{}, err
	})
	th, nerr := throttler.New(failing, nil)
	if nerr != nil {
		t.Fatal(nerr)
	}
	_, _ = th.Allow(context.Background(), "k", throttler.PerMinute(1))
	for _, b := range th.Breakers() {
		if b.Failures > 0 {
			return b.Store
		}
	}
	return "" // no store failure
}
