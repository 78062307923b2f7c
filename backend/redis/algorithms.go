package redis

import (
	"context"
	_ "embed"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/internal/algo"
	"github.com/throttlekit/throttlekit/throttler"
)

// The token bucket, the sliding log and the sliding-window counter
// (docs/algorithms.md): one script per algorithm, one round trip per call,
// all of a (policy, key)'s state in one key, marked after its hash tag
// (keys.go) because its layout is not the one these algorithms had before
// they were released.
//
// The bucket's and the counter's state is one string (a bucket's three
// doubles, a counter's decimals), read with GET and written with SET: two
// commands a call, the expiry kept (KEEPTTL) unless it must move later.
// Their scripts admit and write
// in Lua, and return the state they read (packed as doubles in one
// string, parsePacked); the Decision is then computed in
// Go by algo.TokenBucket or algo.Counter from that state, so it is the
// memory backend's to the millisecond. A Peek runs the same script, which
// writes nothing then, on a replica when the shard has one, and the same
// function on the state it returns with the caller's now: a replica that
// lags answers as the primary did when it held that state. The Go function
// must also agree with the script on whether it wrote and what, or the
// call fails with ErrUnexpectedReply. The log's entries are too many to
// return, so its script computes the Decision itself, a Peek included,
// with a few O(log n) commands on a sorted set of one member per unit: it
// never reads the whole log.

var (
	// numbersSource and ceildivSource are the preludes the scripts
	// share: each script is given only those it uses.
	//go:embed scripts/numbers.lua
	numbersSource string
	//go:embed scripts/ceildiv.lua
	ceildivSource string
	// bucketSource, counterSource and logSource define each algorithm's
	// functions; a one_*.lua file runs them for one policy, all.lua for a
	// composite's members (composite.go).
	//go:embed scripts/bucket.lua
	bucketSource string
	//go:embed scripts/one_bucket.lua
	oneBucketSource string
	bucketScript    = goredis.NewScript(ceildivSource + bucketSource + oneBucketSource)
	//go:embed scripts/counter.lua
	counterSource string
	//go:embed scripts/one_counter.lua
	oneCounterSource string
	counterScript    = goredis.NewScript(numbersSource + ceildivSource + counterSource + oneCounterSource)
	//go:embed scripts/log.lua
	logSource string
	//go:embed scripts/one_log.lua
	oneLogSource string
	logScript    = goredis.NewScript(logSource + oneLogSource)
)

// maxStored bounds a stored number's magnitude: 2^53, up to which the
// scripts' doubles hold every integer (a full bucket may hold 2^53 scaled
// tokens). A state holding a number beyond it reads as none (numbers.lua),
// so a script never returns one.
const maxStored = 1 << 53

// algorithmKey is the storage key of (p, key): the layout of keys.go, named
// by identity.Rate, which holds the algorithm, and marked (see keys.go).
func (b *Backend) algorithmKey(p throttler.Policy, key string) (string, uint64) {
	return b.markedKey(p, key, algorithmMarker)
}

// bucket runs op on a token bucket: one_bucket.lua, on the primary for a Take
// or Refund (r: its receipt), on a replica (then the primary) for a Peek.
// A denied Take leaves the state it read in denial, when given.
func (b *Backend) bucket(ctx context.Context, s *shard, sk string, op throttler.Op, p throttler.Policy, cost, r, t int64, denial *overLimit) (throttler.Decision, error) {
	var d throttler.Decision
	req := &request{fn: fnBucket, sk: sk,
		args: []any{int(op), t, p.Window.Milliseconds(), p.Limit, p.Capacity(), cost, b.marginMS}}
	if op == throttler.OpRefund {
		req.args = append(req.args, r) // the script's last argument
	}
	err := b.exec(ctx, s, op, req, func(reply any) error {
		var res [7]int64
		if err := parsePacked(reply, res[:]); err != nil {
			return err
		}
		var (
			st     algo.TokenBucketState
			stored bool
			err    error
		)
		d, st, stored, err = bucketAnswer(p, res[:], op, cost, r, t)
		if err == nil && denial != nil {
			denial.bucket, denial.stored = st, stored
		}
		return err
	})
	return d, err
}

// bucketState reads a bucket script's reply (parsePacked's seven values):
// whether it wrote, and the state it read.
func bucketState(res []int64) (wrote, stored bool, st algo.TokenBucketState, err error) {
	wrote, stored, err = scriptFlags(res[0], res[1], res[2:5])
	return wrote, stored, algo.TokenBucketState{Tokens: res[2], At: res[3], Window: res[4]}, err
}

// bucketAnswer is the Decision of op on a bucket from its script's reply,
// computed by algo.TokenBucket from the state the script read, with that
// state; a script that wrote otherwise than Go would have is an
// ErrUnexpectedReply.
func bucketAnswer(p throttler.Policy, res []int64, op throttler.Op, cost, r, t int64) (throttler.Decision, algo.TokenBucketState, bool, error) {
	wrote, stored, st, err := bucketState(res)
	if err != nil {
		return throttler.Decision{}, st, stored, err
	}
	d, next, write := algo.TokenBucket(p, st, stored, op, cost, r, t)
	if write != wrote || next.Tokens != res[5] || next.At != res[6] {
		return throttler.Decision{}, st, stored, disagree(res, write, next)
	}
	return d, st, stored, nil
}

// counter runs op on a sliding-window counter: one_counter.lua, on the primary
// for a Take or Refund (r: its receipt), on a replica (then the primary)
// for a Peek. A denied Take leaves the state it read in denial, when given.
func (b *Backend) counter(ctx context.Context, s *shard, sk string, op throttler.Op, p throttler.Policy, cost, r, t int64, denial *overLimit) (throttler.Decision, error) {
	var d throttler.Decision
	req := &request{fn: fnCounter, sk: sk,
		args: []any{int(op), t, p.Window.Milliseconds(), p.Limit, cost, b.marginMS}}
	if op == throttler.OpRefund {
		req.args = append(req.args, r) // the script's last argument
	}
	err := b.exec(ctx, s, op, req, func(reply any) error {
		var res [9]int64
		if err := parsePacked(reply, res[:]); err != nil {
			return err
		}
		var (
			st     algo.CounterState
			stored bool
			err    error
		)
		d, st, stored, err = counterAnswer(p, res[:], op, cost, r, t)
		if err == nil && denial != nil {
			denial.counter, denial.stored = st, stored
		}
		return err
	})
	return d, err
}

// counterState reads a counter script's reply (parsePacked's nine values):
// whether it wrote, and the state it read.
func counterState(res []int64) (wrote, stored bool, st algo.CounterState, err error) {
	wrote, stored, err = scriptFlags(res[0], res[1], res[2:6])
	return wrote, stored, algo.CounterState{K: res[2], Curr: res[3], Prev: res[4], Window: res[5]}, err
}

// counterAnswer is bucketAnswer for a sliding-window counter.
func counterAnswer(p throttler.Policy, res []int64, op throttler.Op, cost, r, t int64) (throttler.Decision, algo.CounterState, bool, error) {
	wrote, stored, st, err := counterState(res)
	if err != nil {
		return throttler.Decision{}, st, stored, err
	}
	d, next, write := algo.Counter(p, st, stored, op, cost, r, t)
	if write != wrote || next.K != res[6] || next.Curr != res[7] || next.Prev != res[8] {
		return throttler.Decision{}, st, stored, disagree(res, write, next)
	}
	return d, st, stored, nil
}

// log runs op on a sliding log: one_log.lua, on the primary for a Take or
// Refund (r: its receipt), on a replica (then the primary) for a Peek.
func (b *Backend) log(ctx context.Context, s *shard, sk string, op throttler.Op, p throttler.Policy, cost, r, t int64) (throttler.Decision, error) {
	var res [4]int64
	w := p.Window.Milliseconds()
	req := &request{fn: fnLog, sk: sk, args: []any{int(op), t, w, p.Limit, cost, b.marginMS, t - w}}
	if op == throttler.OpRefund {
		req.args = append(req.args, r-w) // the script's last argument
	}
	var d throttler.Decision
	err := b.exec(ctx, s, op, req, func(reply any) (err error) {
		if err = parsePacked(reply, res[:]); err == nil {
			d, err = logAnswer(p, res[:])
		}
		return err
	})
	return d, err
}

// logAnswer is the Decision of a log script's reply (parsePacked's four
// values: allowed, used, reset-at, retry-after).
func logAnswer(p throttler.Policy, res []int64) (throttler.Decision, error) {
	if res[0] < 0 || res[0] > 1 || res[1] < 0 || res[3] < 0 || (res[0] == 1 && res[3] != 0) {
		return throttler.Decision{}, fmt.Errorf("%w: %v", ErrUnexpectedReply, slices.Clone(res)) // res stays on the stack
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

// parsePacked reads the reply of a script that packs its answer as
// little-endian doubles (struct.pack '<d...'), one per value of out: each
// must be an integer of magnitude at most maxStored, exact in a double.
// One string costs the server and the client less than an array of
// integers (Redis converts a Lua table field by field, and go-redis boxes
// each integer): about 1 µs of the server's time per call, measured.
func parsePacked(reply any, out []int64) error {
	s, ok := reply.(string)
	if !ok {
		return fmt.Errorf("%w: %T, want a packed string", ErrUnexpectedReply, reply)
	}
	if len(s) != 8*len(out) {
		return fmt.Errorf("%w: %d bytes, want %d", ErrUnexpectedReply, len(s), 8*len(out))
	}
	for i := range out {
		f := math.Float64frombits(binary.LittleEndian.Uint64([]byte(s[8*i : 8*i+8])))
		if f != math.Trunc(f) || f > maxStored || f < -maxStored { // NaN fails the first
			return fmt.Errorf("%w: value %d is %v, want an integer within 2^53", ErrUnexpectedReply, i, f)
		}
		out[i] = int64(f)
	}
	return nil
}

// scriptFlags checks a state script's reply (parsePacked bounded every
// value by maxStored): wrote and stored are 0 or 1, and the state read is
// zeros when none was stored.
func scriptFlags(wrote, stored int64, state []int64) (bool, bool, error) {
	bad := wrote < 0 || wrote > 1 || stored < 0 || stored > 1
	for _, v := range state {
		bad = bad || (stored == 0 && v != 0)
	}
	if bad {
		return false, false, fmt.Errorf("%w: %d, %d, %v", ErrUnexpectedReply, wrote, stored, slices.Clone(state))
	}
	return wrote == 1, stored == 1, nil
}

// disagree reports a script whose admission or next state differs from
// Go's: a bug, surfaced as an error rather than answered.
func disagree(reply []int64, write bool, next any) error {
	return fmt.Errorf("%w: the script replied %v; Go writes %v, state %+v", ErrUnexpectedReply, slices.Clone(reply), write, next)
}
