package throttler

import "fmt"

// Algorithm says how a backend counts a Policy. Every backend implements
// every algorithm with the same answers to the millisecond (docs/algorithms.md
// has the arithmetic), so a router or a shadow works the same for all of them.
type Algorithm uint8

const (
	// FixedWindow counts Limit units in a window opened by the key's first
	// counted unit and ending Window later (GitHub's limiter). The zero
	// value.
	FixedWindow Algorithm = iota
	// TokenBucket refills Limit tokens per Window into a bucket of
	// capacity Burst (Limit when 0), one token per unit (Stripe's request
	// rate limiter): a steady rate with bursts.
	TokenBucket
	// SlidingLog admits at most Limit units in any Window, logging every
	// admitted request (the Circles outbound limiter). Exact, and its
	// state grows with Limit, which is bounded by MaxLogLimit.
	SlidingLog
	// SlidingWindow weighs the previous epoch-aligned window's count by how
	// much of it still overlaps the last Window (Cloudflare's sliding-window
	// counter): smooth like a log, two counters per key.
	SlidingWindow
)

var algorithmNames = [...]string{"fixed-window", "token-bucket", "sliding-log", "sliding-window"}

// String returns "fixed-window", "token-bucket", "sliding-log" or
// "sliding-window", and "Algorithm(n)" for anything else.
func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// MaxLogLimit is the largest Limit of a SlidingLog policy: it bounds a
// key's log (at most one entry per admitted request still in the window),
// so that it fits in one Memcached item and one Redis call stays short.
const MaxLogLimit = 10_000

// maxScaled is the bound on Burst·Window(ms) for a token bucket and
// Limit·Window(ms) for a sliding window: 2^53, which Redis's Lua numbers
// (doubles) hold exactly.
const maxScaled = 1 << 53
