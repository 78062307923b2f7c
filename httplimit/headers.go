package httplimit

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// This file is the package's one writer of headers. Every duration and
// instant a header names is rounded up to whole seconds, so that a client
// that waits until it is never early.

// setHeaders writes, from one decision, GitHub's X-RateLimit-* headers:
// -Resource (name, when not empty), -Limit and, when reset is known (not
// zero), -Remaining, -Used and -Reset (reset in Unix seconds, rounded up).
// An unknown reset deletes those three: the headers never claim a count
// that no store gave.
func setHeaders(h http.Header, name string, d throttler.Decision, reset time.Time) {
	if name != "" {
		h.Set("X-RateLimit-Resource", name)
	}
	h.Set("X-RateLimit-Limit", strconv.FormatInt(d.Limit, 10))
	if reset.IsZero() {
		h.Del("X-RateLimit-Remaining")
		h.Del("X-RateLimit-Used")
		h.Del("X-RateLimit-Reset")
		return
	}
	h.Set("X-RateLimit-Remaining", strconv.FormatInt(d.Remaining, 10))
	h.Set("X-RateLimit-Used", strconv.FormatInt(d.Used, 10))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(unixCeil(reset), 10))
}

// setIETF writes the RateLimit-Policy and RateLimit headers of the IETF
// draft (draft-ietf-httpapi-ratelimit-headers) for a decision of p, whose
// reset is known, at the instant it was made (d.At).
func setIETF(h http.Header, p throttler.Policy, d throttler.Decision, reset time.Time) {
	name := p.Name
	if name == "" {
		name = "default"
	}
	// q and w are the policy's rate, for a token bucket too: its burst is
	// no quota per window (r may then exceed q, up to Burst).
	h.Set("RateLimit-Policy", fmt.Sprintf("%q;q=%d;w=%d", name, p.Limit, ceilSeconds(p.Window)))
	h.Set("RateLimit", fmt.Sprintf("%q;r=%d;t=%d", name, d.Remaining, ceilSeconds(reset.Sub(d.At))))
}

// refuse answers a request over a limit: status, Retry-After (retry in
// whole seconds, rounded up) and a body saying why ("rate limit exceeded:
// 2 per 1m0s") and when to come back, on the headers set already.
func refuse(w http.ResponseWriter, status int, retry time.Duration, why string) {
	s := ceilSeconds(retry)
	w.Header().Set("Retry-After", strconv.FormatInt(s, 10))
	http.Error(w, fmt.Sprintf("%s; retry in %ds", why, s), status)
}

// ceilSeconds is d in whole seconds, rounded up (0 for d <= 0): the value
// of Retry-After and of the IETF RateLimit header's t.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// unixCeil is t in Unix seconds, rounded up: the value of
// X-RateLimit-Reset.
func unixCeil(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}

// resetOf is the instant that X-RateLimit-Reset and the IETF RateLimit's t
// name for d, made at d.At under p (zero when d knows no count). A client
// that returns then is admitted if nobody else spent in between, on every
// algorithm, and a denied answer's reset is never before its Retry-After:
//   - a denied answer names ResetAt, or its earliest admission (the ms of
//     the call plus RetryAfter) when that is later: a sliding-window
//     counter's ResetAt is the end of the current window (the same on
//     every backend), and its wait may reach past it while the previous
//     window still weighs;
//   - a sliding-window counter's admission that leaves nothing names
//     ResetAt plus ceil(w/Limit) ms: at ResetAt the window now current
//     becomes the previous one and weighs its whole count (at most Limit),
//     and one unit fits once that weight is down to Limit - 1;
//   - any other answer names ResetAt: when the fixed window ends, the
//     bucket is full again, the log's newest entry ends.
func resetOf(p throttler.Policy, d throttler.Decision) time.Time {
	switch {
	case d.ResetAt.IsZero():
		return time.Time{}
	case !d.Allowed:
		// The store counted from d.At's ms, truncated: the admission is an
		// instant that does not wobble with the sub-ms part of d.At.
		if at := time.UnixMilli(d.At.UnixMilli()).Add(d.RetryAfter); at.After(d.ResetAt) {
			return at
		}
	case p.Algorithm == throttler.SlidingWindow && d.Remaining == 0:
		w, l := p.Window.Milliseconds(), p.Limit
		return d.ResetAt.Add(time.Duration((w+l-1)/l) * time.Millisecond)
	}
	return d.ResetAt
}
