package redis

import (
	"context"
	_ "embed"
	"fmt"
	"github.com/throttlekit/throttlekit/backend"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Batching (docs/backends-redis.md, "Batching"). Every operation is a
// request: one script (or a fixed window's HMGET) on one key, or a
// composite's script on its members' keys, which share a slot. A lane is one
// client of one shard (its primary, or one replica). A request on a lane
// with no batch and fewer than maxInFlight round trips under way (one
// while batches are deep) is sent at once, in the caller's goroutine,
// with the caller's context: a call alone on an idle client costs what it
// did before batching. Otherwise it queues, and the lane's next batch
// carries every queued request, up to Options.MaxBatch, as one pipeline of
// EVALSHAs; a Cluster's or a Ring's client splits it by node. A lane has
// up to two batches under way, so that the client's work on one overlaps
// Redis's on the other; the second starts once half of the lane's callers
// have queued (lane.half), never on a timer. The Takes of one fixed window in a batch (a
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
	fnAll  // a composite's members: all.lua on several keys (composite.go)
)

var (
	//go:embed scripts/takes.lua
	takesSource string
	// takesScript runs a batch's Takes of fixed windows: one window's, or,
	// on a client of one server, every window's nothing else touches.
	takesScript = goredis.NewScript(numbersSource + takesSource)
)

// scripts are the requests' scripts, by number; a composite's is its
// request's own (allScripts).
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

// maxBatches is how many batches a lane has under way at once: two, so
// that the client's work on one (writing it, reading and handing out its
// replies, its callers calling again) overlaps Redis running the other.
// With one, the two sides took turns and each idled half the time
// (docs/performance.md, "Client-side CPU"); a second batch starts only
// once half of the lane's callers have queued (see lane.half), so the two
// stay about equal.
const maxBatches = 2

// deepBatch is the size of a batch that says the lane is under high
// concurrency.
const deepBatch = 4

// maxBatchLimit bounds Options.MaxBatch.
const maxBatchLimit = 4096

// request is one operation for Redis.
type request struct {
	fn     int
	sk     string
	keys   []string        // fnAll: every member's key, sk the first; nil: sk alone
	args   []any           // the script's arguments; a fixed window's Take: take
	take   takeArgs        // fnTake: take.lua's, kept as numbers until sent
	script *goredis.Script // fnAll: all.lua for the members' algorithms
}

// scriptOf is req's script.
func (req *request) scriptOf() *goredis.Script {
	if req.script != nil {
		return req.script
	}
	return scripts[req.fn]
}

// scriptKeys are req's script's keys.
func (req *request) scriptKeys() []string {
	if req.keys != nil {
		return req.keys
	}
	return []string{req.sk}
}

// takeArgs are take.lua's arguments (scripts/take.lua): held as numbers,
// a Take allocates no interface per argument, and a batch's takes.lua call
// sends what its Takes share once.
type takeArgs struct{ now, reset, limit, cost, expiry int64 }

// scriptArgs are req's script arguments.
func (req *request) scriptArgs() []any {
	if req.fn == fnTake {
		t := &req.take
		return []any{t.now, t.reset, t.limit, t.cost, t.expiry}
	}
	return req.args
}

// lane batches the requests of one client.
type lane struct {
	c       Client
	scripts goredis.Scripter         // c's scripts, never re-sent (scriptsOf)
	store   string                   // the client's name in errors: "redis shard 1 (10.0.0.1:6379)"
	dials   *dialWatch               // nil: the client's dials are not watched
	pipe    func() goredis.Pipeliner // nil: never batched (an AutoPipeliner, a client of another type)
	max     int
	stats   *counters
	wait    *waiter // nil: writes are not followed by WAIT (wait.go)

	one     bool // one server: a batch's windows go as one takes.lua call
	always  bool // tests: every request goes through a batch (Options.alwaysBatch)
	slots   int  // maxInFlight; benchmarks compare others
	batches int  // maxBatches; benchmarks compare others

	mu        sync.Mutex
	inFlight  int // round trips under way: requests sent alone and batches
	flushers  int // goroutines sending batches (batches under way)
	flying    int // requests in the batches under way
	active    int // callers the lane had when its last batch was answered
	lastBatch int // requests the last batch carried
	queue     []*pending
}

func newLane(c Client, maxBatch int, stats *counters) *lane {
	l := &lane{c: c, scripts: scriptsOf(c), max: maxBatch, stats: stats,
		slots: maxInFlight, batches: maxBatches}
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
// Its caller puts it back in pendings once it has read the reply: one
// whose caller left is never reused, its batch may still answer it.
type pending struct {
	req      *request
	deadline time.Time // zero: none
	state    atomic.Int32
	reply    any
	err      error
	done     chan struct{} // one token: the reply is set
}

var pendings = sync.Pool{New: func() any { return &pending{done: make(chan struct{}, 1)} }}

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
		return l.single(ctx, req)
	}
	l.mu.Lock()
	if !l.always && l.flushers == 0 && len(l.queue) == 0 &&
		(l.inFlight == 0 || l.inFlight < l.slots && l.lastBatch < deepBatch) {
		l.inFlight++
		l.mu.Unlock()
		l.stats.roundTrip(1)
		reply, err := l.single(ctx, req)
		l.finish()
		return reply, err
	}
	p := pendings.Get().(*pending)
	p.req = req
	p.state.Store(waiting)
	if d, ok := ctx.Deadline(); ok {
		p.deadline = d
	}
	l.queue = append(l.queue, p)
	start := l.inFlight < l.slots && l.flushers < l.batches &&
		(l.flushers == 0 || len(l.queue) >= l.half())
	if start {
		l.inFlight++
		l.flushers++
	}
	l.mu.Unlock()
	if start {
		go l.flush()
	}
	return l.await(ctx, p)
}

// await returns p's reply once it is set, or ctx's error if ctx ends first.
func (l *lane) await(ctx context.Context, p *pending) (any, error) {
	select {
	case <-p.done:
		return p.take(ctx)
	case <-ctx.Done():
		// A reply that came in while this caller waited for a CPU is an
		// answer, not a timeout: select picks at random among ready cases.
		select {
		case <-p.done:
			return p.take(ctx)
		default:
		}
		if p.state.CompareAndSwap(waiting, abandoned) {
			l.stats.abandoned.Add(1)
		}
		return nil, ctx.Err()
	}
}

// take returns p's reply to its caller and p to the pool.
func (p *pending) take(ctx context.Context) (any, error) {
	reply, err := p.reply, p.err
	p.req, p.deadline, p.reply, p.err = nil, time.Time{}, nil, nil
	pendings.Put(p)
	if err != nil && ctx.Err() == nil {
		awaitDeadline(ctx)
	}
	return reply, err
}

// awaitDeadline waits, when ctx's deadline has passed, for ctx to say so.
// A batch runs with the latest deadline of its callers, so its round trip
// can time out at a caller's own deadline and answer it a moment before
// that caller's context ends: a Throttler then saw a failure before its
// own Timeout expired and did not count it toward the store's breaker
// (measured: 4 of 8 Takes on a paused primary, those batched). The
// context's timer is due: the wait is a scheduling delay.
func awaitDeadline(ctx context.Context) {
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		<-ctx.Done()
	}
}

// half is how many queued requests start a batch while another is under
// way: half of the lane's callers, so that the two batches under way
// carry about as many each. No timer waits for them: when the batch under
// way is answered, its goroutine sends whatever queued (next).
func (l *lane) half() int {
	return max(1, min(l.max, (l.active+1)/2))
}

// next reports, under mu, whether a goroutine that ended a round trip
// should send the queue as a batch: something waits and no batch is under
// way (none would take it otherwise), or half of the callers wait and the
// lane has room for one more batch beside the one under way.
func (l *lane) next(flushers int) bool {
	return len(l.queue) > 0 && flushers < l.batches && (flushers == 0 || len(l.queue) >= l.half())
}

// finish ends a round trip sent alone; when requests queued meanwhile, it
// starts a batch in its place (next).
func (l *lane) finish() {
	l.mu.Lock()
	if !l.next(l.flushers) {
		l.inFlight--
		l.mu.Unlock()
		return
	}
	l.flushers++
	l.mu.Unlock()
	go l.flush() // keeps this round trip's place
}

// flush sends the queue as a batch, then the next while next says so.
func (l *lane) flush() {
	var batch []*pending
	l.mu.Lock()
	for {
		n := min(len(l.queue), l.max)
		if n == 0 { // another batch took them
			l.inFlight--
			l.flushers--
			l.mu.Unlock()
			return
		}
		l.lastBatch = n
		l.flying += n
		batch = append(batch[:0], l.queue[:n]...)
		rest := copy(l.queue, l.queue[n:])
		clear(l.queue[rest:])
		l.queue = l.queue[:rest]
		l.mu.Unlock()
		l.send(batch)
		l.mu.Lock()
		l.flying -= n
		// Every caller the lane has now: those this batch answered, those
		// in the other batch, those waiting.
		l.active = n + l.flying + len(l.queue)
		if !l.next(l.flushers - 1) {
			l.inFlight--
			l.flushers--
			l.mu.Unlock()
			return
		}
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
		p.done <- struct{}{} // p is its caller's from here
	}
}

// run sends live as one pipeline and sets each one's reply: an error of
// the round trip (the store's) is every command's, an error of one script
// (its key's) that one's alone (and its window's Takes').
func (l *lane) run(ctx context.Context, live []*pending) {
	if len(live) == 1 && !l.always {
		live[0].reply, live[0].err = l.single(ctx, live[0].req)
		return
	}
	sc := scratches.Get().(*scratch)
	defer scratches.Put(sc)
	calls := sc.coalesce(live, l.one)
	cmds := sc.cmds[:0]
	pipe := l.pipe()
	writes := false
	for i := range calls {
		cmds = append(cmds, sc.queue(ctx, pipe, &calls[i], false))
		writes = writes || l.wait != nil && calls[i].writes()
	}
	ack := l.wait.queue(ctx, pipe, writes) // one WAIT after every write
	_, _ = pipe.Exec(ctx)                  // each command holds its own error
	werr := l.wait.check(ack)
	again := sc.again[:0]
	for i, c := range cmds {
		if err := c.Err(); err != nil && (goredis.HasErrorPrefix(err, "NOSCRIPT") || refused(err)) {
			again = append(again, i)
			continue
		}
		deliver(&calls[i], c)
		calls[i].fail(werr)
	}
	if len(again) > 0 {
		// A server that lost its scripts (a restart, a failover), or
		// that refused them before they ran (see refused): once more,
		// with their sources, which EVAL caches.
		pipe = l.pipe()
		writes = false
		for _, i := range again {
			cmds[i] = sc.queue(ctx, pipe, &calls[i], true)
			writes = writes || l.wait != nil && calls[i].writes()
		}
		ack = l.wait.queue(ctx, pipe, writes)
		_, _ = pipe.Exec(ctx)
		werr = l.wait.check(ack)
		for _, i := range again {
			deliver(&calls[i], cmds[i])
			calls[i].fail(werr)
		}
	}
	clear(cmds)
	sc.cmds, sc.again, sc.pipe.p = cmds[:0], again[:0], nil
}

// command is the requests one command answers: one request, or the Takes
// of one or more fixed windows (takes.lua), window by window.
type command struct {
	ps   []*pending // window by window, each window's in their order
	wins []int      // where each window's requests end in ps
}

// scratch is what a batch is cut into, kept from batch to batch
// (scratches) so that a batch allocates next to nothing of its own.
type scratch struct {
	at    map[string]int // the group a Take of a window joins
	seen  map[string]int // groups per key
	next  []int          // by request: the next of its group, or -1
	heads []int          // by group: its first request, then its last
	tails []int
	calls []command
	ps    []*pending // the commands' requests, command after command
	wins  []int
	keys  []string
	args  []any
	sets  []int // by request of a takes.lua command: its parameter set
	first []int // by parameter set: the request whose arguments it takes
	cmds  []goredis.Cmder
	again []int
	pipe  once // the batch's pipeline as a Scripter (once): no allocation per script
}

// once returns pipe as a Scripter whose scripts go-redis never re-sends.
func (sc *scratch) once(pipe goredis.Pipeliner) *once {
	sc.pipe.p = pipe
	return &sc.pipe
}

var scratches = sync.Pool{New: func() any {
	return &scratch{at: make(map[string]int), seen: make(map[string]int)}
}}

// coalesce cuts a batch into its commands: the Takes of one fixed window
// together, in their order, every other request alone. With one, for a
// client of one server, the windows whose key nothing else in the batch
// touches go as one command, answered by one takes.lua call: their
// Takes commute with every other command of the batch.
func (sc *scratch) coalesce(live []*pending, one bool) []command {
	clear(sc.at)
	sc.next = slices.Grow(sc.next[:0], len(live))[:len(live)]
	heads, tails := sc.heads[:0], sc.tails[:0]
	mixed := false // a request other than a Take: some windows may not join
	for i, p := range live {
		sc.next[i] = -1
		switch {
		case p.req.fn == fnTake:
			if g, ok := sc.at[p.req.sk]; ok {
				sc.next[tails[g]], tails[g] = i, i
				continue
			}
			sc.at[p.req.sk] = len(heads)
		default:
			// A Peek or a Refund of the window, or a composite holding
			// it, comes between the Takes before it and those after: they
			// are not put together.
			mixed = true
			delete(sc.at, p.req.sk)
			for _, k := range p.req.keys {
				delete(sc.at, k)
			}
		}
		heads, tails = append(heads, i), append(tails, i)
	}
	sc.heads, sc.tails = heads, tails
	if mixed && one {
		clear(sc.seen)
		for _, h := range heads {
			sc.seen[live[h].req.sk]++
			if ks := live[h].req.keys; len(ks) > 1 { // a composite's: sk is ks[0]
				for _, k := range ks[1:] {
					sc.seen[k]++
				}
			}
		}
	}
	joins := func(g int) bool {
		p := live[heads[g]]
		return one && p.req.fn == fnTake && (!mixed || sc.seen[p.req.sk] == 1)
	}
	// The arenas hold every command's slices: sized once, never moved.
	ps := slices.Grow(sc.ps[:0], len(live))
	wins := slices.Grow(sc.wins[:0], len(heads))
	group := func(g int) {
		for i := heads[g]; i >= 0; i = sc.next[i] {
			ps = append(ps, live[i])
		}
	}
	calls := sc.calls[:0]
	var joint command
	for g := range heads {
		if joins(g) {
			group(g)
			wins = append(wins, len(ps))
		}
	}
	joint.ps, joint.wins = ps, wins
	joined := false
	for g := range heads {
		if joins(g) {
			if !joined {
				joined = true
				calls = append(calls, joint)
			}
			continue
		}
		start, ws := len(ps), len(wins)
		group(g)
		wins = append(wins, len(ps)-start)
		calls = append(calls, command{ps: ps[start:], wins: wins[ws:]})
	}
	sc.ps, sc.wins, sc.calls = ps[:0], wins[:0], calls
	return calls
}

// queue adds one command to a pipeline: EVALSHA (or EVAL with the source),
// HMGET for a fixed window's Peek, takes.lua for Takes of fixed windows.
// go-redis copies keys and arguments into its command: sc's are reused.
func (sc *scratch) queue(ctx context.Context, pipe goredis.Pipeliner, c *command, source bool) goredis.Cmder {
	req := c.ps[0].req
	if len(c.ps) == 1 {
		if req.fn == fnPeek {
			return pipe.HMGet(ctx, req.sk, "u", "r")
		}
		if source {
			return req.scriptOf().Eval(ctx, sc.once(pipe), req.scriptKeys(), req.scriptArgs()...)
		}
		return req.scriptOf().EvalSha(ctx, sc.once(pipe), req.scriptKeys(), req.scriptArgs()...)
	}
	// takes.lua: the Takes' parameter sets (now, reset-at, limit, expiry;
	// take.lua's arguments but the cost), each once, then each window's
	// Takes as (set, cost). Arguments are the requests' own values.
	sets, first := sc.sets[:0], sc.first[:0]
	for _, p := range c.ps {
		t := &p.req.take
		s := slices.IndexFunc(first, func(f int) bool {
			u := &c.ps[f].req.take
			return t.now == u.now && t.reset == u.reset && t.limit == u.limit && t.expiry == u.expiry
		})
		if s < 0 {
			s = len(first)
			first = append(first, len(sets))
		}
		sets = append(sets, s+1)
	}
	keys := sc.keys[:0]
	args := append(sc.args[:0], len(first))
	for _, f := range first {
		t := &c.ps[f].req.take
		args = append(args, t.now, t.reset, t.limit, t.expiry)
	}
	start := 0
	for _, end := range c.wins {
		keys = append(keys, c.ps[start].req.sk)
		args = append(args, end-start)
		for i := start; i < end; i++ {
			args = append(args, sets[i], c.ps[i].req.take.cost)
		}
		start = end
	}
	var cmd *goredis.Cmd
	if source {
		cmd = takesScript.Eval(ctx, sc.once(pipe), keys, args...)
	} else {
		cmd = takesScript.EvalSha(ctx, sc.once(pipe), keys, args...)
	}
	clear(keys)
	clear(args)
	sc.sets, sc.first, sc.keys, sc.args = sets[:0], first[:0], keys[:0], args[:0]
	return cmd
}

// deliver hands a command's reply to its callers: takes.lua's is one flat
// array, for each window three values per Take or the window's own error.
func deliver(c *command, cmd goredis.Cmder) {
	if len(c.ps) == 1 {
		c.ps[0].reply, c.ps[0].err = cmdReply(cmd)
		return
	}
	reply, err := cmd.(*goredis.Cmd).Result()
	vals, ok := reply.([]any)
	if err == nil && !ok {
		err = fmt.Errorf("%w: %d Takes gave %T", ErrUnexpectedReply, len(c.ps), reply)
	}
	if err == nil && !flatOK(c, vals) {
		err = fmt.Errorf("%w: %d Takes of %d windows gave %d values", ErrUnexpectedReply, len(c.ps), len(c.wins), len(vals))
	}
	if err != nil {
		for _, p := range c.ps {
			p.err = err
		}
		return
	}
	at, start := 0, 0
	for _, end := range c.wins {
		if werr, ok := vals[at].(goredis.Error); ok {
			for _, p := range c.ps[start:end] {
				p.err = werr
			}
			at++
		} else {
			for _, p := range c.ps[start:end] {
				p.reply = vals[at : at+3 : at+3]
				at += 3
			}
		}
		start = end
	}
}

// flatOK reports whether takes.lua's reply has, for each window, one error
// or three values per Take, and nothing more.
func flatOK(c *command, vals []any) bool {
	at, start := 0, 0
	for _, end := range c.wins {
		if at < len(vals) {
			if _, ok := vals[at].(goredis.Error); ok {
				at++
				start = end
				continue
			}
		}
		at += 3 * (end - start)
		if at > len(vals) {
			return false
		}
		start = end
	}
	return at == len(vals)
}

// single runs one request on its own, on l's client.
func single(ctx context.Context, l *lane, req *request) (any, error) {
	if req.fn == fnPeek {
		return l.c.HMGet(ctx, req.sk, "u", "r").Result()
	}
	return runScript(ctx, l.scripts, req.scriptOf(), req.scriptKeys(), req.scriptArgs()...).Result()
}

// scriptsOf is how c runs scripts: through once, never re-sent, when c
// can send any command (every go-redis client); c itself otherwise.
func scriptsOf(c Client) goredis.Scripter {
	if p, ok := c.(processor); ok {
		return &once{p: p}
	}
	return c
}

// runScript runs s through sc (scriptsOf) outside batches: EVALSHA, then
// EVAL on NOSCRIPT, and once more if the server refused it before it ran.
func runScript(ctx context.Context, sc goredis.Scripter, s *goredis.Script, keys []string, args ...any) *goredis.Cmd {
	cmd := s.Run(ctx, sc, keys, args...)
	if refused(cmd.Err()) && ctx.Err() == nil {
		cmd = s.Run(ctx, sc, keys, args...)
	}
	return cmd
}

// refusedPrefixes begin the replies of a server that refused a script
// before it ran or wrote anything: loading, a replica cut from its primary,
// a Cluster slot in the middle of a move or a Cluster without a quorum
// (all refused at dispatch), and a replica refusing a write (a script's
// first write fails, and the script stops there; after a failover, the
// client's next connection reaches the new primary).
var refusedPrefixes = []string{"READONLY", "LOADING", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN"}

// refused reports whether err is such a refusal, which a script may be
// sent again after, once: it never ran.
func refused(err error) bool {
	if err == nil {
		return false
	}
	for _, p := range refusedPrefixes {
		if goredis.HasErrorPrefix(err, p) {
			return true
		}
	}
	return false
}

// Scripts run at most once. go-redis re-sends a command that failed in a
// way it deems transient (a connection reset or EOF, a read timeout,
// LOADING, TRYAGAIN, CLUSTERDOWN), and a Cluster's pipeline re-sends a
// node's whole sub-batch when its first command failed so, or when the
// connection failed part way (osscluster.go, pipelineReadCmds, v9.23):
// the scripts of that sub-batch that had run would run again, a Take
// counted twice. A command whose NoRetry is true is never re-sent, nor is
// a sub-batch holding one; redirections (MOVED, ASK), which Redis gives
// before running anything, are still followed command by command, and a
// pooled connection found closed is replaced before anything is written
// (go-redis checks idle connections). A script that fails so fails its
// call: a store failure, never a unit counted twice. The backend sends a
// script again itself, once, only when the server's reply says it never
// ran (refused).

// processor is a client or a pipeline that sends any command.
type processor interface {
	Process(ctx context.Context, cmd goredis.Cmder) error
}

// once is a Scripter whose EVAL and EVALSHA go-redis never re-sends.
type once struct {
	goredis.Scripter // nil: Script uses only Eval and EvalSha
	p                processor
}

var (
	_ processor = (*goredis.Client)(nil)
	_ processor = (*goredis.ClusterClient)(nil)
	_ processor = (*goredis.Ring)(nil)
	_ processor = goredis.Pipeliner(nil)
)

func (o *once) Eval(ctx context.Context, script string, keys []string, args ...any) *goredis.Cmd {
	return o.run(ctx, "eval", script, keys, args)
}

func (o *once) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *goredis.Cmd {
	return o.run(ctx, "evalsha", sha, keys, args)
}

// run sends name (eval or evalsha) as go-redis's Eval does, but as a
// command that is never retried.
func (o *once) run(ctx context.Context, name, payload string, keys []string, args []any) *goredis.Cmd {
	a := make([]any, 3, 3+len(keys)+len(args))
	a[0], a[1], a[2] = name, payload, len(keys)
	for _, k := range keys {
		a = append(a, k)
	}
	cmd := goredis.NewCmd(ctx, append(a, args...)...)
	if len(keys) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	_ = o.p.Process(ctx, onceCmd{cmd})
	return cmd
}

// onceCmd is a command go-redis never re-sends (see once).
type onceCmd struct{ *goredis.Cmd }

func (onceCmd) NoRetry() bool { return true }

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
	primarySwitches                     atomic.Uint64 // see primaryWatch
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
// cache saves (the metrics adapters' Watch exports them).
type Stats = backend.BatchStats

// Stats returns the backend's counts so far.
func (b *Backend) Stats() Stats {
	c := &b.counters
	s := Stats{
		RoundTrips: c.roundTrips.Load(), Ops: c.ops.Load(),
		Batched: c.batched.Load(), Abandoned: c.abandoned.Load(),
		CacheHits: c.cacheHits.Load(), PrimarySwitches: c.primarySwitches.Load(),
	}
	for i := range s.BatchSizes {
		s.BatchSizes[i] = c.sizes[i].Load()
	}
	if b.cache != nil {
		s.CacheKeys = b.cache.len()
	}
	return s
}
