package httplimit

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/throttlekit/throttlekit/throttler"
)

func TestCeilSeconds(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int64
	}{
		{-time.Second, 0},
		{0, 0},
		{time.Nanosecond, 1},
		{time.Second, 1},
		{time.Second + time.Millisecond, 2},
		{50 * time.Second, 50},
	} {
		assert.Equal(t, tc.want, ceilSeconds(tc.d), "%v", tc.d)
	}
}

func TestUnixCeil(t *testing.T) {
	at := time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)
	assert.Equal(t, at.Unix(), unixCeil(at), "a whole second is itself")
	assert.Equal(t, at.Unix()+1, unixCeil(at.Add(time.Nanosecond)))
	assert.Equal(t, at.Unix()+1, unixCeil(at.Add(999*time.Millisecond)))
}

func TestSetHeaders(t *testing.T) {
	at := time.Date(2031, time.March, 4, 5, 6, 7, 250_000_000, time.UTC)
	h := http.Header{}
	setHeaders(h, "", throttler.Decision{Limit: 10, Remaining: 3, Used: 7}, at)
	assert.Equal(t, http.Header{
		"X-Ratelimit-Limit":     {"10"},
		"X-Ratelimit-Remaining": {"3"},
		"X-Ratelimit-Used":      {"7"},
		"X-Ratelimit-Reset":     {"1930367168"},
	}, h)
	setHeaders(h, "", throttler.Decision{Limit: 10}, time.Time{})
	assert.Equal(t, http.Header{"X-Ratelimit-Limit": {"10"}}, h, "no count is claimed when none is known")
	setHeaders(h, "core", throttler.Decision{Limit: 10}, time.Time{})
	assert.Equal(t, http.Header{"X-Ratelimit-Limit": {"10"}, "X-Ratelimit-Resource": {"core"}}, h, "a named limit names itself")
}
