package outbound

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// pauseCache holds the pauses this process knows of, so that while one
// lasts its requests wait without asking the store.
type pauseCache struct {
	mu    sync.Mutex
	until map[string]time.Time
}

// left reports how long key stays paused after now; 0 when it is not.
func (c *pauseCache) left(key string, now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	u, ok := c.until[key]
	if !ok {
		return 0
	}
	if !u.After(now) {
		delete(c.until, key)
		return 0
	}
	return u.Sub(now)
}

// extend pauses key until until, unless it is paused longer already, and
// forgets the pauses that have ended by now (there are few: a pause is
// rare, and each key has one at most).
func (c *pauseCache) extend(key string, until, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if u, ok := c.until[key]; ok && !until.After(u) {
		return
	}
	for k, u := range c.until {
		if !u.After(now) {
			delete(c.until, k)
		}
	}
	c.until[key] = until
}

// pauseFrom reads how long a response asks its sender to stop calling:
// Retry-After on a 429 or 503, or rate-limit headers on any response that
// say nothing remains and when the limit resets. It returns the longest
// such wait, rounded up to a millisecond, or false when there is none.
//
// Headers read:
//   - Retry-After: delay-seconds or an HTTP-date (RFC 9110), on 429 and 503;
//   - X-RateLimit-Remaining: 0 with X-RateLimit-Reset-After (seconds) or
//     X-RateLimit-Reset: Unix seconds (GitHub) or milliseconds when the
//     value is that large, else seconds from now;
//   - RateLimit-Remaining: 0 with RateLimit-Reset: seconds (the IETF
//     draft's separate fields, up to -06);
//   - RateLimit: a list of limits, one of which says r=0 and t=seconds
//     (draft-ietf-httpapi-ratelimit-headers -07 on), or the older
//     "limit=10, remaining=0, reset=7".
//
// Absolute times are measured from the response's Date when it has one,
// so that a skew between the remote's clock and now does not lengthen or
// shorten the pause; else from now.
func pauseFrom(h http.Header, status int, now time.Time) (time.Duration, bool) {
	ref := now
	if date, err := http.ParseTime(h.Get("Date")); err == nil {
		ref = date
	}
	var longest time.Duration
	found := func(d time.Duration) {
		longest = max(longest, d)
	}
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		if v := strings.TrimSpace(h.Get("Retry-After")); v != "" {
			if s, err := strconv.ParseInt(v, 10, 64); err == nil {
				found(seconds(float64(s)))
			} else if at, err := http.ParseTime(v); err == nil {
				found(at.Sub(ref))
			}
		}
	}
	if spent(h.Get("X-RateLimit-Remaining")) {
		if d, ok := number(h.Get("X-RateLimit-Reset-After")); ok {
			found(seconds(d))
		} else if v, ok := number(h.Get("X-RateLimit-Reset")); ok {
			found(resetIn(v, ref))
		}
	}
	if spent(h.Get("RateLimit-Remaining")) {
		if d, ok := number(h.Get("RateLimit-Reset")); ok {
			found(seconds(d))
		}
	}
	if v := h.Values("RateLimit"); len(v) > 0 {
		found(rateLimitField(strings.Join(v, ",")))
	}
	if longest <= 0 {
		return 0, false
	}
	return ceilMillis(longest), true
}

// rateLimitField reads the RateLimit field: the list of the draft's -07
// and later ('"default";r=0;t=10, "daily";r=5;t=3600'), where each limit
// with r=0 asks for a pause of t seconds, or the single dictionary of
// earlier drafts ("limit=10, remaining=0, reset=7").
func rateLimitField(v string) time.Duration {
	var longest time.Duration
	old := map[string]string{} // the earlier drafts' dictionary
	for _, item := range strings.Split(v, ",") {
		params := map[string]string{}
		for _, p := range strings.Split(item, ";") {
			k, val, ok := strings.Cut(strings.TrimSpace(p), "=")
			if ok {
				params[strings.ToLower(strings.TrimSpace(k))] = strings.Trim(strings.TrimSpace(val), `"`)
			}
		}
		r, hasR := params["r"]
		if t, ok := number(params["t"]); hasR && ok && spent(r) {
			longest = max(longest, seconds(t))
		}
		for _, k := range []string{"remaining", "reset"} {
			if val, ok := params[k]; ok {
				old[k] = val
			}
		}
	}
	if t, ok := number(old["reset"]); ok && spent(old["remaining"]) {
		longest = max(longest, seconds(t))
	}
	return longest
}

// resetIn reads an X-RateLimit-Reset value v: a Unix time in seconds
// (above 10^9, 2001) or milliseconds (above 10^12), measured from ref; or
// seconds from now.
func resetIn(v float64, ref time.Time) time.Duration {
	switch {
	case v >= 1e18: // beyond any Time: a pause as long as MaxPause allows
		return math.MaxInt64
	case v >= 1e12:
		return time.UnixMilli(int64(math.Ceil(v))).Sub(ref)
	case v >= 1e9:
		sec := math.Floor(v)
		return time.Unix(int64(sec), int64(math.Ceil((v-sec)*1e9))).Sub(ref)
	}
	return seconds(v)
}

// spent reports whether a remaining count says nothing remains.
func spent(v string) bool {
	n, ok := number(v)
	return ok && n <= 0
}

// number parses a non-empty decimal number, as headers write them.
func number(v string) (float64, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	n, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(n) || math.IsInf(n, 0) {
		return 0, false
	}
	return n, true
}

// seconds converts s seconds to a Duration, 0 for none, saturating
// instead of overflowing (a header may say anything); MaxPause clamps it
// later.
func seconds(s float64) time.Duration {
	if s <= 0 {
		return 0
	}
	if s >= float64(math.MaxInt64)/float64(time.Second) {
		return math.MaxInt64
	}
	return time.Duration(math.Ceil(s * float64(time.Second)))
}

// ceilMillis rounds d > 0 up to a whole millisecond, the unit of a window.
func ceilMillis(d time.Duration) time.Duration {
	if r := d % time.Millisecond; r != 0 && d < math.MaxInt64-time.Millisecond {
		return d - r + time.Millisecond
	}
	return d.Truncate(time.Millisecond)
}
