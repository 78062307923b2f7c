package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/throttler"
)

// The token bucket, the sliding log and the sliding-window counter
// (docs/algorithms.md): one script per algorithm, one round trip per call,
// all of a (policy, key)'s state in the one key of the existing layout.
//
// The bucket's and the counter's scripts admit and write in Lua, and return
// the state they read; the Decision is then computed in Go by
// backend.Bucket or backend.Counter from that state, so it is the memory
// backend's to the millisecond, and a Peek (HMGET on a replica) runs the
// same function on the state it reads with the caller's now: a replica that
// lags answers as the primary did when it held that state. The Go function
// must also agree with the script on whether it wrote, or the call fails
// with ErrUnexpectedReply. The log's entries are too many to return, so its
// script computes the Decision itself, a Peek included (a script that
// writes nothing, which replicas run), with a few O(log n) commands on a
// sorted set of one member per unit: it never reads the whole log.

var (
	// numbersSource is the prelude the bucket and counter scripts share.
	//go:embed scripts/numbers.lua
	numbersSource string
	//go:embed scripts/bucket.lua
	bucketSource string
	bucketScript = goredis.NewScript(numbersSource + bucketSource)
	//go:embed scripts/counter.lua
	counterSource string
	counterScript = goredis.NewScript(numbersSource + counterSource)
	//go:embed scripts/log.lua
	logSource string
	logScript = goredis.NewScript(logSource)
)

// maxStored bounds a stored number's magnitude: 2^53, up to which the
// scripts' doubles hold every integer (a full bucket may hold 2^53 scaled
// tokens). A field beyond it, or not a decimal integer of at most 16
// digits, reads as no state, in the scripts as here.
const maxStored = 1 << 53

// apply runs op under p's algorithm, which is not FixedWindow. The input
// has been validated.
func (b *Backend) apply(ctx context.Context, op throttler.Op, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	sk, h := b.algorithmKey(p, key)
	s := b.shardFor(h)
	t := now.UnixMilli()
	var (
		d   throttler.Decision
		err error
	)
	switch p.Algorithm {
	case throttler.TokenBucket:
		d, err = b.bucket(ctx, s, sk, op, p, cost, t)
	case throttler.SlidingWindow:
		d, err = b.counter(ctx, s, sk, op, p, cost, t)
	case throttler.SlidingLog:
		d, err = b.log(ctx, s, sk, op, p, cost, t)
	default: // unreachable after validation
		err = fmt.Errorf("%w: algorithm %v", throttler.ErrInvalidPolicy, p.Algorithm)
	}
	if err != nil {
		return throttler.Decision{}, opError(op.String(), key, p, err)
	}
	return d, nil
}

// algorithmKey is the storage key of (p, key): the layout of keys.go, named
// by backend.Identity, which holds the algorithm; a sliding log's is marked
// (see keys.go).
func (b *Backend) algorithmKey(p throttler.Policy, key string) (string, uint64) {
	if p.Algorithm == throttler.SlidingLog {
		return b.markedKey(p, key, logMarker)
	}
	return b.storageKey(p, key)
}

// bucket runs op on a token bucket: bucket.lua for a Take or Refund on the
// primary, HMGET for a Peek.
func (b *Backend) bucket(ctx context.Context, s *shard, sk string, op throttler.Op, p throttler.Policy, cost, t int64) (throttler.Decision, error) {
	var st backend.BucketState
	var stored bool
	if op == throttler.OpPeek {
		var f [3]int64
		ok, err := b.readFields(ctx, s, sk, []string{"s", "t", "w"}, f[:])
		if err != nil {
			return throttler.Decision{}, err
		}
		st, stored = backend.BucketState{Tokens: f[0], At: f[1], Window: f[2]}, ok
		d, _, _ := backend.Bucket(p, st, stored, op, cost, t)
		return d, nil
	}
	w := p.Window.Milliseconds()
	var res [7]int64
	err := parseInts(bucketScript.Run(ctx, s.primary, []string{sk},
		int(op), t, w, p.Limit, p.Capacity(), cost, b.marginMS), res[:])
	if err != nil {
		return throttler.Decision{}, err
	}
	wrote, stored, err := scriptFlags(res[0], res[1], res[2:5])
	if err != nil {
		return throttler.Decision{}, err
	}
	st = backend.BucketState{Tokens: res[2], At: res[3], Window: res[4]}
	d, next, write := backend.Bucket(p, st, stored, op, cost, t)
	if write != wrote || next.Tokens != res[5] || next.At != res[6] {
		return throttler.Decision{}, disagree(res[:], write, next)
	}
	return d, nil
}

// counter runs op on a sliding-window counter: counter.lua for a Take or
// Refund on the primary, HMGET for a Peek.
func (b *Backend) counter(ctx context.Context, s *shard, sk string, op throttler.Op, p throttler.Policy, cost, t int64) (throttler.Decision, error) {
	if op == throttler.OpPeek {
		var f [4]int64
		ok, err := b.readFields(ctx, s, sk, []string{"k", "c", "p", "w"}, f[:])
		if err != nil {
			return throttler.Decision{}, err
		}
		d, _, _ := backend.Counter(p, backend.CounterState{K: f[0], Curr: f[1], Prev: f[2], Window: f[3]}, ok, op, cost, t)
		return d, nil
	}
	w := p.Window.Milliseconds()
	var res [9]int64
	err := parseInts(counterScript.Run(ctx, s.primary, []string{sk},
		int(op), t, w, p.Limit, cost, b.marginMS), res[:])
	if err != nil {
		return throttler.Decision{}, err
	}
	wrote, stored, err := scriptFlags(res[0], res[1], res[2:6])
	if err != nil {
		return throttler.Decision{}, err
	}
	st := backend.CounterState{K: res[2], Curr: res[3], Prev: res[4], Window: res[5]}
	d, next, write := backend.Counter(p, st, stored, op, cost, t)
	if write != wrote || next.K != res[6] || next.Curr != res[7] || next.Prev != res[8] {
		return throttler.Decision{}, disagree(res[:], write, next)
	}
	return d, nil
}

// log runs op on a sliding log: log.lua, on the primary for a Take or
// Refund, on a replica (then the primary) for a Peek.
func (b *Backend) log(ctx context.Context, s *shard, sk string, op throttler.Op, p throttler.Policy, cost, t int64) (throttler.Decision, error) {
	var res [4]int64
	run := func(c Client) error {
		w := p.Window.Milliseconds()
		return parseInts(logScript.Run(ctx, c, []string{sk},
			int(op), t, w, p.Limit, cost, b.marginMS, t-w), res[:])
	}
	var err error
	if op == throttler.OpPeek {
		err = b.read(ctx, s, run)
	} else {
		err = run(s.primary)
	}
	if err == nil && (res[0] < 0 || res[0] > 1 || res[1] < 0 || res[3] < 0 || (res[0] == 1 && res[3] != 0)) {
		err = fmt.Errorf("%w: %v", ErrUnexpectedReply, res)
	}
	if err != nil {
		return throttler.Decision{}, err
	}
	return throttler.Decision{
		Allowed:    res[0] == 1,
		Limit:      p.Limit,
		Used:       res[1],
		Remaining:  max(0, p.Limit-res[1]),
		ResetAt:    time.UnixMilli(res[2]),
		RetryAfter: time.Duration(res[3]) * time.Millisecond,
	}, nil
}

// scriptFlags checks a state script's reply: wrote and stored are 0 or 1,
// the state read is within maxStored, and zeros when none was stored.
func scriptFlags(wrote, stored int64, state []int64) (bool, bool, error) {
	bad := wrote < 0 || wrote > 1 || stored < 0 || stored > 1
	for _, v := range state {
		bad = bad || v < -maxStored || v > maxStored || (stored == 0 && v != 0)
	}
	if bad {
		return false, false, fmt.Errorf("%w: %d, %d, %v", ErrUnexpectedReply, wrote, stored, state)
	}
	return wrote == 1, stored == 1, nil
}

// disagree reports a script whose admission or next state differs from
// Go's: a bug, surfaced as an error rather than answered.
func disagree(reply []int64, write bool, next any) error {
	return fmt.Errorf("%w: the script replied %v; Go writes %v, state %+v", ErrUnexpectedReply, reply, write, next)
}

// readFields reads a state's hash fields into out, on a replica when the
// shard has one. It reports whether every field is stored as the scripts
// read it (see maxStored); otherwise the state reads as none.
func (b *Backend) readFields(ctx context.Context, s *shard, sk string, fields []string, out []int64) (bool, error) {
	ok := false
	err := b.read(ctx, s, func(c Client) error {
		vals, err := c.HMGet(ctx, sk, fields...).Result()
		if err != nil {
			return err
		}
		if len(vals) != len(fields) {
			return fmt.Errorf("%w: HMGET gave %d values for %d fields", ErrUnexpectedReply, len(vals), len(fields))
		}
		ok = true
		for i, v := range vals {
			str, isStr := v.(string)
			n, good := parseStored(str)
			out[i] = n
			ok = ok && isStr && good
		}
		return nil
	})
	return ok, err
}

// read runs f on one of the shard's replicas, round robin, and on the
// primary when that fails for a reason other than its reply; on the primary
// when the shard has no replica.
func (b *Backend) read(ctx context.Context, s *shard, f func(Client) error) error {
	n := len(s.replicas)
	if n == 0 {
		return f(s.primary)
	}
	err := f(s.replicas[(s.next.Add(1)-1)%uint32(n)])
	if err != nil && ctx.Err() == nil && !errors.Is(err, ErrUnexpectedReply) {
		err = f(s.primary)
	}
	return err
}

// parseStored reads a stored field as the scripts do: an optional '-' and
// at most 16 decimal digits, at most 2^53 in magnitude.
func parseStored(s string) (int64, bool) {
	neg := len(s) > 0 && s[0] == '-'
	digits := s
	if neg {
		digits = s[1:]
	}
	if len(digits) == 0 || len(digits) > 16 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(digits); i++ {
		c := digits[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0') // 16 digits fit in an int64
	}
	if n > maxStored {
		return 0, false
	}
	if neg {
		n = -n
	}
	return n, true
}
