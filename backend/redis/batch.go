package redis

import (
	"context"
	_ "embed"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/internal/redisbatch"
)

// Batching (docs/backends-redis.md, "Batching"). Every operation is a
// request: one script (or a fixed window's HMGET) on one key. A lane is one
// client of one shard (its primary, or one replica). A request on a lane
// with no batch and fewer than maxInFlight round trips under way (one
// while batches are deep) is sent at once, in the caller's goroutine,
// with the caller's context: a call alone on an idle client costs what it
// did before batching. Otherwise it queues, and the lane's next round trip
// (one batch at a time) carries every queued request, up to
// Options.MaxBatch, as one pipeline of EVALSHAs; a Cluster's or a Ring's
// client splits it by node. The Takes of one fixed window in a batch (a
// hot key's) go as one takes.lua call that answers each in turn, with
// nothing of that window between them; on a client of one server, so do
// the Takes of every window nothing else in the batch touches.
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
// requests that arrive queue: four, so that at low concurrency four
// callers are answered in parallel, as on a plain client (whose pool
// gives each its own connection). A call goes alone onto a free one only
// while no batch is under way and the last batch was shallow (fewer than
// deepBatch requests): at high concurrency the callers one batch answers
// come back while the next is under way and queue for the one after, so
// batches stay deep instead of a returning caller going alone.
const maxInFlight = 4

// maxBatches is how many batches a lane sends at once: two, so that
// Redis reads one while the client reads the other's replies; more cut
// the queue into shallower batches (BenchmarkBatching compares).
const maxBatches = 1

// maxYields is how many scheduler turns a flusher gives the callers its
// last batch answered to queue again before it sends the next batch.
const maxYields = 4

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

	one     bool // one server: a batch's windows go as one takes.lua call
	always  bool // tests: every request goes through a batch (redisbatch.Always)
	slots   int  // maxInFlight; benchmarks compare others
	batches int  // maxBatches; benchmarks compare others
	yields  int  // scheduler turns a flusher gives answered callers to queue again

	mu        sync.Mutex
	inFlight  int
	flushers  int // goroutines sending batches
	lastBatch int // requests the last batch carried
	queue     []*pending
}

func newLane(c Client, maxBatch int, stats *counters) *lane {
	l := &lane{c: c, max: maxBatch, stats: stats, always: redisbatch.Always.Load(),
		slots: maxInFlight, batches: maxBatches, yields: maxYields}
	switch x := c.(type) {
	case *goredis.Client:
		l.pipe, l.one = x.Pipeline, true
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

// do runs req on the lane: at once when no batch and fewer than
// maxInFlight round trips are under way (one while batches are deep),
// else in the next batch.
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
	start := l.inFlight < l.slots && l.flushers < l.batches // no round trip would take it
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

// finish ends a round trip; when requests queued meanwhile and fewer than
// maxBatches goroutines send batches, it starts one more.
func (l *lane) finish() {
	l.mu.Lock()
	if len(l.queue) == 0 || l.flushers >= l.batches {
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
	sent := 0 // requests the previous batch of this loop answered
	for {
		l.mu.Lock()
		// The callers the previous batch answered are runnable, most about
		// to queue again: let them, a few scheduler turns at most (never a
		// timer), so that the next batch carries them.
		for y := 0; y < l.yields && len(l.queue) < min(sent, l.max); y++ {
			l.mu.Unlock()
			runtime.Gosched()
			l.mu.Lock()
		}
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
		sent = n
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
	calls := coalesce(live, l.one)
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

// command is the requests one command answers: one request, or the Takes
// of one or more fixed windows (takes.lua), window by window.
type command [][]*pending

// coalesce cuts a batch into its commands: the Takes of one fixed window
// together, in their order, every other request alone. With one, for a
// client of one server, the windows whose key nothing else in the batch
// touches go as one command, answered by one takes.lua call: their
// Takes commute with every other command of the batch.
func coalesce(live []*pending, one bool) []command {
	groups := make([][]*pending, 0, len(live))
	var at map[string]int
	for _, p := range live {
		switch {
		case p.req.fn == fnTake:
			if at == nil {
				at = make(map[string]int)
			}
			if i, ok := at[p.req.sk]; ok {
				groups[i] = append(groups[i], p)
				continue
			}
			at[p.req.sk] = len(groups)
		case at != nil:
			// A Peek or a Refund of the window comes between the Takes
			// before it and those after: they are not put together.
			delete(at, p.req.sk)
		}
		groups = append(groups, []*pending{p})
	}
	calls := make([]command, 0, len(groups))
	if !one || at == nil {
		for _, g := range groups {
			calls = append(calls, command{g})
		}
		return calls
	}
	seen := make(map[string]int, len(groups))
	for _, g := range groups {
		seen[g[0].req.sk]++
	}
	takes := -1 // the command of the windows put together
	for _, g := range groups {
		if g[0].req.fn != fnTake || seen[g[0].req.sk] > 1 {
			calls = append(calls, command{g})
			continue
		}
		if takes < 0 {
			takes = len(calls)
			calls = append(calls, nil)
		}
		calls[takes] = append(calls[takes], g)
	}
	return calls
}

// queue adds one command to a pipeline: EVALSHA (or EVAL with the source),
// HMGET for a fixed window's Peek, takes.lua for Takes of fixed windows.
func queue(ctx context.Context, pipe goredis.Pipeliner, c command, source bool) goredis.Cmder {
	req := c[0][0].req
	if req.fn == fnPeek {
		return pipe.HMGet(ctx, req.sk, "u", "r")
	}
	script, keys, args := scripts[req.fn], []string{req.sk}, req.args
	if len(c) > 1 || len(c[0]) > 1 {
		script, keys = takesScript, make([]string, len(c))
		args = make([]any, 0, len(c)+5*count(c))
		for j, g := range c {
			keys[j] = g[0].req.sk
			args = append(args, len(g))
			for _, p := range g {
				args = append(args, p.req.args...)
			}
		}
	}
	if source {
		return script.Eval(ctx, pipe, keys, args...)
	}
	return script.EvalSha(ctx, pipe, keys, args...)
}

// count counts a command's requests.
func count(c command) (n int) {
	for _, g := range c {
		n += len(g)
	}
	return n
}

// deliver hands a command's reply to its callers: takes.lua's is, for
// each window, three values per Take or the window's own error.
func deliver(c command, cmd goredis.Cmder) {
	if len(c) == 1 && len(c[0]) == 1 {
		c[0][0].reply, c[0][0].err = cmdReply(cmd)
		return
	}
	reply, err := cmd.(*goredis.Cmd).Result()
	wins, ok := reply.([]any)
	if err == nil && (!ok || len(wins) != len(c)) {
		err = fmt.Errorf("%w: %d windows' Takes gave %v", ErrUnexpectedReply, len(c), reply)
	}
	for j, g := range c {
		werr, vals := err, []any(nil)
		if werr == nil {
			switch w := wins[j].(type) {
			case []any:
				vals = w
				if len(vals) != 3*len(g) {
					werr = fmt.Errorf("%w: %d Takes of a window gave %v", ErrUnexpectedReply, len(g), w)
				}
			case goredis.Error:
				werr = w
			default:
				werr = fmt.Errorf("%w: %d Takes of a window gave %v", ErrUnexpectedReply, len(g), w)
			}
		}
		for i, p := range g {
			if werr != nil {
				p.err = werr
				continue
			}
			p.reply = vals[3*i : 3*i+3 : 3*i+3]
		}
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
