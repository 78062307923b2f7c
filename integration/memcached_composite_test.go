package integration

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/memcached"
	"github.com/throttlekit/throttlekit/throttler"
)

// compositeT0 is the fixed instant of the composite tests: items get
// relative exptimes, so real servers take any instant.
var compositeT0 = time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)

// TestMemcachedCompositeExactness: 4 clients (own connections, as 4
// processes) over two servers, 16 goroutines each, take composites, and
// their last member alone, with costs of 1 to 3 at one instant. No member
// ever counts past its limit, and each counts exactly the units admitted by
// what includes it: a denied composite, raced or not, left nothing behind.
// A call may fail with ErrContention (the bucket's, log's and counter's
// cas across processes), having counted nothing.
func TestMemcachedCompositeExactness(t *testing.T) {
	const clients, goroutines, perGoroutine = 4, 16, 8
	s1, s2 := memcachedStart(t), memcachedStart(t)
	var backends []*memcached.Backend
	for range clients {
		backends = append(backends, memcachedNew(t, memcachedClient(t, time.Second, s1.addr, s2.addr), nil))
	}
	ctx := context.Background()
	for _, members := range [][]throttler.Policy{
		{throttler.PerMinute(300).Named("ce-m"), throttler.PerHour(500).Named("ce-h")},
		{
			throttler.PerHour(10).WithBurst(200).Named("ce-tb"),
			throttler.PerHour(260).WithAlgorithm(throttler.SlidingLog).Named("ce-sl"),
			throttler.PerHour(230).WithAlgorithm(throttler.SlidingWindow).Named("ce-sw"),
		},
	} {
		t.Run(members[0].Algorithm.String(), func(t *testing.T) {
			c, alone := throttler.All(members...), members[len(members)-1]
			var viaAll, viaAlone, contention atomic.Int64
			var wg sync.WaitGroup
			for g := range clients * goroutines {
				b := backends[g%clients]
				wg.Go(func() {
					for i := range perGoroutine {
						cost := int64(1 + (g+i)%3)
						p, n := c, &viaAll
						if (g+i)%4 == 0 {
							p, n = alone, &viaAlone
						}
						d, err := b.Take(ctx, "hot", p, cost, compositeT0)
						switch {
						case errors.Is(err, memcached.ErrContention):
							contention.Add(1)
						case err != nil:
							t.Errorf("Take: %v", err)
							return
						case d.Allowed:
							n.Add(cost)
						}
					}
				})
			}
			wg.Wait()
			t.Logf("admitted %d units by composites, %d by the last member alone; %d calls out of rounds",
				viaAll.Load(), viaAlone.Load(), contention.Load())
			for i, p := range members {
				d, err := backends[0].Peek(ctx, "hot", p, compositeT0)
				require.NoError(t, err)
				want := viaAll.Load()
				if i == len(members)-1 {
					want += viaAlone.Load()
				}
				assert.Equal(t, want, d.Used, "%v counts exactly what was admitted", p)
				assert.LessOrEqual(t, d.Used, p.Capacity(), "%v over its limit", p)
			}
			assert.Positive(t, viaAll.Load())
		})
	}
}

// memcachedWrites is how many writes (set, add, cas, incr, decr, hit or
// not) the server at addr has served, from its stats.
func memcachedWrites(t *testing.T, addr string) int64 {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(2*time.Second)))
	_, err = fmt.Fprint(conn, "stats\r\n")
	require.NoError(t, err)
	var n int64
	r := bufio.NewScanner(conn)
	for r.Scan() {
		f := strings.Fields(r.Text())
		if len(f) == 1 && f[0] == "END" {
			return n
		}
		if len(f) == 3 && f[0] == "STAT" {
			switch f[1] {
			case "cmd_set", "incr_misses", "incr_hits", "decr_misses", "decr_hits":
				v, err := strconv.ParseInt(f[2], 10, 64)
				require.NoError(t, err)
				n += v
			}
		}
	}
	require.NoError(t, r.Err())
	t.Fatalf("stats of %s ended early", addr)
	return 0
}

// TestMemcachedCompositeDeniedWritesNothing: with the members' items on
// two servers, composites denied one after another, by a member of each
// algorithm, write nothing on either server (the servers' own counts of
// writes do not move), and every member's state reads as before.
func TestMemcachedCompositeDeniedWritesNothing(t *testing.T) {
	b, _, s1, s2 := memcachedTwoServers(t)
	ctx := context.Background()
	for _, alg := range []throttler.Algorithm{throttler.FixedWindow, throttler.TokenBucket, throttler.SlidingLog, throttler.SlidingWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			spent := throttler.PerMinute(3).WithAlgorithm(alg).Named("dw-" + alg.String())
			open := throttler.PerHour(50).WithAlgorithm(throttler.SlidingWindow).Named("dw-open")
			// A key whose two members' first items are on two servers.
			store := throttler.TraitsOf(b).Store
			var key string
			for i := 0; key == ""; i++ {
				if k := fmt.Sprint(alg, "-", i); store(throttler.OpTake, k, spent) != store(throttler.OpTake, k, open) {
					key = k
				}
			}
			c := throttler.All(open, spent)
			d, err := b.Take(ctx, key, c, 1, compositeT0)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			d, err = b.Take(ctx, key, spent, 2, compositeT0)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			peek := func() []throttler.Decision {
				var out []throttler.Decision
				for _, p := range []throttler.Policy{open, spent} {
					d, err := b.Peek(ctx, key, p, compositeT0.Add(time.Second))
					require.NoError(t, err)
					out = append(out, d)
				}
				return out
			}
			before, w1, w2 := peek(), memcachedWrites(t, s1.addr), memcachedWrites(t, s2.addr)
			for i := range 3 {
				d, err := b.Take(ctx, key, c, int64(1+i%2), compositeT0.Add(time.Second))
				require.NoError(t, err)
				require.False(t, d.Allowed, "denied by %v", spent)
			}
			assert.Equal(t, w1, memcachedWrites(t, s1.addr), "writes on the first server")
			assert.Equal(t, w2, memcachedWrites(t, s2.addr), "writes on the second server")
			assert.Equal(t, before, peek(), "a member's state after the denials")
		})
	}
}

// afterIncr is a client that runs then, once, right after the first incr
// of key once armed.
type afterIncr struct {
	memcached.Client
	key   string
	armed atomic.Bool
	then  func()
}

func (c *afterIncr) Increment(key string, delta uint64) (uint64, error) {
	v, err := c.Client.Increment(key, delta)
	if key == c.key && c.armed.CompareAndSwap(true, false) {
		c.then()
	}
	return v, err
}

// TestMemcachedCompositeServerPausedBetweenMembers: a composite of a fixed
// window whose items are on one server and a token bucket whose item is on
// another, which is paused right after the window counted (between the
// members' Takes). The composite fails as the paused server's failure; the
// window's units are given back on its healthy server at once, so its
// count is as before. The bucket's cas, sent to the paused server, may be
// applied when it wakes: then the bucket keeps the cost, unadmitted, until
// it refills (the documented bound); never more. While the server stays
// paused, a composite fails at its read, and counts nothing on the healthy
// one.
func TestMemcachedCompositeServerPausedBetweenMembers(t *testing.T) {
	healthy, paused := memcachedStart(t), memcachedStart(t)
	sel := new(memcache.ServerList)
	require.NoError(t, sel.SetServers(healthy.addr, paused.addr))
	mc := memcache.NewFromSelector(sel)
	mc.Timeout = memcachedClientTimeout
	t.Cleanup(func() { _ = mc.Close() })
	hook := &afterIncr{Client: mc}
	b := memcachedNew(t, hook, &memcached.Options{Selector: sel})
	healthyStore, pausedStore := "memcached "+resolvedAddr(t, healthy.addr), "memcached "+resolvedAddr(t, paused.addr)

	win := throttler.PerHour(5).Named("pb-w") // the tighter: taken first
	bucket := throttler.PerHour(100).WithBurst(100).Named("pb-tb")
	resetMs := compositeT0.Add(win.Window).UnixMilli()
	// The window's head and counter (docs/backends-memcached.md, Items) on
	// the healthy server, the bucket's item on the paused one.
	counter := func(key string) string {
		return fmt.Sprintf("throttlekit:n:%d:%d:%s:%s", resetMs, len(win.Name), win.Name, key)
	}
	store := throttler.TraitsOf(b).Store
	var key string
	for i := 0; key == ""; i++ {
		k := fmt.Sprint("pb-", i)
		addr, err := sel.PickServer(counter(k))
		require.NoError(t, err)
		if store(throttler.OpTake, k, win) == healthyStore && "memcached "+addr.String() == healthyStore &&
			store(throttler.OpTake, k, bucket) == pausedStore {
			key = k
		}
	}
	ctx := context.Background()
	c := throttler.All(win, bucket)
	d, err := b.Take(ctx, key, c, 1, compositeT0)
	require.NoError(t, err)
	require.True(t, d.Allowed)

	hook.key, hook.then = counter(key), func() { paused.pause(t) }
	hook.armed.Store(true)
	_, err = b.Take(ctx, key, c, 2, compositeT0)
	require.ErrorIs(t, err, throttler.ErrUnavailable)
	assert.Equal(t, pausedStore, blamedStore(t, err), "blamed on the paused server: %v", err)
	w, err := b.Peek(ctx, key, win, compositeT0)
	require.NoError(t, err)
	assert.Equal(t, int64(1), w.Used, "the window's 2 units were given back on its healthy server")

	// Still paused: the read fails, and nothing is counted anywhere.
	_, err = b.Take(ctx, key, c, 1, compositeT0)
	require.ErrorIs(t, err, throttler.ErrUnavailable)
	w, err = b.Peek(ctx, key, win, compositeT0)
	require.NoError(t, err)
	assert.Equal(t, int64(1), w.Used, "a composite that failed at its read counted nothing")

	paused.unpause(t)
	require.Eventually(t, func() bool { _, err := b.Peek(ctx, key, bucket, compositeT0); return err == nil }, 10*time.Second, 50*time.Millisecond)
	tb, err := b.Peek(ctx, key, bucket, compositeT0)
	require.NoError(t, err)
	t.Logf("the bucket after the paused server woke: %d used (1 admitted; 3 if the timed-out cas was applied)", tb.Used)
	assert.Contains(t, []int64{1, 3}, tb.Used, "the bucket holds the admitted unit, and at most the failed Take's cost")
	refilled, err := b.Peek(ctx, key, bucket, compositeT0.Add(3*bucket.Window/100))
	require.NoError(t, err)
	assert.Zero(t, refilled.Used, "the bucket has refilled 3 tokens' time later")
}
