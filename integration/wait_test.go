package integration

import (
	"context"
	"testing"
	"time"
)

// waitEvery is how often waitFor asks again.
const waitEvery = 20 * time.Millisecond

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func(context.Context) bool) {
	t.Helper()
	if _, ok := poll(timeout, waitEvery, cond); !ok {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// poll calls cond, pausing every between calls, until it holds or timeout
// has passed, and returns how long that took and whether it held. Each call
// has a second: one that hangs cannot stretch the wait by more. It only
// reports, so it may run outside the test's goroutine, and the caller words
// the failure.
func poll(timeout, every time.Duration, cond func(context.Context) bool) (time.Duration, bool) {
	start := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		ok := cond(ctx)
		cancel()
		if ok {
			return time.Since(start), true
		}
		if time.Since(start) > timeout {
			return time.Since(start), false
		}
		time.Sleep(every)
	}
}
