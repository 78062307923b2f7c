package redis

import (
	"context"
	"errors"
	"net"
	"strings"
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
// A READONLY reply to a write is a store failure of the primary's store
// (see storeErrorPrefixes) and go-redis drops the connection that got it;
// a FailoverClient's next dial asks Sentinel for the primary again. The
// first READONLY since the client last reached a new server is a switch
// too: the server became a replica, which a client that will not follow (a
// plain client of its address) sees only so. The dial that follows it to a
// new server is then the same switch, not counted again. A server demoted,
// promoted and demoted again while the client stays on it counts once.

// primaryWatch is a go-redis hook on a primary's *goredis.Client that
// counts its switches to another server.
type primaryWatch struct {
	addr     atomic.Pointer[string] // the server the client last reached
	demoted  atomic.Bool            // a READONLY counted, and no new server since
	switches *atomic.Uint64
}

// watchPrimary returns the primaryWatch of c, added to it when it is a
// *goredis.Client, the only kind whose dials a hook sees, once per client
// (seen); nil for another client.
func (b *Backend) watchPrimary(c Client, seen map[Client]*primaryWatch) *primaryWatch {
	rc, ok := c.(*goredis.Client)
	if !ok {
		return nil
	}
	if w, ok := seen[c]; ok {
		return w
	}
	w := &primaryWatch{switches: &b.counters.primarySwitches}
	seen[c] = w
	rc.AddHook(w)
	return w
}

// answered notes how the primary answered a write: the first READONLY
// since the client last reached a new server is a switch. Successes say
// nothing: a replica answers a script that writes nothing (a denied Take).
// w may be nil (not watched).
func (w *primaryWatch) answered(err error) {
	if w != nil && readOnly(err) && w.demoted.CompareAndSwap(false, true) {
		w.switches.Add(1)
	}
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
// another server, unless a READONLY counted it already. Two dials racing to
// a new server count it once.
func (w *primaryWatch) reached(addr string) {
	if last := w.addr.Load(); last != nil && *last == addr {
		return
	}
	if old := w.addr.Swap(&addr); old != nil && *old != addr && !w.demoted.Swap(false) {
		w.switches.Add(1)
	}
}

// readOnly reports whether err is Redis's READONLY reply, as a command's
// reply or inside a script's error (a script's write refused by a replica).
func readOnly(err error) bool {
	var re goredis.Error
	return errors.As(err, &re) && (strings.HasPrefix(re.Error(), "READONLY") || strings.Contains(re.Error(), "-READONLY"))
}

func (w *primaryWatch) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }

func (w *primaryWatch) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}
