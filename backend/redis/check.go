package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/throttler"
)

// Store errors. Every failure of a call names the store it came from ("redis
// shard 1 (10.0.0.1:6379)"), and a call that ran out of time on a client
// whose last dial failed carries that dial's error: go-redis dials in the
// background and hands a caller whose deadline came first only
// context.DeadlineExceeded, so an unreachable server would otherwise read
// as a slow one.

// dialWatch is a go-redis hook that remembers a client's last failed dial,
// until a dial succeeds.
type dialWatch struct {
	last atomic.Pointer[error]
}

func (w *dialWatch) DialHook(next goredis.DialHook) goredis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil {
			w.last.Store(&err)
		} else if w.last.Load() != nil {
			w.last.Store(nil)
		}
		return c, err
	}
}

func (w *dialWatch) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }

func (w *dialWatch) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// watchDials adds a dialWatch to c when it is a client of one server, the
// only kind whose dials a hook sees; nil otherwise.
func watchDials(c Client) *dialWatch {
	rc, ok := c.(*goredis.Client)
	if !ok {
		return nil
	}
	w := new(dialWatch)
	rc.AddHook(w)
	return w
}

// storeError names the store of a failure, and gives a context error the
// cause the client last met dialing, if its last dial failed. The result
// matches what err matches (and the dial's error too).
func storeError(store string, dials *dialWatch, err error) error {
	if dials != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		if last := dials.last.Load(); last != nil {
			return fmt.Errorf("%s: %w (last dial: %w)", store, err, *last)
		}
	}
	return fmt.Errorf("%s: %w", store, err)
}

// pinger is a client that answers PING: *goredis.Client, ClusterClient,
// Ring.
type pinger interface {
	Ping(ctx context.Context) *goredis.StatusCmd
}

// shardsPinger is a client of several servers (a Cluster, a Ring) that can
// reach each of them.
type shardsPinger interface {
	ForEachShard(ctx context.Context, fn func(ctx context.Context, c *goredis.Client) error) error
}

// Check reports whether every store the backend uses answers: a PING to
// each shard's primary and replicas, and to every node of a Cluster (its
// masters and replicas) or live shard of a Ring, all at once, within ctx. A
// program calls it at start-up, so that an address that is wrong or a
// server that is down is an error then, rather than calls failing open
// later. A failure names its store and its cause ("redis (127.0.0.1:1):
// dial tcp 127.0.0.1:1: connect: connection refused") and matches
// throttler.ErrUnavailable; several are joined. A client that cannot PING
// (an AutoPipeliner, another Client) runs an empty script instead.
func (b *Backend) Check(ctx context.Context) error {
	type target struct {
		name string
		l    *lane
	}
	var targets []target
	for _, s := range b.shards {
		targets = append(targets, target{s.name, s.primaryLane})
		for _, l := range s.replicaLanes {
			targets = append(targets, target{l.store, l})
		}
	}
	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = check(ctx, t.name, t.l)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// check pings one client's servers.
func check(ctx context.Context, name string, l *lane) error {
	var err error
	switch c := l.c.(type) {
	case shardsPinger:
		err = c.ForEachShard(ctx, func(ctx context.Context, node *goredis.Client) error {
			if err := node.Ping(ctx).Err(); err != nil {
				return fmt.Errorf("node %s: %w", node.Options().Addr, err)
			}
			return nil
		})
		if p, ok := c.(pinger); ok && err == nil {
			// A Ring leaves out the shards it has marked down: with all
			// of them down, only its own PING fails.
			err = p.Ping(ctx).Err()
		}
	case pinger:
		err = c.Ping(ctx).Err()
	default:
		err = l.c.Eval(ctx, "return 1", nil).Err()
	}
	if err == nil {
		return nil
	}
	return throttler.StoreFailure(name, storeError(name, l.dials, err))
}
