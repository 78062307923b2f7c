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
// with no batch and fewer than maxInFlight round trips under way is sent
// at once, in the caller's goroutine, with the caller's context: a call
// alone on an idle client costs what it did before batching. Otherwise it
// queues, and the lane's next round trip carries every queued request, up
// to Options.MaxBatch, as one pipeline of EVALSHAs; a Cluster's or a
// Ring's client splits it by node. The Takes of
// one fixed window in a batch (a hot key's) go as one takes.lua call that
// answers each in turn, with nothing of that window between them.
//
// One script call running every operation of a batch was measured against
// the pipeline (BenchmarkBatchDesigns at commit 2f3c06f): the same server
// time per operation and the same calls/s within noise, so the simpler
// pipeline was kept; each operation's error is its own there without
// catching errors in Lua, and a Cluster needs no grouping by slot.
//
// A queued caller waits for its reply or for its own context, whichever
// ends first. One that leaves before its batch is sent is skipped (its
// operation never runs); one that leaves after it was sent has it run,
// its result dropped, and a unit it took stays taken. A batch is sent with
// the latest deadline of its callers (none if one of them has none), so
// it never outlives the patience of all of them.

// A request's script.
const (
	fnTake = 1 + iota
	fnRefund
	fnBucket
	fnCounter
	fnLog
	fnPeek // a fixed window's HMGET u r; no script
)

var (
	//go:embed scripts/takes.lua
	takesSource string
	// takesScript runs the Takes of one fixed window in one batch.
	takesScript = goredis.NewScript(numbersSource + takesSource)
)

// scripts are the requests' scripts, by number.
var scripts = [...]*goredis.Script{fnTake: takeScript, fnRefund: refundScript,
	fnBucket: bucketScript, fnCounter: counterScript, fnLog: logScript}

// maxInFlight is how many round trips a lane has under way before the
// requests that arrive queue: two, so that at low concurrency two callers
// are answered in parallel as on a plain client. Once a batch is under
// way, or the last one carried deepBatch requests or more (high
// concurrency), a second round trip is not started alone: callers
// answered by one batch come back while the next is under way and queue
// for the one after, so batches stay deep instead of a returning caller
// going alone on the free round trip (BenchmarkBatching compares one slot,
// this rule and four).
const maxInFlight = 2

// deepBatch is the size of a batch that says the lane is under high
// concurrency.
const deepBatch = 4

// maxBatchLimit bounds Options.MaxBatch.
const maxBatchLimit = 4096

// request is one operation for Redis.
type request struct {
	fn   int
	sk   string
	args []any
}

// lane batches the requests of one client.
type lane struct {
	c     Client
	pipe  func() goredis.Pipeliner // nil: never batched (an AutoPipeliner, a client of another type)
	max   int
	stats *counters

	always bool // tests: every request goes through a batch (redisbatch.Always)
	slots  int  // maxInFlight; benchmarks compare others

	mu        sync.Mutex
	inFlight  int
	flushers  int // goroutines sending batches
	lastBatch int // requests the last batch carried
	queue     []*pending
}

func newLane(c Client, maxBatch int, stats *counters) *lane {
	l := &lane{c: c, max: maxBatch, stats: stats, always: redisbatch.Always.Load(), slots: maxInFlight}
	switch x := c.(type) {
	case *goredis.Client:
		l.pipe = x.Pipeline
	case *goredis.ClusterClient:
		l.pipe = x.Pipeline
	case *goredis.Ring:
		l.pipe = x.Pipeline
	}
	if maxBatch <= 1 {
		l.pipe = nil
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
// and no batch are under way, else in the next batch.
func (l *lane) do(ctx context.Context, req *request) (any, error) {
	if l.pipe == nil {
		l.stats.roundTrip(1)
		return single(ctx, l.c, req)
	}
	l.mu.Lock()
	if !l.always && l.flushers == 0 && len(l.queue) == 0 &&
		(l.inFlight == 0 || l.inFlight < l.slots && l.lastBatch < deepBatch) {
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
	start := l.inFlight < l.slots // no round trip would take it
	if start {
		l.inFlight++
		l.flushers++
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
	l.flushers++
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
			l.flushers--
			l.mu.Unlock()
			return
		}
		l.lastBatch = n
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

// run sends live as one pipeline and sets each one's reply: an error of
// the round trip (the store's) is every command's, an error of one script
// (its key's) that one's alone (and its window's Takes').
func (l *lane) run(ctx context.Context, live []*pending) {
	if len(live) == 1 && !l.always {
		live[0].reply, live[0].err = single(ctx, l.c, live[0].req)
		return
	}
	calls := coalesce(live)
	cmds := make([]goredis.Cmder, len(calls))
	pipe := l.pipe()
	for i, g := range calls {
		cmds[i] = queue(ctx, pipe, g, false)
	}
	_, _ = pipe.Exec(ctx) // each command holds its own error
	var again []int
	for i, c := range cmds {
		if err := c.Err(); err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
			again = append(again, i)
			continue
		}
		deliver(calls[i], c)
	}
	if len(again) == 0 {
		return
	}
	// A server that lost its scripts (a restart, a failover): once more
	// with their sources, which EVAL caches.
	pipe = l.pipe()
	for _, i := range again {
		cmds[i] = queue(ctx, pipe, calls[i], true)
	}
	_, _ = pipe.Exec(ctx)
	for _, i := range again {
		deliver(calls[i], cmds[i])
	}
}

// coalesce cuts a batch into its commands: the Takes of one fixed window
// together (takes.lua), in their order, every other request alone.
func coalesce(live []*pending) [][]*pending {
	calls := make([][]*pending, 0, len(live))
	var at map[string]int
	for _, p := range live {
		switch {
		case p.req.fn == fnTake:
			if at == nil {
				at = make(map[string]int)
			}
			if i, ok := at[p.req.sk]; ok {
				calls[i] = append(calls[i], p)
				continue
			}
			at[p.req.sk] = len(calls)
		case at != nil:
			// A Peek or a Refund of the window comes between the Takes
			// before it and those after: they are not put together.
			delete(at, p.req.sk)
		}
		calls = append(calls, []*pending{p})
	}
	return calls
}

// queue adds one command to a pipeline: EVALSHA (or EVAL with the source),
// HMGET for a fixed window's Peek, takes.lua for Takes of one window.
func queue(ctx context.Context, pipe goredis.Pipeliner, g []*pending, source bool) goredis.Cmder {
	req := g[0].req
	if req.fn == fnPeek {
		return pipe.HMGet(ctx, req.sk, "u", "r")
	}
	script, keys, args := scripts[req.fn], []string{req.sk}, req.args
	if len(g) > 1 {
		script, args = takesScript, make([]any, 0, 5*len(g))
		for _, p := range g {
			args = append(args, p.req.args...)
		}
	}
	if source {
		return script.Eval(ctx, pipe, keys, args...)
	}
	return script.EvalSha(ctx, pipe, keys, args...)
}

// deliver hands a command's reply to its callers: takes.lua's is three
// values per Take.
func deliver(g []*pending, c goredis.Cmder) {
	if len(g) == 1 {
		g[0].reply, g[0].err = cmdReply(c)
		return
	}
	reply, err := c.(*goredis.Cmd).Result()
	vals, ok := reply.([]any)
	if err == nil && (!ok || len(vals) != 3*len(g)) {
		err = fmt.Errorf("%w: %d Takes of a window gave %v", ErrUnexpectedReply, len(g), reply)
	}
	for i, p := range g {
		if err != nil {
			p.err = err
			continue
		}
		p.reply = vals[3*i : 3*i+3 : 3*i+3]
	}
}

// single runs one request on its own.
func single(ctx context.Context, c Client, req *request) (any, error) {
	if req.fn == fnPeek {
		return c.HMGet(ctx, req.sk, "u", "r").Result()
	}
	return scripts[req.fn].Run(ctx, c, []string{req.sk}, req.args...).Result()
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
