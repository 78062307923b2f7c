// Package redis is a throttler.Backend on Redis: one server, a Cluster or a
// Ring (New), or several independent shards chosen by the application, each a
// primary with optional replicas (NewSharded), the layout GitHub runs.
//
// Take and Refund are one Lua script each (EVALSHA, EVAL when the server has
// not cached it): one round trip, atomic. Peek is one HMGET, served by a
// replica when the shard has one. A window's reset-at is computed from the
// caller's now, stored in milliseconds and returned unchanged, so it never
// wobbles; every read treats a stored window whose reset-at <= now as absent,
// so a replica that still holds an ended window, or a key that has not
// expired yet, never answers for a new window. Key expiry only cleans up: it
// is set as a duration (the window plus Options.ExpiryMargin, PEXPIRE), so an
// application clock that disagrees with Redis's cannot make a live window
// vanish. See docs/backends-redis.md for the key layout.
//
// Failures: a failure of Redis itself (a network error, a pool timeout, a
// server that is LOADING, READONLY, BUSY, out of memory, or a cluster that
// is down) matches throttler.ErrUnavailable (throttler.StoreFailure), so that
// a Throttler's breaker counts it against the call's shard; a key another
// program wrote with another type (WRONGTYPE), and a Cluster slot in a move
// (TRYAGAIN, ASK, MOVED, a slot no node serves), match throttler.ErrKeyState
// and never do; a slot in a move is tried again within the call's deadline
// first (cluster.go). Each shard's primary is a store of its own, and so are
// its replicas, which Peeks reach first (throttler.Traits), and so is each
// master of a Cluster: one shard's or master's outage switches limiting off
// for its keys only, and a primary and its replicas fail apart. A replica
// that fails a Peek in any way, its half of the call's time running out
// included, fails that Peek with an error naming it, counted toward the
// replicas' store, and then rests a second: Peeks go to the primary at once
// until one probe finds it serving again (replica.go). Every error names the
// client it came from and, for a deadline on a client whose last dial
// failed, that dial's error; Check pings every server at start-up. Scripts
// are sent as commands go-redis never re-sends (batch.go, once), so none
// counts twice.
//
// Timeouts: the Throttler bounds each call through its context, and go-redis
// v9 ignores context deadlines on its sockets unless the client is built with
// ContextTimeoutEnabled: true. Set it (goredis is the import
// github.com/redis/go-redis/v9, renamed as this package is redis too):
//
//	rdb := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
//	b, err := redis.New(rdb, nil)
//
// Without it a stalled server holds a call for the client's ReadTimeout
// (3s by default) whatever the Throttler's timeout.
//
// Batching is built in (Options.MaxBatch): a call alone on an idle client
// is sent at once; calls that arrive while a client has round trips under
// way go together in its next one, a pipeline, each caller still bounded
// by its own context. go-redis's AutoPipeliner is accepted as a client too
// (ExampleNew_autoPipeline), and is then left to batch; its blocking calls
// ignore the context (go-redis v9.23). A composite of policies
// (throttler.All) is taken in one script over its members' keys, which
// must share a slot and a shard: on one server, or with Options.TagByKey
// (see Traits). An opt-in over-limit cache
// (Options.OverLimitCache) answers Takes of keys Redis denied until a
// known instant without a round trip. Stats counts both, and the primary
// switches the backend saw: a primary's client reaching another server (a
// failover it followed), or its server turning replica (READONLY; see
// failover.go), around which keys may admit over their limit by the bound
// docs/backends-redis.md states.
package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/internal/algo"
	"github.com/throttlekit/throttlekit/internal/nilness"
	"github.com/throttlekit/throttlekit/throttler"
)

// Client is the part of a go-redis client the backend uses: scripts for Take
// and Refund, HMGET for Peek. *redis.Client, *redis.ClusterClient,
// *redis.Ring and *redis.AutoPipeliner all satisfy it.
type Client interface {
	goredis.Scripter
	HMGet(ctx context.Context, key string, fields ...string) *goredis.SliceCmd
}

var (
	_ Client = (*goredis.Client)(nil)
	_ Client = (*goredis.ClusterClient)(nil)
	_ Client = (*goredis.Ring)(nil)
	_ Client = (*goredis.AutoPipeliner)(nil)
)

// ErrUnexpectedReply is returned, wrapped, when Redis answers with something
// the backend did not ask for (a wrong type or a value out of range). It
// never panics on a reply.
var ErrUnexpectedReply = errors.New("redis: unexpected reply")

// ErrNoShards is returned by NewSharded for an empty or nil shard list.
var ErrNoShards = errors.New("redis: no shards")

// MaxLimit is the largest Policy.Limit, and the largest cost, this backend
// counts: throttler.MaxLimit (2^48), which throttler.ValidateCall enforces.
// The scripts' numbers are Lua doubles, exact up to 2^53.
const MaxLimit = throttler.MaxLimit

var (
	// windowSource defines the fixed window's functions, which take.lua
	// runs for one window and all.lua for a composite's (composite.go).
	//go:embed scripts/window.lua
	windowSource string
	//go:embed scripts/take.lua
	takeSource string
	takeScript = goredis.NewScript(windowSource + takeSource)
	//go:embed scripts/refund.lua
	refundSource string
	refundScript = goredis.NewScript(refundSource)
)

// Options configure a Backend. The zero value (or nil) means defaults; a
// value that cannot work is an error from New or NewSharded.
type Options struct {
	// Prefix begins every key the backend writes, so that several
	// applications can share one Redis. It must not hold '{' or '}',
	// which would move the hash tag. default: "throttlekit:"
	Prefix string
	// ExpiryMargin is how long a window's key outlives its reset-at, for
	// an application clock that lags Redis's; the key is deleted by Redis
	// then, purely to reclaim memory. Negative is an error; below a
	// millisecond counts as one. default: 1s
	ExpiryMargin time.Duration
	// MaxBatch bounds how many operations one round trip to a Redis
	// carries. Operations that arrive while a client has round trips under
	// way wait for the next one and go together (see Batching in
	// docs/backends-redis.md); a call alone is sent at once. 1 sends every
	// operation on its own; at most 4096. default: 128
	MaxBatch int
	// alwaysBatch sends every operation through a batch (batch.lua), a
	// lone one included, so that a suite of sequential calls checks the
	// answers of batches. Tests only: a lone call then waits for a
	// goroutine.
	alwaysBatch bool
	// OverLimitCache is how many keys this process remembers as denied:
	// a Take that Redis denied until a known instant (a fixed window's
	// reset, a RetryAfter) makes further Takes of that policy and key
	// denied here until then, without a round trip. It can deny what Redis
	// would admit after another process refunds units or raises the Limit
	// (see the over-limit cache in docs/backends-redis.md). default: 0, off
	OverLimitCache int
	// WaitReplicas makes every write (a Take, a Refund, a lease's Acquire
	// or Release) wait until that many replicas of its primary hold it:
	// WAIT, in the same pipeline as the script, so still one round trip.
	// Fewer acknowledgements within WaitTimeout fail the call with
	// ErrTooFewReplicas, a store failure, though the primary did write.
	// It narrows what a failover can lose, it does not make Redis
	// consistent ("Failover" in docs/backends-redis.md). Each primary must
	// be a *goredis.Client (one server, or a FailoverClient). Negative is
	// an error. default: 0, off (writes are acknowledged by the primary
	// alone)
	WaitReplicas int
	// TagByKey puts every key of one client key in one hash slot and on
	// one shard: each storage key's hash tag (and the hash that picks its
	// shard) is computed from the client key alone, rather than from the
	// policy and the key. A composite (throttler.All) needs its members'
	// keys together, so a Backend on a Cluster, a Ring or several shards
	// takes composites only with it; on a single *goredis.Client with one
	// shard they are always together (Traits). The layout differs from
	// the default one, so turning it on for live traffic gives every key
	// fresh state unless the fleet moves through a migration ("Composites"
	// in docs/backends-redis.md). default: false, each (policy, key)
	// placed apart
	TagByKey bool
	// WaitTimeout bounds each WAIT, rounded to whole milliseconds. Redis
	// ends a WAIT that times out on its cron tick (100ms at its default hz
	// of 10), so a shortfall can take that long: a Throttler's Timeout
	// below it ends such calls first, a store failure too. It must be
	// below each primary's ReadTimeout. Negative, below 1ms, or set while
	// WaitReplicas is 0 is an error. default: 50ms when WaitReplicas > 0
	WaitTimeout time.Duration
}

func (o *Options) withDefaults() (Options, error) {
	var out Options
	if o != nil {
		out = *o
	}
	if out.Prefix == "" {
		out.Prefix = "throttlekit:"
	}
	if strings.ContainsAny(out.Prefix, "{}") {
		return out, fmt.Errorf("redis: Options.Prefix %q holds a brace, which would move the hash tag", out.Prefix)
	}
	if out.ExpiryMargin < 0 {
		return out, fmt.Errorf("redis: Options.ExpiryMargin must be >= 0 (0: the default, 1s), got %v", out.ExpiryMargin)
	}
	if out.ExpiryMargin == 0 {
		out.ExpiryMargin = time.Second
	}
	if out.MaxBatch < 0 || out.MaxBatch > maxBatchLimit {
		return out, fmt.Errorf("redis: Options.MaxBatch must be 0 (the default, 128) to %d, got %d", maxBatchLimit, out.MaxBatch)
	}
	if out.MaxBatch == 0 {
		out.MaxBatch = 128
	}
	if out.OverLimitCache < 0 {
		return out, fmt.Errorf("redis: Options.OverLimitCache must be >= 0 (0: off), got %d", out.OverLimitCache)
	}
	return out, waitDefaults(&out)
}

// Shard is one independent Redis of a sharded layout: a primary that takes
// every write, and replicas that serve Peek.
type Shard struct {
	Primary  Client
	Replicas []Client
}

type shard struct {
	primary      Client
	replicas     []Client
	primaryLane  *lane           // batches primary's requests
	replicaLanes []*lane         // and each replica's
	next         atomic.Uint32   // round robin over replicas
	name         string          // the primary's store, for a Throttler's breakers
	replicasName string          // the replicas' store, which Peeks reach first
	health       []replicaHealth // of each replica, as replicaLanes (replica.go)
	watch        *primaryWatch   // the primary's switches (failover.go); nil: not a *goredis.Client
	cluster      *masters        // a Cluster's masters, when the primary is a ClusterClient (cluster.go)
}

// Backend stores rate limits in Redis. It is safe for concurrent use. It
// keeps no goroutine running: one that sends queued batches (batch.go)
// ends when its client's queue is empty, and one that loads a Cluster's
// slot map (cluster.go) when the load does. The clients it was given
// remain the caller's to close. Create it with New or NewSharded.
type Backend struct {
	shards   []*shard
	prefix   string
	marginMS int64
	// tagByKey is Options.TagByKey; composites, whether every member of a
	// composite is on one shard and in one slot (see Traits).
	tagByKey, composites bool
	cache                *overLimitCache // nil: off
	counters             counters
	mono                 func() time.Duration // replicas' rests (replica.go); tests replace it
}

var _ throttler.LeaseBackend = (*Backend)(nil)

// Traits names each call's store (see store and leaseStore), says that
// leases are held, that calls ignore their context when a client is
// go-redis's AutoPipeliner (see ignoresContext), and that composites are
// taken when their members' keys are sure to share a shard and a slot:
// with Options.TagByKey, or on one shard whose primary is a
// *goredis.Client (one server, or a FailoverClient), where no slot rule
// applies. A Cluster, a Ring, another client (an AutoPipeliner may wrap a
// Cluster) or several shards without TagByKey take none, and a Throttler
// refuses a composite on them when it is asked.
func (b *Backend) Traits() throttler.Traits {
	return throttler.Traits{
		IgnoresContext: b.ignoresContext(),
		Leases:         true,
		Composites:     b.composites,
		Store:          b.store,
		LeaseStore:     b.leaseStore,
	}
}

// ignoresContext reports whether a client of any shard is go-redis's
// AutoPipeliner, whose blocking calls wait for their batch whatever the
// context says (go-redis v9.23): a Throttler then detaches every call, so
// that its Timeout bounds them (see throttler.Options.Detach).
func (b *Backend) ignoresContext() bool {
	for _, s := range b.shards {
		if _, ok := s.primary.(*goredis.AutoPipeliner); ok {
			return true
		}
		for _, r := range s.replicas {
			if _, ok := r.(*goredis.AutoPipeliner); ok {
				return true
			}
		}
	}
	return false
}

// New returns a Backend on one client: a single Redis, or a Cluster or Ring
// client, which route each key themselves. Nil options mean defaults. A nil
// client or a bad option is an error naming it.
func New(c Client, opts *Options) (*Backend, error) {
	if err := required("the Client", c); err != nil {
		return nil, err
	}
	return NewSharded([]Shard{{Primary: c}}, opts)
}

// NewSharded returns a Backend that spreads keys over independent shards by
// jump consistent hashing of the storage key: appending a shard moves about
// 1/N of the keys, all of them to the new shard. The order of shards is
// part of the layout: append new ones at the end, never reorder. Writes go
// to a shard's primary; Peek goes to one of its replicas, round robin, and
// to the primary while every replica rests after a failure (see Peek). Nil options mean defaults. No
// shards (ErrNoShards), a nil client or a bad option is an error naming it.
func NewSharded(shards []Shard, opts *Options) (*Backend, error) {
	if len(shards) == 0 {
		return nil, ErrNoShards
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	b := &Backend{shards: make([]*shard, len(shards)), prefix: o.Prefix, marginMS: max(o.ExpiryMargin.Milliseconds(), 1),
		tagByKey: o.TagByKey, mono: sinceStart}
	_, plain := shards[0].Primary.(*goredis.Client)
	b.composites = o.TagByKey || len(shards) == 1 && plain
	watched := map[Client]*dialWatch{}      // a client in two roles gets one hook
	primaries := map[Client]*primaryWatch{} // and a primary one watch (failover.go)
	for i, s := range shards {
		if err := required(fmt.Sprintf("shards[%d].Primary", i), s.Primary); err != nil {
			return nil, err
		}
		for j, r := range s.Replicas {
			if err := required(fmt.Sprintf("shards[%d].Replicas[%d]", i, j), r); err != nil {
				return nil, err
			}
		}
		sh := &shard{primary: s.Primary, replicas: append([]Client(nil), s.Replicas...),
			name: storeName(i, len(shards), "", s.Primary)}
		if len(s.Replicas) > 0 {
			sh.replicasName = storeName(i, len(shards), " replicas", s.Replicas...)
		}
		sh.primaryLane = b.newLane(s.Primary, o, sh.name, watched)
		sh.watch = b.watchPrimary(s.Primary, primaries)
		if sh.primaryLane.wait, err = newWaiter(o, i, s.Primary); err != nil {
			return nil, err
		}
		if cc, ok := s.Primary.(*goredis.ClusterClient); ok && len(s.Replicas) == 0 {
			sh.cluster = newMasters(cc, sh.primaryLane)
		}
		for _, r := range sh.replicas {
			sh.replicaLanes = append(sh.replicaLanes, b.newLane(r, o, storeName(i, len(shards), " replica", r), watched))
		}
		sh.health = make([]replicaHealth, len(sh.replicas))
		b.shards[i] = sh
	}
	if o.OverLimitCache > 0 {
		b.cache = newOverLimitCache(o.OverLimitCache)
	}
	return b, nil
}

// newLane is the lane of client c, batching as o says, named store in
// errors, with c's dials watched (once per client).
func (b *Backend) newLane(c Client, o Options, store string, watched map[Client]*dialWatch) *lane {
	l := newLane(c, o.MaxBatch, &b.counters)
	l.always = o.alwaysBatch
	w, ok := watched[c]
	if !ok {
		w = watchDials(c)
		watched[c] = w
	}
	l.store, l.dials = store, w
	return l
}

// storeName names the clients cs of shard i of n, in role (a primary: "",
// or " replicas"), for a Throttler's breakers, its observations and errors:
// "redis shard 1 (10.0.0.1:6379)", "redis shard 1 replicas (10.0.0.2:6379,
// 10.0.0.3:6379)", or "redis (…)" for a single shard; the addresses when
// the clients tell them (a *goredis.Client).
func storeName(i, n int, role string, cs ...Client) string {
	name := "redis"
	if n > 1 {
		name = "redis shard " + strconv.Itoa(i)
	}
	name += role
	var addrs []string
	for _, c := range cs {
		if a := addrOf(c); a != "" {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) > 0 {
		name += " (" + strings.Join(addrs, ", ") + ")"
	}
	return name
}

// addrOf is a client's address when it tells one (a *goredis.Client), or "".
func addrOf(c Client) string {
	if o, ok := c.(interface{ Options() *goredis.Options }); ok && o.Options() != nil {
		return o.Options().Addr
	}
	return ""
}

// store names the store op on key under p reaches first (see
// throttler.Traits): the primary of the key's shard for a Take or a Refund,
// its replicas for a Peek when it has some serving (the primary while every
// one rests after a failure, see read). Each shard fails on its own, and
// so do its primary and its replicas: a replica's answers never close the
// breaker of a failing primary, and a primary's open breaker never stops
// the Peeks its replicas answer. A Cluster is a store per master: the
// master that serves the key's slot (cluster.go). A Ring is one store: the
// client routes inside it.
func (b *Backend) store(op throttler.Op, key string, p throttler.Policy) string {
	s := b.shards[0]
	if p.Composite() {
		p = firstMember(p) // every member is on its shard (Traits)
	}
	if len(b.shards) > 1 || s.cluster != nil {
		var idBuf [maxPolicyNameLen]byte
		var lenBuf [20]byte
		_, _, h := b.keyHash(p, key, idBuf[:0], lenBuf[:0]) // the key's hash without building the key
		if s = b.shardFor(h); s.cluster != nil {
			return s.cluster.store(hashSlot(h, b.tagByKey))
		}
	}
	if op == throttler.OpPeek && s.replicasName != "" && s.serving() {
		return s.replicasName
	}
	return s.name
}

// required reports a nil client, including a nil pointer in the interface
// (a *goredis.Client variable never assigned), which would otherwise fail,
// or panic, on the first call rather than here.
func required(what string, c Client) error {
	return nilness.Check("redis: "+what, c)
}

// Take counts cost against the key's window if it fits: one script on the
// shard's primary, alone or in a batch (batch.go). With the over-limit
// cache on, a Take that Redis would deny by what it last answered this
// process is denied here (cache.go). A composite (throttler.All) is one
// script over its members' keys (composite.go), where Traits say
// Composites, and an error matching throttler.ErrInvalidPolicy elsewhere.
func (b *Backend) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	if err := throttler.ValidateCall(throttler.OpTake, key, p, cost, time.Time{}); err != nil {
		return throttler.Decision{}, err
	}
	if p.Composite() {
		return b.composite(ctx, throttler.OpTake, key, p, cost, now)
	}
	sk, h := b.keyOf(p, key)
	if b.cache == nil {
		return b.op(ctx, throttler.OpTake, key, sk, h, p, cost, 0, now, nil)
	}
	if d, ok := b.cache.take(sk, h, p, cost, now); ok {
		b.counters.cacheHits.Add(1)
		return d, nil
	}
	var denial overLimit
	d, err := b.op(ctx, throttler.OpTake, key, sk, h, p, cost, 0, now, &denial)
	switch {
	case err != nil:
	case d.Allowed:
		b.cache.drop(sk, h)
	case p.Algorithm == throttler.SlidingLog && d.Used+cost-p.Limit != 1:
		// Units that end before the one this cost waits for would change
		// Used: only a wait for one unit is kept, the hot key's case.
	default:
		t := now.UnixMilli()
		denial.p, denial.cost, denial.d, denial.at = p, cost, d, t
		denial.until = t + d.RetryAfter.Milliseconds()
		if p.Algorithm == throttler.FixedWindow {
			denial.until = d.ResetAt.UnixMilli()
		}
		b.cache.put(sk, h, &denial, t)
	}
	return d, err
}

// Refund gives cost back to the key's state that the Take of receipt
// counted them in (see throttler.Backend), never below empty: one script on
// the shard's primary, alone or in a batch, which compares the stored
// state with the receipt.
func (b *Backend) Refund(ctx context.Context, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
	if err := throttler.ValidateCall(throttler.OpRefund, key, p, cost, receipt); err != nil {
		return throttler.Decision{}, err
	}
	sk, h := b.keyOf(p, key)
	if b.cache != nil {
		b.cache.drop(sk, h)
	}
	return b.op(ctx, throttler.OpRefund, key, sk, h, p, cost, receipt.UnixMilli(), now, nil)
}

// Peek reports the key's state without counting. It reads a replica when
// the shard has one serving, and the primary otherwise (see read); a
// window that ended by now reads as absent wherever it is still stored. A
// composite's Peek is one script over its members' keys, as its Take.
func (b *Backend) Peek(ctx context.Context, key string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	if err := throttler.ValidateCall(throttler.OpPeek, key, p, 0, time.Time{}); err != nil {
		return throttler.Decision{}, err
	}
	if p.Composite() {
		return b.composite(ctx, throttler.OpPeek, key, p, 1, now)
	}
	sk, h := b.keyOf(p, key)
	return b.op(ctx, throttler.OpPeek, key, sk, h, p, 0, 0, now, nil)
}

// keyOf is the storage key of (p, key) and its hash.
func (b *Backend) keyOf(p throttler.Policy, key string) (string, uint64) {
	if p.Algorithm == throttler.FixedWindow {
		return b.storageKey(p, key)
	}
	return b.algorithmKey(p, key)
}

// op runs op under p on the key's shard (r: a Refund's receipt, Unix ms);
// the input has been validated. A denied Take fills denial, when given,
// with the state the cache needs.
func (b *Backend) op(ctx context.Context, op throttler.Op, key, sk string, h uint64, p throttler.Policy, cost, r int64, now time.Time, denial *overLimit) (throttler.Decision, error) {
	s := b.shardFor(h)
	var (
		d   throttler.Decision
		err error
	)
	switch p.Algorithm {
	case throttler.FixedWindow:
		d, err = b.window(ctx, s, sk, op, p, cost, r, now)
	case throttler.TokenBucket:
		d, err = b.bucket(ctx, s, sk, op, p, cost, r, now.UnixMilli(), denial)
	case throttler.SlidingWindow:
		d, err = b.counter(ctx, s, sk, op, p, cost, r, now.UnixMilli(), denial)
	case throttler.SlidingLog:
		d, err = b.log(ctx, s, sk, op, p, cost, r, now.UnixMilli())
	default: // unreachable after validation
		err = fmt.Errorf("%w: algorithm %v", throttler.ErrInvalidPolicy, p.Algorithm)
	}
	if err != nil {
		return throttler.Decision{}, opError(op.String(), key, p, err)
	}
	return d, nil
}

// window runs op on a fixed window: take.lua or refund.lua on the primary,
// HMGET on a replica (then the primary) for a Peek.
func (b *Backend) window(ctx context.Context, s *shard, sk string, op throttler.Op, p throttler.Policy, cost, r int64, now time.Time) (throttler.Decision, error) {
	nowMS := now.UnixMilli()
	switch op {
	case throttler.OpTake:
		winMS := p.Window.Milliseconds()
		var res [3]int64
		err := b.exec(ctx, s, op, &request{fn: fnTake, sk: sk,
			take: takeArgs{nowMS, nowMS + winMS, p.Limit, cost, winMS + b.marginMS}}, func(reply any) error {
			err := parseReply(reply, res[:])
			if err == nil && (res[0] < 0 || res[0] > 1 || res[1] < 0) {
				err = fmt.Errorf("%w: %v", ErrUnexpectedReply, res)
			}
			return err
		})
		if err != nil {
			return throttler.Decision{}, err
		}
		return algo.WindowState(p, res[1], time.UnixMilli(res[2]), now, res[0] == 1), nil
	case throttler.OpRefund:
		var res [2]int64
		err := b.exec(ctx, s, op, &request{fn: fnRefund, sk: sk, args: []any{nowMS, cost, r}}, func(reply any) error {
			err := parseReply(reply, res[:])
			if err == nil && res[0] < 0 {
				err = fmt.Errorf("%w: %v", ErrUnexpectedReply, res)
			}
			return err
		})
		if err != nil {
			return throttler.Decision{}, err
		}
		return algo.PeekState(p, res[0], time.UnixMilli(res[1]), now), nil
	}
	var (
		used    int64
		resetAt time.Time
	)
	err := b.exec(ctx, s, op, &request{fn: fnPeek, sk: sk}, func(reply any) (err error) {
		used, resetAt, err = parseWindow(reply)
		return err
	})
	if err != nil {
		return throttler.Decision{}, err
	}
	return algo.PeekState(p, used, resetAt, now), nil
}

// exec runs req for op and checks its reply with parse: a Peek on a
// replica (see read), a Take or a Refund on the primary.
func (b *Backend) exec(ctx context.Context, s *shard, op throttler.Op, req *request, parse func(reply any) error) error {
	f := func(ctx context.Context, l *lane) error {
		reply, err := l.do(ctx, req)
		switch {
		case errors.Is(err, goredis.Nil):
			err = fmt.Errorf("%w: nil", ErrUnexpectedReply)
		case err == nil:
			err = parse(reply)
		}
		if err != nil {
			return storeError(l.store, l.dials, err)
		}
		return nil
	}
	if s.cluster != nil {
		return s.cluster.settle(ctx, func(ctx context.Context) error {
			return f(ctx, s.cluster.laneOf(keySlot(req.sk)))
		})
	}
	if op == throttler.OpPeek {
		return b.read(ctx, s, f)
	}
	err := f(ctx, s.primaryLane)
	s.watch.answered(err)
	return err
}

// parseWindow reads a window's hash from HMGET u r; a zero resetAt means
// none is stored. Fields that do not parse as integers read as absent, as
// in the scripts, which overwrite them on the next Take.
func parseWindow(reply any) (used int64, resetAt time.Time, err error) {
	vals, ok := reply.([]any)
	if !ok {
		return 0, time.Time{}, fmt.Errorf("%w: HMGET gave %T", ErrUnexpectedReply, reply)
	}
	if len(vals) != 2 {
		return 0, time.Time{}, fmt.Errorf("%w: HMGET gave %d values for 2 fields", ErrUnexpectedReply, len(vals))
	}
	u, uok := parseField(vals[0])
	r, rok := parseField(vals[1])
	if !uok || !rok {
		return 0, time.Time{}, nil
	}
	return max(u, 0), time.UnixMilli(r), nil
}

// parseInts fills out from a script's reply, which must be an array of
// exactly len(out) integers, for a script run outside batches (Script.Run).
func parseInts(cmd *goredis.Cmd, out []int64) error {
	reply, err := cmd.Result()
	if errors.Is(err, goredis.Nil) {
		return fmt.Errorf("%w: nil", ErrUnexpectedReply)
	}
	if err != nil {
		return err
	}
	return parseReply(reply, out)
}

// parseReply is parseInts for a reply already read.
func parseReply(reply any, out []int64) error {
	if reply == nil {
		return fmt.Errorf("%w: nil", ErrUnexpectedReply)
	}
	vals, ok := reply.([]any)
	if !ok {
		return fmt.Errorf("%w: %T, want an array", ErrUnexpectedReply, reply)
	}
	if len(vals) != len(out) {
		return fmt.Errorf("%w: %d values, want %d", ErrUnexpectedReply, len(vals), len(out))
	}
	for i, v := range vals {
		n, ok := v.(int64)
		if !ok {
			return fmt.Errorf("%w: value %d is %T, want an integer", ErrUnexpectedReply, i, v)
		}
		out[i] = n
	}
	return nil
}

func parseField(v any) (int64, bool) {
	s, ok := v.(string)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

func (b *Backend) shardFor(h uint64) *shard {
	if len(b.shards) == 1 {
		return b.shards[0]
	}
	return b.shards[jumpHash(h, len(b.shards))]
}

// opError wraps a failure with the operation and the policy (rate or lease),
// and marks it as the shard's (throttler.StoreFailure) or the key's
// (throttler.ErrKeyState) when it is known to be either. Long keys are cut:
// the error is for logs (a Throttler never writes it into a response).
func opError(op, key string, p fmt.Stringer, err error) error {
	if len(key) > 64 {
		key = key[:64] + "..."
	}
	wrapped := fmt.Errorf("redis: %s %q (policy %v): %w", op, key, p, err)
	switch {
	case keyFailure(err):
		return throttler.KeyFailure(wrapped)
	case errors.Is(err, throttler.ErrUnavailable):
		return wrapped // marked already, with the store that failed (a replica's)
	case storeFailure(err):
		return throttler.StoreFailure("", wrapped)
	}
	return wrapped
}

// storeErrorPrefixes begin the replies of a Redis that cannot serve any key
// now: loading its data set, a replica without its primary or one that
// refuses writes, a cluster without a quorum or in the middle of a
// resharding, a script or a command hogging the server, memory or disk
// full, too few replicas for a write.
var storeErrorPrefixes = []string{
	"LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "BUSY", "OOM",
	"MISCONF", "NOREPLICAS", "ERR max number of clients reached",
}

// storeFailure reports whether err, from go-redis, is a failure of the
// server or of the way to it, rather than of one key or of the call.
// Context errors are left to the caller, who knows whose deadline it was.
func storeFailure(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, goredis.ErrPoolTimeout) || errors.Is(err, goredis.ErrPoolExhausted) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	var re goredis.Error
	if !errors.As(err, &re) {
		return false
	}
	for _, prefix := range storeErrorPrefixes {
		if strings.HasPrefix(re.Error(), prefix) {
			return true
		}
	}
	return false
}

// keyFailure reports whether err is about the key alone: it holds a value
// of another type (another program's key under the prefix), or its Cluster
// slot is moving (slotMoving), which opError checks before storeFailure. A
// script's error carries the command's reply in its text, hence Contains.
func keyFailure(err error) bool {
	var re goredis.Error
	return errors.As(err, &re) && strings.Contains(re.Error(), "WRONGTYPE") || slotMoving(err)
}
