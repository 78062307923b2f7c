package algo_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/throttlekit/throttlekit/internal/algo"
	"github.com/throttlekit/throttlekit/throttler"
)

var t0 = time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)

func TestWindowState(t *testing.T) {
	p := throttler.Policy{Limit: 10, Window: time.Minute}
	tests := []struct {
		name    string
		used    int64
		resetAt time.Time
		allowed bool
		want    throttler.Decision
	}{
		{"open", 4, t0.Add(30 * time.Second), true, throttler.Decision{Allowed: true, Limit: 10, Used: 4, Remaining: 6, ResetAt: t0.Add(30 * time.Second)}},
		{"denied", 10, t0.Add(30 * time.Second), false, throttler.Decision{Limit: 10, Used: 10, Remaining: 0, ResetAt: t0.Add(30 * time.Second), RetryAfter: 30 * time.Second}},
		{"over a lowered limit", 12, t0.Add(time.Second), false, throttler.Decision{Limit: 10, Used: 12, Remaining: 0, ResetAt: t0.Add(time.Second), RetryAfter: time.Second}},
		{"absent", 0, time.Time{}, true, throttler.Decision{Allowed: true, Limit: 10, Remaining: 10, ResetAt: t0.Add(time.Minute)}},
		{"ended at now", 7, t0, true, throttler.Decision{Allowed: true, Limit: 10, Remaining: 10, ResetAt: t0.Add(time.Minute)}},
		{"ended before now", 7, t0.Add(-time.Second), true, throttler.Decision{Allowed: true, Limit: 10, Remaining: 10, ResetAt: t0.Add(time.Minute)}},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, algo.WindowState(p, tc.used, tc.resetAt, t0, tc.allowed), tc.name)
	}
}

func TestPeekState(t *testing.T) {
	p := throttler.Policy{Limit: 10, Window: time.Minute}
	tests := []struct {
		name    string
		used    int64
		resetAt time.Time
		want    throttler.Decision
	}{
		{"room for one more", 9, t0.Add(time.Second), throttler.Decision{Allowed: true, Limit: 10, Used: 9, Remaining: 1, ResetAt: t0.Add(time.Second)}},
		{"full", 10, t0.Add(time.Second), throttler.Decision{Limit: 10, Used: 10, ResetAt: t0.Add(time.Second), RetryAfter: time.Second}},
		{"over a lowered limit", 15, t0.Add(2 * time.Second), throttler.Decision{Limit: 10, Used: 15, ResetAt: t0.Add(2 * time.Second), RetryAfter: 2 * time.Second}},
		{"absent", 0, time.Time{}, throttler.Decision{Allowed: true, Limit: 10, Remaining: 10, ResetAt: t0.Add(time.Minute)}},
		{"ended", 10, t0, throttler.Decision{Allowed: true, Limit: 10, Remaining: 10, ResetAt: t0.Add(time.Minute)}},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, algo.PeekState(p, tc.used, tc.resetAt, t0), tc.name)
	}
}
