package redis

import (
	"context"
	_ "embed"
	"fmt"
	"slices"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/internal/algo"
	"github.com/throttlekit/throttlekit/throttler"
)

// Composites (throttler.All; "Composites" in docs/backends-redis.md). A
// composite's Take or Peek is one request, all.lua on every member's key,
// which the members' own scripts' functions run: each member's state, key
// and arithmetic are those of the member taken alone. The script reads
// every member, and writes only when every one admits the cost; its reply
// holds each member's answer as the member's own script gives it, from
// which the member's Decision is computed here as for the member alone,
// then combined (throttler.Combine). The request goes where a single
// Take or Peek goes (the primary, a replica for a Peek), alone or in a
// batch, and is followed by WAIT when the backend waits for replicas.
//
// The keys must share a Cluster slot and a shard (Traits): a Backend that
// cannot be sure of it takes no composite, and a Throttler refuses one
// before calling it. The over-limit cache answers single Takes only; an
// admitted composite drops what it holds of the members, as their own
// admitted Takes do.

//go:embed scripts/all.lua
var allSource string

// allScripts are all.lua for each mix of algorithms, by a bit per
// throttler.Algorithm: each holds the functions of its algorithms only, for
// a script pays for every function it defines on every call (a closure
// each). all.lua names the others' functions only in branches that no
// member of its mix takes.
var allScripts = func() (s [1 << 4]*goredis.Script) {
	for mix := 1; mix < len(s); mix++ {
		has := func(a throttler.Algorithm) bool { return mix&(1<<a) != 0 }
		src := ""
		if has(throttler.SlidingWindow) {
			src += numbersSource
		}
		if has(throttler.TokenBucket) || has(throttler.SlidingWindow) {
			src += ceildivSource
		}
		for _, a := range []struct {
			alg throttler.Algorithm
			src string
		}{{throttler.FixedWindow, windowSource}, {throttler.TokenBucket, bucketSource},
			{throttler.SlidingWindow, counterSource}, {throttler.SlidingLog, logSource}} {
			if has(a.alg) {
				src += a.src
			}
		}
		s[mix] = goredis.NewScript(src + allSource)
	}
	return s
}()

// errNoComposites answers a composite on a Backend whose members' keys may
// be apart (see Traits): bad input, never a store failure.
var errNoComposites = fmt.Errorf("%w: this redis Backend takes no composites: its keys may be on several "+
	"shards or Cluster slots; set Options.TagByKey", throttler.ErrInvalidPolicy)

// replyLen is how many values each algorithm's reply holds in all.lua's.
var replyLen = [...]int{throttler.FixedWindow: 3, throttler.TokenBucket: 7, throttler.SlidingLog: 4,
	throttler.SlidingWindow: 9}

// firstMember is a composite's first member.
func firstMember(p throttler.Policy) throttler.Policy {
	for _, m := range p.Members() {
		return m
	}
	return p
}

// composite runs op (OpTake, or OpPeek with cost 1) of the valid composite
// p on key: all.lua on the members' shard.
func (b *Backend) composite(ctx context.Context, op throttler.Op, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	if !b.composites {
		return throttler.Decision{}, errNoComposites
	}
	t := now.UnixMilli()
	var ms [throttler.MaxMembers]throttler.Policy
	n, size := 0, 1
	keys := make([]string, 0, throttler.MaxMembers)
	args := make([]any, 4, 4+5*throttler.MaxMembers)
	args[0], args[1], args[2], args[3] = int(op), t, cost, b.marginMS
	var s *shard
	var hs [throttler.MaxMembers]uint64
	mix := 0
	for i, m := range p.Members() {
		mix |= 1 << m.Algorithm
		sk, h := b.keyOf(m, key)
		hs[i] = h
		if i == 0 {
			s = b.shardFor(h)
		} else if b.shardFor(h) != s { // unreachable while Traits say Composites
			return throttler.Decision{}, errNoComposites
		}
		w := m.Window.Milliseconds()
		var x, y int64
		switch m.Algorithm {
		case throttler.FixedWindow:
			x, y = t+w, w+b.marginMS
		case throttler.TokenBucket:
			x = m.Capacity()
		case throttler.SlidingLog:
			x = t - w
		}
		keys = append(keys, sk)
		args = append(args, int(m.Algorithm), w, m.Limit, x, y)
		ms[i], n, size = m, i+1, size+replyLen[m.Algorithm]
	}
	var ds [throttler.MaxMembers]throttler.Decision
	req := &request{fn: fnAll, sk: keys[0], keys: keys, args: args, script: allScripts[mix]}
	err := b.exec(ctx, s, op, req, func(reply any) error {
		var buf [1 + throttler.MaxMembers*9]int64
		res := buf[:size]
		if err := parsePacked(reply, res); err != nil {
			return err
		}
		admitted := res[0] == 1
		if res[0] < 0 || res[0] > 1 || admitted && op != throttler.OpTake {
			return fmt.Errorf("%w: admitted %d", ErrUnexpectedReply, res[0])
		}
		at := 1
		all := true
		for i := range n {
			k := replyLen[ms[i].Algorithm]
			d, err := memberAnswer(ms[i], op, admitted, res[at:at+k], cost, t, now)
			if err != nil {
				return fmt.Errorf("member %d: %w", i, err)
			}
			ds[i], at, all = d, at+k, all && d.Allowed
		}
		if op == throttler.OpTake && all != admitted {
			return fmt.Errorf("%w: admitted %d, members' answers %v", ErrUnexpectedReply, res[0], all)
		}
		return nil
	})
	if err != nil {
		return throttler.Decision{}, opError(op.String(), key, p, err)
	}
	d := throttler.Combine(ds[:n])
	if b.cache != nil && op == throttler.OpTake && d.Allowed {
		// Each member counted more, as its own admitted Take would have:
		// what the cache holds of it is not Redis's state any more.
		for i, sk := range keys {
			b.cache.drop(sk, hs[i])
		}
	}
	return d, nil
}

// memberAnswer is the Decision of member p from its reply res in all.lua's,
// for a composite's op that was admitted or not: a Peek's, a Take's when
// the composite was admitted or p denied it, and otherwise (p would have
// admitted a denied composite) its state as it stands, a Peek's, Allowed.
func memberAnswer(p throttler.Policy, op throttler.Op, admitted bool, res []int64, cost, t int64, now time.Time) (throttler.Decision, error) {
	var (
		d   throttler.Decision
		err error
	)
	peek := op == throttler.OpPeek
	switch p.Algorithm {
	case throttler.FixedWindow:
		if res[0] < 0 || res[0] > 1 || res[1] < 0 {
			return d, fmt.Errorf("%w: %v", ErrUnexpectedReply, slices.Clone(res)) // res stays on the stack
		}
		if peek = peek || !admitted && res[0] == 1; peek {
			d = algo.PeekState(p, res[1], time.UnixMilli(res[2]), now)
		} else {
			d = algo.WindowState(p, res[1], time.UnixMilli(res[2]), now, res[0] == 1)
		}
	case throttler.TokenBucket:
		if !peek && !admitted {
			peek, err = admits(p, res, bucketState, algo.TokenBucket, cost, t)
		}
		if err == nil {
			d, _, _, err = bucketAnswer(p, res, opOf(peek), cost, 0, t)
		}
	case throttler.SlidingWindow:
		if !peek && !admitted {
			peek, err = admits(p, res, counterState, algo.Counter, cost, t)
		}
		if err == nil {
			d, _, _, err = counterAnswer(p, res, opOf(peek), cost, 0, t)
		}
	default:
		d, err = logAnswer(p, res)
		peek = peek || !admitted && d.Allowed
	}
	switch {
	case err != nil:
	case op == throttler.OpTake && peek:
		// It would have admitted the cost: a Peek for one unit admits.
		if !d.Allowed || d.Remaining < cost {
			err = fmt.Errorf("%w: a member that admits %d has %d left", ErrUnexpectedReply, cost, d.Remaining)
		}
	case op == throttler.OpTake && d.Allowed != admitted:
		err = fmt.Errorf("%w: a member's Take says %v in a composite that says %v", ErrUnexpectedReply, d.Allowed, admitted)
	}
	return d, err
}

// admits reports whether the state that a bucket's or a counter's reply
// res holds (read by state) admits a Take of cost at t, by step, the
// algorithm's Go function.
func admits[S any](p throttler.Policy, res []int64, state func([]int64) (bool, bool, S, error),
	step func(throttler.Policy, S, bool, throttler.Op, int64, int64, int64) (throttler.Decision, S, bool), cost, t int64) (bool, error) {
	_, stored, st, err := state(res)
	if err != nil {
		return false, err
	}
	_, _, write := step(p, st, stored, throttler.OpTake, cost, 0, t)
	return write, nil
}

// opOf is OpPeek when peek, else OpTake.
func opOf(peek bool) throttler.Op {
	if peek {
		return throttler.OpPeek
	}
	return throttler.OpTake
}
