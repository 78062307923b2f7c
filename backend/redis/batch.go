package redis

import (
	"context"
	_ "embed"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/internal/redisbatch"
)

// Batching (docs/backends-redis.md, "Batching"). Every operation is a
// request: one script (or a fixed window's HMGET) on one key. A lane is one
// client of one shard (its primary, or one replica). A request on a lane
// with fewer than maxInFlight round trips under way is sent at once, in
// the caller's goroutine, with the caller's context: a call alone on an
// idle client costs what it did before batching. Otherwise it queues, and
// the next round trip of the lane carries every queued request, up to
// Options.MaxBatch: one batch.lua call that runs them all in order, or,
// on a Cluster or a Ring, one pipeline of one such call per hash slot (per
// key on a Ring), since a script's keys must share a node.
//
// A queued caller waits for its reply or for its own context, whichever
// ends first. One that leaves before its batch is sent is skipped (its
// operation never runs); one that leaves after its operation ran; its
// result is dropped, and a unit it took stays taken. A batch is sent with
// the latest deadline of its callers (none if one of them has none), so
// it never outlives the patience of all of them.

// A script's number in batch.lua.
const (
	fnTake = 1 + iota
	fnRefund
	fnBucket
	fnCounter
	fnLog
	fnPeek // a fixed window's HMGET u r; not a script of its own
)

var (
	//go:embed scripts/batch.lua
	batchDispatch string
	batchScript   = goredis.NewScript(numbersSource +
		function("take", takeSource) + function("refund", refundSource) +
		function("bucket", bucketSource) + function("counter", counterSource) +
		function("log", logSource) +
		"local function peek(KEYS, ARGV)\n  return redis.call('HMGET', KEYS[1], 'u', 'r')\nend\n" +
		batchDispatch)
	// scripts are the scripts of single requests, by number.
	scripts = [...]*goredis.Script{fnTake: takeScript, fnRefund: refundScript,
		fnBucket: bucketScript, fnCounter: counterScript, fnLog: logScript}
)

// function wraps a script's source as a local Lua function of (KEYS, ARGV).
func function(name, source string) string {
	return "local function " + name + "(KEYS, ARGV)\n" + source + "\nend\n"
}

// maxInFlight is how many round trips a lane has under way before the
// requests that arrive queue for the next batch: two, so that Redis runs
// one batch while the next is on its way or being answered.
const maxInFlight = 2

// maxBatchLimit bounds Options.MaxBatch.
const maxBatchLimit = 4096

// request is one operation for Redis.
type request struct {
	fn   int
	sk   string
	h    uint64 // sk's hash: its Cluster slot's and its Ring shard's
	args []any
}

// laneKind is how a lane's client routes keys, and so how a batch is cut.
type laneKind uint8

const (
	laneDirect laneKind = iota // never batched: the AutoPipeliner, a client the backend does not know
	laneOne                    // one server: one script call per batch
	laneSlots                  // a Cluster: one call per hash slot, in a pipeline
	laneKeys                   // a Ring: one call per key hash, in a pipeline
)

// lane batches the requests of one client.
type lane struct {
	c     Client
	kind  laneKind
	pipe  func() goredis.Pipeliner
	max   int
	stats *counters

	always bool // tests: every request goes through batch.lua (redisbatch.Always)
	perOp  bool // benchmarks: a batch is a pipeline of one script per request

	mu       sync.Mutex
	inFlight int
	queue    []*pending
}

func newLane(c Client, maxBatch int, stats *counters) *lane {
	l := &lane{c: c, max: maxBatch, stats: stats, always: redisbatch.Always.Load()}
	switch x := c.(type) {
	case *goredis.Client:
		l.kind, l.pipe = laneOne, x.Pipeline
	case *goredis.ClusterClient:
		l.kind, l.pipe = laneSlots, x.Pipeline
	case *goredis.Ring:
		l.kind, l.pipe = laneKeys, x.Pipeline
	}
	if maxBatch <= 1 {
		l.kind = laneDirect
	}
	return l
}

// pending is a queued request and, once its batch is answered, its reply.
type pending struct {
	req      *request
	deadline time.Time // zero: none
	state    atomic.Int32
	reply    any
	err      error
	done     chan struct{}
}

const (
	waiting int32 = iota
	sent
	abandoned
)

// do runs req on the lane: at once when fewer than maxInFlight round trips
// are under way, else in the next batch.
func (l *lane) do(ctx context.Context, req *request) (any, error) {
	if l.kind == laneDirect {
		l.stats.roundTrip(1)
		return single(ctx, l.c, req)
	}
	l.mu.Lock()
	if !l.always && l.inFlight < maxInFlight && len(l.queue) == 0 {
		l.inFlight++
		l.mu.Unlock()
		l.stats.roundTrip(1)
		reply, err := single(ctx, l.c, req)
		l.finish()
		return reply, err
	}
	p := &pending{req: req, done: make(chan struct{})}
	if d, ok := ctx.Deadline(); ok {
		p.deadline = d
	}
	l.queue = append(l.queue, p)
	start := l.inFlight < maxInFlight // no round trip would take it
	if start {
		l.inFlight++
	}
	l.mu.Unlock()
	if start {
		go l.flush()
	}
	select {
	case <-p.done:
		return p.reply, p.err
	case <-ctx.Done():
		if p.state.CompareAndSwap(waiting, abandoned) {
			l.stats.abandoned.Add(1)
		}
		return nil, ctx.Err()
	}
}

// finish ends a round trip; when requests queued meanwhile, it starts the
// goroutine that sends them.
func (l *lane) finish() {
	l.mu.Lock()
	if len(l.queue) == 0 {
		l.inFlight--
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	go l.flush() // keeps this round trip's place
}

// flush sends the queue, batch after batch, until it is empty.
func (l *lane) flush() {
	var batch []*pending
	for {
		l.mu.Lock()
		n := min(len(l.queue), l.max)
		if n == 0 {
			l.inFlight--
			l.mu.Unlock()
			return
		}
		batch = append(batch[:0], l.queue[:n]...)
		rest := copy(l.queue, l.queue[n:])
		clear(l.queue[rest:])
		l.queue = l.queue[:rest]
		l.mu.Unlock()
		l.send(batch)
	}
}

// send runs one batch and hands each caller its reply.
func (l *lane) send(batch []*pending) {
	live := batch[:0]
	var deadline time.Time
	forever := false
	for _, p := range batch {
		if !p.state.CompareAndSwap(waiting, sent) {
			continue // its caller left: never run it
		}
		live = append(live, p)
		if p.deadline.IsZero() {
			forever = true
		} else if p.deadline.After(deadline) {
			deadline = p.deadline
		}
	}
	if len(live) == 0 {
		return
	}
	ctx := context.Background()
	if !forever {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	l.stats.roundTrip(len(live))
	l.stats.batched.Add(uint64(len(live)))
	l.run(ctx, live)
	for _, p := range live {
		close(p.done)
	}
}

// run sends live as one script call, or as a pipeline of one call per
// group of keys that must share a node, and sets each one's reply.
func (l *lane) run(ctx context.Context, live []*pending) {
	if len(live) == 1 && !l.always {
		live[0].reply, live[0].err = single(ctx, l.c, live[0].req)
		return
	}
	if l.kind == laneOne && !l.perOp {
		multi(ctx, l.c, live)
		return
	}
	groups := l.group(live)
	if len(groups) == 1 && !l.perOp {
		multi(ctx, l.c, groups[0])
		return
	}
	pipe := l.pipe()
	cmds := make([]goredis.Cmder, len(groups))
	for i, g := range groups {
		if len(g) == 1 {
			cmds[i] = queue(ctx, pipe, g[0].req)
		} else {
			keys, args := multiArgs(g)
			cmds[i] = batchScript.EvalSha(ctx, pipe, keys, args...)
		}
	}
	_, _ = pipe.Exec(ctx) // each command holds its own error
	for i, g := range groups {
		err := cmds[i].Err()
		if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
			// A server that lost its scripts (a restart, a failover):
			// once per group, with the source.
			if len(g) == 1 {
				g[0].reply, g[0].err = single(ctx, l.c, g[0].req)
			} else {
				multi(ctx, l.c, g)
			}
			continue
		}
		if len(g) == 1 {
			g[0].reply, g[0].err = cmdReply(cmds[i])
		} else {
			reply, err := cmds[i].(*goredis.Cmd).Result()
			spread(g, reply, err)
		}
	}
}

// group cuts a batch by the node its keys must share, keeping the order
// of each group's requests.
func (l *lane) group(live []*pending) [][]*pending {
	at := make(map[uint64]int, len(live))
	var groups [][]*pending
	for i, p := range live {
		g := p.req.h
		if l.perOp {
			g = uint64(i)
		} else if l.kind == laneSlots {
			g = uint64(slot(p.req.h))
		}
		i, ok := at[g]
		if !ok {
			i = len(groups)
			at[g] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], p)
	}
	return groups
}

// single runs one request on its own.
func single(ctx context.Context, c Client, req *request) (any, error) {
	if req.fn == fnPeek {
		return c.HMGet(ctx, req.sk, "u", "r").Result()
	}
	return scripts[req.fn].Run(ctx, c, []string{req.sk}, req.args...).Result()
}

// queue adds one request to a pipeline.
func queue(ctx context.Context, pipe goredis.Pipeliner, req *request) goredis.Cmder {
	if req.fn == fnPeek {
		return pipe.HMGet(ctx, req.sk, "u", "r")
	}
	return scripts[req.fn].EvalSha(ctx, pipe, []string{req.sk}, req.args...)
}

func cmdReply(c goredis.Cmder) (any, error) {
	switch c := c.(type) {
	case *goredis.SliceCmd:
		return c.Result()
	case *goredis.Cmd:
		return c.Result()
	}
	return nil, fmt.Errorf("%w: command %T", ErrUnexpectedReply, c)
}

// multi runs a group as one batch.lua call (EVALSHA, then EVAL on
// NOSCRIPT) and spreads its replies.
func multi(ctx context.Context, c Client, g []*pending) {
	keys, args := multiArgs(g)
	reply, err := batchScript.Run(ctx, c, keys, args...).Result()
	spread(g, reply, err)
}

func multiArgs(g []*pending) ([]string, []any) {
	keys := make([]string, len(g))
	n := 0
	for _, p := range g {
		n += 2 + len(p.req.args)
	}
	args := make([]any, 0, n)
	for i, p := range g {
		keys[i] = p.req.sk
		args = append(args, p.req.fn, len(p.req.args))
		args = append(args, p.req.args...)
	}
	return keys, args
}

// spread hands each request of a group its part of batch.lua's reply: an
// error of the call (the store's) goes to all of them, an error that one
// operation raised (its key's) to that one alone.
func spread(g []*pending, reply any, err error) {
	var replies []any
	if err == nil {
		var ok bool
		if replies, ok = reply.([]any); !ok || len(replies) != len(g) {
			err = fmt.Errorf("%w: a batch of %d gave %T", ErrUnexpectedReply, len(g), reply)
		}
	}
	for i, p := range g {
		if err != nil {
			p.err = err
			continue
		}
		switch r := replies[i].(type) {
		case string:
			p.err = scriptError(r)
		default:
			p.reply = r
		}
	}
}

// scriptError is the error one operation of a batch raised in Redis,
// a Redis error as if its script had run alone (goredis.Error), so that
// it is classified alike (a WRONGTYPE is the key's).
type scriptError string

func (e scriptError) Error() string { return string(e) }
func (scriptError) RedisError()     {}

var _ goredis.Error = scriptError("")

// slot is the Cluster hash slot of a storage key of hash h: that of its
// tag's 16 hex digits.
func slot(h uint64) uint16 {
	const hexDigits = "0123456789abcdef"
	var tag [16]byte
	for i := range tag {
		tag[i] = hexDigits[(h>>(60-4*i))&0xf]
	}
	return keySlot(tag[:])
}

// keySlot is Redis Cluster's slot of a hash tag's content: CRC16 mod 16384.
func keySlot(s []byte) uint16 {
	var crc uint16
	for _, c := range s {
		crc = crc<<8 ^ crc16tab[byte(crc>>8)^c]
	}
	return crc & 16383
}

// crc16tab is CRC16-CCITT (XModem), polynomial 0x1021, as Redis Cluster.
var crc16tab = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()

// counters are a Backend's batching and cache counts (Stats).
type counters struct {
	roundTrips, ops, batched, abandoned atomic.Uint64
	sizes                               [len(Stats{}.BatchSizes)]atomic.Uint64
	cacheHits                           atomic.Uint64
}

func (c *counters) roundTrip(n int) {
	c.roundTrips.Add(1)
	c.ops.Add(uint64(n))
	i := 0
	for n > 1 && i < len(c.sizes)-1 {
		n >>= 1
		i++
	}
	c.sizes[i].Add(1)
}

// Stats are a Backend's counts since New, for observations: how well
// batching packs operations into round trips, and what the over-limit
// cache saves.
type Stats struct {
	// RoundTrips counts requests sent to Redis (a batch, a pipeline of
	// them, or one operation), Ops the operations they carried.
	RoundTrips, Ops uint64
	// Batched counts operations that waited for a batch; Abandoned those
	// whose callers left before their batch was sent (they never ran).
	Batched, Abandoned uint64
	// BatchSizes[i] counts round trips that carried 2^i to 2^(i+1)-1
	// operations (the last, 2^7 and more).
	BatchSizes [8]uint64
	// CacheHits counts Takes the over-limit cache denied without a round
	// trip; CacheKeys is how many keys it holds now.
	CacheHits uint64
	CacheKeys int
}

// Stats returns the backend's counts so far.
func (b *Backend) Stats() Stats {
	c := &b.counters
	s := Stats{
		RoundTrips: c.roundTrips.Load(), Ops: c.ops.Load(),
		Batched: c.batched.Load(), Abandoned: c.abandoned.Load(),
		CacheHits: c.cacheHits.Load(),
	}
	for i := range s.BatchSizes {
		s.BatchSizes[i] = c.sizes[i].Load()
	}
	if b.cache != nil {
		s.CacheKeys = b.cache.len()
	}
	return s
}
