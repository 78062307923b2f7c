package outbound

import (
	"context"
	"net/http"
	"time"
)

// SetWorld replaces t's clock, sleep and jitter (nil keeps each), so that
// tests run it at fixed instants: their sleep moves the fake clock that the
// Throttler reads too.
func SetWorld(t *Transport, now func() time.Time, sleep func(context.Context, time.Duration) error, jitter func(time.Duration) time.Duration) {
	if now != nil {
		t.now = now
	}
	if sleep != nil {
		t.sleep = sleep
	}
	if jitter != nil {
		t.jitter = jitter
	}
}

// PauseFrom is how long a response with h and status asks to pause.
func PauseFrom(h http.Header, status int, now time.Time) (time.Duration, bool) {
	return pauseFrom(h, status, now)
}

// KnownPause is how long the process knows key to stay paused.
func KnownPause(t *Transport, key string) time.Duration { return t.pauses.left(key, t.now()) }

// HostKey is the default key of req.
func HostKey(req *http.Request) (string, error) { return hostKey(req) }
