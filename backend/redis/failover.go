package redis

import (
	"context"
	"net"
	"sync/atomic"

	goredis "github.com/redis/go-redis/v9"
)

// A primary switch, seen from the client ("Failover" in
// docs/backends-redis.md). A FailoverClient dials the address Sentinel
// names as the primary, so a dial that reaches another server than the one
// the client reached before is a failover the client followed; so is a
// dial of a client addressed by a DNS name that now resolves elsewhere.
// Stats().PrimarySwitches counts them, for the metrics adapters and the
// ThrottlekitPrimarySwitched alert: around each one, keys may have
// admitted over their limit, by up to the bound the docs state.
//
// A READONLY reply is a store failure of the primary's store (see
// storeErrorPrefixes) and go-redis drops the connection that got it; the
// FailoverClient's next dial asks Sentinel for the primary again, which is
// the switch counted here.

// primaryWatch is a go-redis hook on a primary's *goredis.Client that
// counts its switches to another server.
type primaryWatch struct {
	addr     atomic.Pointer[string] // the server the client last reached
	switches *atomic.Uint64
}

// watchPrimary adds a primaryWatch to c when it is a *goredis.Client, the
// only kind whose dials a hook sees, once per client (seen).
func (b *Backend) watchPrimary(c Client, seen map[Client]bool) {
	rc, ok := c.(*goredis.Client)
	if !ok || seen[c] {
		return
	}
	seen[c] = true
	rc.AddHook(&primaryWatch{switches: &b.counters.primarySwitches})
}

func (w *primaryWatch) DialHook(next goredis.DialHook) goredis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err == nil && c != nil && c.RemoteAddr() != nil {
			w.reached(c.RemoteAddr().String())
		}
		return c, err
	}
}

// reached notes a connection to addr: a switch when the client last reached
// another server. Two dials racing to a new server count it once.
func (w *primaryWatch) reached(addr string) {
	if last := w.addr.Load(); last != nil && *last == addr {
		return
	}
	if old := w.addr.Swap(&addr); old != nil && *old != addr {
		w.switches.Add(1)
	}
}

func (w *primaryWatch) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }

func (w *primaryWatch) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}
