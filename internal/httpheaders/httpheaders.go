// Package httpheaders writes the X-RateLimit-* headers that the throttler's
// and the shed chain's middlewares both set, with one rounding: every
// duration and instant a header names is rounded up to whole seconds, so
// that a client that waits until it is never early.
package httpheaders

import (
	"net/http"
	"strconv"
	"time"
)

// CeilSeconds is d in whole seconds, rounded up (0 for d <= 0): the value
// of Retry-After and of the IETF RateLimit header's t.
func CeilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// UnixCeil is t in Unix seconds, rounded up: the value of
// X-RateLimit-Reset.
func UnixCeil(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}

// SetCounts sets X-RateLimit-Limit and, when reset is known (not zero),
// X-RateLimit-Remaining, -Used and -Reset (reset in Unix seconds, rounded
// up). An unknown reset deletes the three: headers never claim a count
// that no store gave.
func SetCounts(h http.Header, limit, remaining, used int64, reset time.Time) {
	h.Set("X-RateLimit-Limit", strconv.FormatInt(limit, 10))
	if reset.IsZero() {
		h.Del("X-RateLimit-Remaining")
		h.Del("X-RateLimit-Used")
		h.Del("X-RateLimit-Reset")
		return
	}
	h.Set("X-RateLimit-Remaining", strconv.FormatInt(remaining, 10))
	h.Set("X-RateLimit-Used", strconv.FormatInt(used, 10))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(UnixCeil(reset), 10))
}
