package redis

import (
	"context"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/throttler"
)

// Waiting for replicas (Options.WaitReplicas; "Failover" in
// docs/backends-redis.md). Redis replicates asynchronously: a primary
// answers a script before any replica has its writes, so a failover can
// promote a replica that never saw units the old primary admitted. With
// WaitReplicas set, every request that writes is followed, in the same
// pipeline and so on the same connection, by WAIT numreplicas timeout,
// which answers how many replicas have acknowledged every write of that
// connection so far. Fewer than asked fails each write of the pipeline
// with ErrTooFewReplicas, a store failure: the write is on the primary but
// may not survive a failover, so its answer is not given as counted.
// WAIT is refused inside scripts, hence the pipeline; a Cluster's or a
// Ring's pipeline would send it to a node of the client's choosing, hence
// the *goredis.Client required (newWaiter).

// ErrTooFewReplicas is returned, wrapped and marked as a store failure
// (throttler.ErrUnavailable), by a write that fewer replicas than
// Options.WaitReplicas acknowledged within Options.WaitTimeout. The write
// happened on the primary: a Take may have counted its units there.
var ErrTooFewReplicas = errors.New("redis: too few replicas acknowledged the write")

// defaultWaitTimeout is Options.WaitTimeout's default: far above the time
// a replica on the same network takes to acknowledge (a round trip), and
// half a Throttler's default Timeout. Redis may still answer a shortfall
// only at its next cron tick (see Options.WaitTimeout).
const defaultWaitTimeout = 50 * time.Millisecond

// waiter sends WAIT after the writes of a primary's requests.
type waiter struct {
	replicas int
	timeout  time.Duration // whole milliseconds, >= 1ms
	pipe     func() goredis.Pipeliner
}

// newWaiter returns the waiter of primary c under o, nil when o waits for
// no replica, or an error naming shard i when c cannot carry WAIT: only a
// *goredis.Client (one server, or a FailoverClient) pipelines on one
// connection to one server, and one whose ReadTimeout ends before WAIT
// would drop the connection instead of reading its answer.
func newWaiter(o Options, i int, c Client) (*waiter, error) {
	if o.WaitReplicas == 0 {
		return nil, nil
	}
	rc, ok := c.(*goredis.Client)
	if !ok {
		return nil, fmt.Errorf("redis: Options.WaitReplicas needs each primary to be a *goredis.Client (one server or a FailoverClient); shards[%d].Primary is a %T", i, c)
	}
	if rt := rc.Options().ReadTimeout; rt > 0 && rt <= o.WaitTimeout {
		return nil, fmt.Errorf("redis: Options.WaitTimeout %v must be below shards[%d].Primary's ReadTimeout %v, which would cut WAIT short", o.WaitTimeout, i, rt)
	}
	return &waiter{replicas: o.WaitReplicas, timeout: o.WaitTimeout, pipe: rc.Pipeline}, nil
}

// waitDefaults validates and fills WaitReplicas and WaitTimeout (see
// Options.withDefaults).
func waitDefaults(o *Options) error {
	switch {
	case o.WaitReplicas < 0:
		return fmt.Errorf("redis: Options.WaitReplicas must be >= 0 (0: off), got %d", o.WaitReplicas)
	case o.WaitTimeout < 0:
		return fmt.Errorf("redis: Options.WaitTimeout must be >= 0 (0: the default, %v), got %v", defaultWaitTimeout, o.WaitTimeout)
	case o.WaitTimeout != 0 && o.WaitReplicas == 0:
		return fmt.Errorf("redis: Options.WaitTimeout %v is set but Options.WaitReplicas is 0: nothing would wait", o.WaitTimeout)
	case o.WaitTimeout != 0 && o.WaitTimeout < time.Millisecond:
		// WAIT counts in ms, and its 0 blocks for ever.
		return fmt.Errorf("redis: Options.WaitTimeout must be at least 1ms, got %v", o.WaitTimeout)
	}
	if o.WaitReplicas > 0 && o.WaitTimeout == 0 {
		o.WaitTimeout = defaultWaitTimeout
	}
	o.WaitTimeout = o.WaitTimeout.Round(time.Millisecond) // WAIT's unit; never 0 after the check
	return nil
}

// writes reports whether req may write: every script but a Peek's (a
// fixed window's Peek is HMGET; the other algorithms' scripts, a
// composite's too, take their op first).
func (req *request) writes() bool {
	switch req.fn {
	case fnPeek:
		return false
	case fnTake, fnRefund:
		return true
	}
	return len(req.args) == 0 || req.args[0] != int(throttler.OpPeek)
}

// writes reports whether one of c's requests may write.
func (c *command) writes() bool {
	for _, p := range c.ps {
		if p.req.writes() {
			return true
		}
	}
	return false
}

// run runs script on its own and WAIT after it, in one pipeline: as
// Script.Run does, once more with the source (EVAL) when the server has
// not cached it. Too few acknowledgements, or WAIT's own failure, become
// the command's error.
func (w *waiter) run(ctx context.Context, script *goredis.Script, keys []string, args ...any) *goredis.Cmd {
	pipe := w.pipe()
	cmd := script.EvalSha(ctx, &once{p: pipe}, keys, args...)
	ack := w.send(ctx, pipe)
	_, _ = pipe.Exec(ctx)
	if goredis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") || refused(cmd.Err()) && ctx.Err() == nil {
		// Not cached, or refused before it ran (see refused): once more,
		// with the source.
		pipe = w.pipe()
		cmd = script.Eval(ctx, &once{p: pipe}, keys, args...)
		ack = w.send(ctx, pipe)
		_, _ = pipe.Exec(ctx)
	}
	if cmd.Err() == nil {
		if err := w.check(ack); err != nil {
			cmd.SetErr(err)
		}
	}
	return cmd
}

// queue adds WAIT to a batch's pipeline after its commands, when one of
// them writes; nil when none does or w is nil (off).
func (w *waiter) queue(ctx context.Context, pipe goredis.Pipeliner, writes bool) *goredis.Cmd {
	if w == nil || !writes {
		return nil
	}
	return w.send(ctx, pipe)
}

// send queues WAIT on pipe. Pipeliner has no Wait method (go-redis keeps
// blocking commands off pipelines): Do sends it as any command, read with
// the pipeline's deadline (its ReadTimeout, or the context's).
func (w *waiter) send(ctx context.Context, pipe goredis.Pipeliner) *goredis.Cmd {
	return pipe.Do(ctx, "WAIT", w.replicas, w.timeout.Milliseconds())
}

// check reads WAIT's answer: nil when enough replicas acknowledged, else
// the error every write before it gets. A nil ack (no WAIT sent) is nil.
func (w *waiter) check(ack *goredis.Cmd) error {
	if ack == nil {
		return nil
	}
	n, err := ack.Int64()
	switch {
	case err != nil:
		return fmt.Errorf("WAIT %d replicas: %w", w.replicas, err)
	case n < int64(w.replicas):
		return throttler.StoreFailure("", fmt.Errorf("%w: %d of %d within %v", ErrTooFewReplicas, n, w.replicas, w.timeout))
	}
	return nil
}

// fail gives err to each of c's writes that succeeded; reads keep their
// answers.
func (c *command) fail(err error) {
	if err == nil {
		return
	}
	for _, p := range c.ps {
		if p.err == nil && p.req.writes() {
			p.reply, p.err = nil, err
		}
	}
}

// single runs req on its own, with WAIT after it when it writes and the
// lane waits.
func (l *lane) single(ctx context.Context, req *request) (any, error) {
	if l.wait == nil || !req.writes() {
		return single(ctx, l, req)
	}
	return l.wait.run(ctx, req.scriptOf(), req.scriptKeys(), req.scriptArgs()...).Result()
}

// run runs a write script outside batches (a lease's) on s's primary:
// runScript, with WAIT after it when the backend waits for replicas.
func (s *shard) run(ctx context.Context, script *goredis.Script, keys []string, args ...any) *goredis.Cmd {
	var cmd *goredis.Cmd
	if s.primaryLane.wait == nil {
		cmd = runScript(ctx, s.primaryLane.scripts, script, keys, args...)
	} else {
		cmd = s.primaryLane.wait.run(ctx, script, keys, args...)
	}
	s.watch.answered(cmd.Err()) // a READONLY is a switch (failover.go)
	return cmd
}
