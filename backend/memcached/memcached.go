// Package memcached is a throttler.Backend on Memcached, for teams whose
// limiter already lives there: the same fixed-window contract as every other
// backend, as correct as Memcached allows, with what it cannot promise
// written down (docs/backends-memcached.md).
//
// # Items and the sequence of calls
//
// Each (policy, key) pair has a head item holding the open window's reset-at
// (Unix milliseconds), and each window has its own counter item whose key
// includes that reset-at. A window's identity is therefore (pair, reset-at):
// counting is a plain atomic incr on the counter, and compare-and-swap is
// needed only to switch the head to a new window.
//
// Take(cost):
//
//  1. gets head. If it holds a reset-at after now, the window is open: go to 3.
//  2. Open a window ending at now+Window: add the head if it was missing, or
//     cas it over the ended one. add/cas lose only to another process opening
//     a window at the same moment: start again at 1 (bounded by MaxAttempts,
//     then ErrContention). The winner adds the counter with its cost (if the
//     add finds a counter, because a process at the same now opened the same
//     window, it falls through to 3).
//  3. incr counter by cost, giving v. v <= Limit: admitted. A missing
//     counter is added with cost (if that loses to a concurrent add, incr
//     again) only by the Take that opened the window, or once the head,
//     read again from the server, still names the window: the opener has
//     not added it yet, or it was evicted. Any other miss goes back to 1:
//     the call may have stalled between its read and its incr long enough
//     for the window to end and its items to expire with its units, and
//     adding the counter back would count in a window that may have
//     admitted its limit already. From 1 the call counts in the window the
//     head names then (a newer one is open at the call's now) or opens
//     one at its now, which is the contract's answer for a call whose now
//     is behind the stored state.
//  4. v > Limit: denied, and the overshoot is undone with decr, which gives
//     d, the count without it. Between incr and decr a concurrent Take sees
//     the inflated count and may be denied although its units would have fit:
//     never an over-admission (every admitted Take saw every admitted unit
//     plus its own), but possibly a spurious denial. To keep those rare, a
//     denied Take whose cost fits in d tries again from 3 (bounded by
//     MaxAttempts); only the one that finds the window full for itself, or
//     runs out of attempts, is denied. The decr runs even when ctx is done:
//     skipping it would leave units counted that nobody took.
//
// Hot keys only incr and decr, which never conflict, so contention cannot
// exhaust the attempts: only simultaneous openings of one window retry, and
// each round has a winner.
//
// A counter is written after its head with an exptime from the same
// reset-at, so it expires no earlier than the head unless the process that
// added it has a clock ahead of the opener's (by about a second, Memcached's
// granularity): a head read after the counter was found missing names its
// window only if the counter did not expire. What a stall can still do: a
// Take stopped between two consecutive round trips of its own (the head
// write or read that named the window, then the add of its counter) for
// longer than the rest of the window plus the expiry margin adds a counter
// whose units expired meanwhile, and that window's count restarts, as after
// an eviction. And a Take whose flight (from its now to the server) is
// ExpiryMargin - 1s or longer may find the window open at its now expired,
// and opens one at its now, beside the one the others counted in.
//
// Peek is gets head, then get counter (one round trip when the window is already known, see below).
// Refund is gets head, then, when the head's window is the Take's (its reset-at is the refund's
// receipt), decr that window's counter; otherwise it counts nothing and reads the counter as Peek
// does. The counter's key holds the reset-at, so a refund can only ever credit the window of its
// receipt, even when the head was read from a cache that a clock ahead has since made stale.
// Memcached's decr stops at zero, which is exactly "never below zero", and it commutes with a
// pending undo of step 4 (max(0, max(0, c+p-r)-p) = max(0, c-r)).
//
// # The head cache
//
// Step 1 costs a round trip on every call, yet a head changes once per
// window. So each Backend remembers the reset-at it last read or wrote for a
// pair and trusts it for Options.CacheFor (1s) of the callers' time after
// reading it, while more than CacheFor of the window is left; then it reads
// the head again. The
// common case (an open window) is then one round trip, incr; without the
// cache (Options.NoCache) it is two, gets and incr. Opening a window is three
// (gets, add/cas, add); a denial adds a decr. Peek and Refund are one round
// trip from the cache.
//
// Whenever the head is read and this process has seen the pair's window
// before, the counter it expects is fetched in the same round trip (a
// multi-key gets). Memcached's LRU does not count incr as an access, only a
// fetch, so a counter that is only incremented ages from its creation and
// is evicted before idle items written after it; the fetch keeps an active
// pair's counter warm (docs/backends-memcached.md has the measurement). It also makes
// an uncached Peek one round trip.
//
// Only a call whose now has reached the reset-at replaces the head, so no
// process whose clock is less than CacheFor ahead of this caller's can have
// replaced a window with more than CacheFor left: the cache answers exactly
// as the head would (the contract counts a call in the stored window while
// it is open at the call's now, also when a clock ahead opened it). Trusting
// the cache up to the reset-at instead made a process count calls in the
// window another process's clock had already ended, which the other stores
// count in the new one: a shadow comparing them found "ResetAt off by a
// window". So the last CacheFor of every window, and every window no
// longer than CacheFor, reads the head on each call.
//
// What the cache can still get wrong, for at most CacheFor: if another
// process replaced the head early (its clock is more than CacheFor ahead of
// this caller's, or the head was evicted while the counter was not), this
// process keeps counting in the window it knows, a window that is still
// exact in itself (its counter is shared by everyone counting in it). A
// missing counter is never recreated
// from the cache: the head is read first. Re-reading at least every CacheFor
// also keeps an active pair's head warm in Memcached's LRU, as reading it on
// every call would.
//
// # Expiry
//
// Both items expire a little after the reset-at, for cleanup only: the
// relative exptime ceil((reset-at - now + ExpiryMargin) / 1s) never depends
// on the server's clock agreeing with the application's. The default margin,
// 2s, covers the second of granularity of Memcached's clock plus one second
// after reset-at, so calls of flights under a second find their window; a
// larger one covers longer flights (see Options.ExpiryMargin). A stored
// reset-at at or before now reads as no window, whether or not the item has
// expired yet.
//
// Memcached reads an exptime above 30 days (2592000 s) as an absolute Unix
// time, so items of windows that end more than 30 days after now are stored
// with no exptime at all: they stay until the window is replaced (the head)
// or Memcached's LRU reclaims them (counters). Clamping to 30 days instead
// would let a live window vanish and hand the client a fresh one.
//
// # Limits of Memcached
//
// Memcached may evict a live head or counter under memory pressure; the
// client then gets a fresh window. This is the weakness that motivates
// migrating away from Memcached and is measured in integration tests. With
// several servers (gomemcache's ServerList), the head and the counter of one
// pair may live on different servers, and each server's failure or eviction
// affects the pair.
//
// # Composites
//
// A composite of policies (throttler.All) is read in one multi-key gets,
// denied from that read without a write, or taken member by member with
// exact undos when a member denies after all: as close to all or nothing as
// Memcached allows, with the bound in composite.go and
// docs/backends-memcached.md.
//
// # Failures and stores
//
// A failure of a server itself (a refused or reset connection, a timeout,
// a SERVER_ERROR, a broken reply) matches throttler.ErrUnavailable
// (throttler.StoreFailure); an item this backend cannot read, or one
// Memcached refuses to count (CLIENT_ERROR on incr of a value that is not a
// number), matches ErrBadItem and throttler.ErrKeyState, and never trips a
// Throttler's breaker. The backend names the server of each call
// (throttler.Traits.Store) and blames a failure on the server it came
// from, so a Throttler keeps a breaker per server: one stalled server
// switches limiting off only for the keys whose items it holds. It sees
// the servers of a *memcache.Client itself (memcache.New(servers...) is
// all it takes); for a Client of another type, pass the ServerSelector it
// picks servers with as Options.Selector, else all its servers are one
// store. A server's failure names the server ahead of its cause
// ("memcached 10.0.0.2:11211: get window of ...: dial tcp ...: connection
// refused") whenever the selector or the network error tells it. memcache.ErrNoServers (a selector left
// with no server) is a store failure too; a client that has none when New
// can see its servers is refused there, and Check verifies at start-up
// that every server answers.
//
// gomemcache takes no context: the context is checked before each call, and
// the client's Timeout (memcache.Client.Timeout, default 500ms) bounds each
// call. A Throttler runs the backend's calls detached and stops waiting at
// its own Timeout, so set the client's to the Throttler's: a shorter one
// fails calls the server answers in time whenever the process is slow, and
// gomemcache closes the connection of each. A Take usually makes one to
// three calls, and at most about 4*MaxAttempts. gomemcache keeps only 2 idle
// connections per server by default and dials one for every call in flight
// beyond them; New gives a client left at that default a pool of 256 (see
// New). The safe set-up is the Example:
//
//	c := memcache.New("10.0.0.1:11211", "10.0.0.2:11211")
//	c.Timeout = 100 * time.Millisecond // the Throttler's Timeout
//	b, err := memcached.New(c, nil)    // a breaker per server, a pool sized
package memcached

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/throttlekit/throttlekit/internal/algo"
	"github.com/throttlekit/throttlekit/internal/nilness"
	"github.com/throttlekit/throttlekit/throttler"
)

// Client is the part of *memcache.Client that the backend uses. Because the
// server selection happens inside the client, a client over several servers
// works unchanged.
type Client interface {
	Get(key string) (*memcache.Item, error)
	GetMulti(keys []string) (map[string]*memcache.Item, error)
	Add(item *memcache.Item) error
	CompareAndSwap(item *memcache.Item) error
	Increment(key string, delta uint64) (uint64, error)
	Decrement(key string, delta uint64) (uint64, error)
}

var _ Client = (*memcache.Client)(nil)

var _ throttler.LeaseBackend = (*Backend)(nil)

// Traits says that calls ignore their context: gomemcache takes none, so a
// call is bounded only by the client's Timeout per round trip, and a Take
// makes several. A Throttler therefore detaches every call, so that its own
// Timeout bounds each one (see throttler.Options.Detach). They also name
// each call's server (see store), say that leases are held, and that
// composites are taken, with the bound in composite.go.
func (b *Backend) Traits() throttler.Traits {
	return throttler.Traits{IgnoresContext: true, Leases: true, Composites: true, Store: b.store, LeaseStore: b.leaseStore}
}

// MaxLimit is the largest Policy.Limit this backend accepts:
// throttler.MaxLimit (2^48), which throttler.ValidateCall enforces. Memcached
// counts in unsigned 64 bits that wrap around; with every admitted cost at
// most MaxLimit, only 65536 overshooting Takes in flight at once on one key,
// each costing about MaxLimit, could wrap a counter.
const MaxLimit = throttler.MaxLimit

// defaultIdleConns is the MaxIdleConns New gives a *memcache.Client that
// leaves it 0: connections kept open per server between calls, so that the
// calls a busy process has in flight reuse them instead of dialing. Only
// connections once needed are kept, so a quiet process holds few.
const defaultIdleConns = 256

// maxRelativeExptime is the longest exptime Memcached reads as relative.
const maxRelativeExptime = 30 * 24 * 60 * 60

// defaultExpiryMargin is added to reset-at - now: one second of Memcached's
// clock granularity plus one second after reset-at.
const defaultExpiryMargin = 2 * time.Second

// Errors returned by the backend. Match them with errors.Is.
var (
	// ErrContention reports that a call lost MaxAttempts rounds to other
	// processes writing the same key: opening a fixed window, or the
	// compare-and-swap of a token bucket, sliding log or sliding-window
	// counter, or of a key's leases. Nothing was counted, acquired or
	// released.
	ErrContention = errors.New("memcached: too much contention on one key")
	// ErrBadItem reports an item that does not hold what the backend stores,
	// such as a head that is not a reset-at (another program writing under
	// the prefix). It is one key's failure: it matches throttler.ErrKeyState.
	ErrBadItem = throttler.KeyFailure(errors.New("memcached: unexpected item value"))
)

// Options configures a Backend. A nil *Options, or a zero field, means the
// default; a value that cannot work is an error from New.
type Options struct {
	// Prefix starts every item key, so the limiter's items can share a
	// server with other data. Printable ASCII without spaces, at most
	// MaxPrefixLen bytes. default: "throttlekit:"
	Prefix string
	// MaxAttempts bounds the rounds a Take makes when it loses a race to
	// open a window (then it fails with ErrContention) or is denied while
	// its cost would have fit (then it stays denied), and the rounds of a
	// compare-and-swap (the other algorithms, Acquire; a lease Release,
	// whose failure holds a slot for the lease's TTL, makes up to four
	// times as many). Negative is an error. default: 8
	MaxAttempts int
	// CacheFor is how long, in the callers' time (the now they pass), a
	// process trusts the reset-at it last read for a pair, so that a Take
	// in an open window makes one round trip (incr) instead of two, and
	// the most that processes' clocks may be apart for the cache to answer
	// as the head would: the cache is not used in the last CacheFor of a
	// window (so not at all for windows of CacheFor or less). It also
	// bounds how long this process may keep counting in a window after the
	// head changed under it (see the package comment). Negative is an
	// error. default: 1s
	CacheFor time.Duration
	// CacheSize bounds the pairs whose reset-at is cached. Negative is an
	// error. default: 65536
	CacheSize int
	// NoCache reads the head on every call: two round trips per Take, and
	// never a stale window. default: false
	NoCache bool
	// ExpiryMargin is how long a window's items, and a state's item,
	// outlive its end, less up to a second (Memcached's clock counts whole
	// seconds); Memcached then drops them, only to reclaim memory. A call
	// finds the window open at its now as long as its flight (from its now
	// to the server: a stalled or starved process adds to it) is under
	// ExpiryMargin - 1s; a longer one may find it gone and open a fresh
	// window. Set it above the longest flight a call may have, such as a
	// Throttler's Timeout. Below 1s, which could drop a window before its
	// end, is an error. default: 2s
	ExpiryMargin time.Duration
	// Selector is the ServerSelector the client picks servers with, for a
	// Client that is not a *memcache.Client (a wrapper): the backend names
	// the server of each call (throttler.Traits.Store) and of each failure
	// from it, so that a Throttler's breaker covers one server. A
	// *memcache.Client needs none: the backend reads its own. default: the
	// servers of a *memcache.Client; for another Client, all its servers
	// are one store
	Selector memcache.ServerSelector
}

func (o *Options) withDefaults() (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	if r.Prefix == "" {
		r.Prefix = "throttlekit:"
	}
	if err := validPrefix(r.Prefix); err != nil {
		return r, err
	}
	if r.MaxAttempts < 0 {
		return r, fmt.Errorf("memcached: Options.MaxAttempts must be >= 0 (0: the default, 8), got %d", r.MaxAttempts)
	}
	if r.MaxAttempts == 0 {
		r.MaxAttempts = 8
	}
	if r.CacheFor < 0 {
		return r, fmt.Errorf("memcached: Options.CacheFor must be >= 0 (0: the default, 1s), got %v", r.CacheFor)
	}
	if r.Selector != nil {
		if err := nilness.Check("memcached: Options.Selector", r.Selector); err != nil {
			return r, err
		}
	}
	if r.ExpiryMargin != 0 && r.ExpiryMargin < time.Second {
		return r, fmt.Errorf("memcached: Options.ExpiryMargin must be 0 (the default, 2s) or at least 1s, Memcached's granularity, got %v", r.ExpiryMargin)
	}
	if r.ExpiryMargin == 0 {
		r.ExpiryMargin = defaultExpiryMargin
	}
	if r.CacheSize < 0 {
		return r, fmt.Errorf("memcached: Options.CacheSize must be >= 0 (0: the default, 65536), got %d", r.CacheSize)
	}
	if r.CacheFor == 0 {
		r.CacheFor = time.Second
	}
	if r.CacheSize == 0 {
		r.CacheSize = 65536
	}
	return r, nil
}

// Backend is a throttler.Backend storing fixed windows in Memcached. It is
// safe for concurrent use, by any number of processes sharing the servers.
type Backend struct {
	c    Client
	opts Options
	// servers is Options.Selector, else the ServerSelector inside a
	// *memcache.Client; nil when the servers cannot be seen. It names
	// each call's store (Traits.Store) and the server of each failure.
	servers memcache.ServerSelector
	cache   *headCache // with NoCache, a hint of the counter key only
	locks   stateLocks // one caller per state item at a time (algorithms.go)
	names   sync.Map   // server address → store name, so Store does not allocate
}

// New returns a Backend over c, usually a *memcache.Client whose Timeout
// bounds each call. Nil options mean defaults. A nil c, or an option that
// cannot work, is an error naming it; so is a client with no server (a
// *memcache.Client, or Options.Selector, that lists none), matching
// memcache.ErrNoServers: every call would fail. New dials nothing; Check
// verifies that the servers answer.
//
// A *memcache.Client whose MaxIdleConns is 0 gets 256: with
// gomemcache's default of 2, every call in flight beyond two dials a new
// connection and closes it after, and under load those dials time out and
// open a Throttler's breaker on a healthy server. New sets it before the
// client's first call, so build the Backend before using the client
// elsewhere; a non-zero MaxIdleConns is left as it is.
func New(c Client, opts *Options) (*Backend, error) {
	if err := nilness.Check("memcached: the Client", c); err != nil {
		return nil, err
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	servers, err := knownServers(c, o.Selector)
	if err != nil {
		return nil, err
	}
	if mc, ok := c.(*memcache.Client); ok && mc.MaxIdleConns == 0 {
		mc.MaxIdleConns = defaultIdleConns
	}
	ttl := o.CacheFor.Milliseconds()
	if o.NoCache {
		ttl = 0 // never trusted: remembered only to fetch the counter with the head
	}
	return &Backend{c: c, opts: o, servers: servers, cache: newHeadCache(o.CacheSize, ttl, o.CacheFor.Milliseconds())}, nil
}

// window is what the head says: the open window's reset-at, if any.
type window struct {
	open    bool
	resetAt int64 // Unix ms; valid when open
	item    *memcache.Item
	found   bool // the head exists (possibly ended): open with CAS, not Add
	cached  bool // from the cache, not read from the server by this call
	// counter is the open window's counter when it was fetched with the
	// head (nil: missing); valid when counted is true.
	counter *memcache.Item
	counted bool
}

// head returns the window the head names at now: from the cache when it can
// be trusted, else read from the server (and then cached if open).
func (b *Backend) head(ctx context.Context, k itemKeys, now time.Time) (window, error) {
	nowMs := now.UnixMilli()
	h, known := b.cache.get(k.head())
	if known && b.cache.trusted(h, nowMs) {
		return window{open: true, resetAt: h.resetAt, found: true, cached: true}, nil
	}
	w, err := b.readHead(ctx, k, now, h.resetAt, known && b.cache.needsFetch(h, nowMs))
	if err == nil && w.open {
		b.cache.put(k.head(), w.resetAt, nowMs, w.counted)
	}
	return w, err
}

// forget drops a cached head that the server contradicted.
func (b *Backend) forget(k itemKeys) { b.cache.drop(k.head()) }

// readHead gets the head and tells whether it names a window open at now.
// With a hint of the reset-at (the one this process last saw), it fetches
// that window's counter in the same round trip: incr does not count as an
// access for Memcached's LRU, a fetch does, so this keeps the counter of an
// active pair from being evicted as if it were idle. Once per CacheFor is
// enough for that, and gomemcache's multi-key get costs a goroutine, so the
// other reads get the head alone.
func (b *Backend) readHead(ctx context.Context, k itemKeys, now time.Time, hint int64, hinted bool) (window, error) {
	if err := ctx.Err(); err != nil {
		return window{}, fmt.Errorf("memcached: %w", err)
	}
	var it, counter *memcache.Item
	var err error
	if hinted {
		var items map[string]*memcache.Item
		items, err = b.c.GetMulti([]string{k.head(), k.counter(hint)})
		if err == nil {
			if it = items[k.head()]; it == nil {
				err = memcache.ErrCacheMiss
			}
			counter = items[k.counter(hint)]
		}
	} else {
		it, err = b.c.Get(k.head())
	}
	if errors.Is(err, memcache.ErrCacheMiss) {
		return window{}, nil
	}
	if err != nil {
		return window{}, fmt.Errorf("memcached: get window of %q: %w", k.id, err)
	}
	if it == nil {
		return window{}, fmt.Errorf("memcached: get window of %q: %w: no item and no error", k.id, ErrBadItem)
	}
	w, err := parseHead(k, it, now)
	if err == nil && hinted && w.resetAt == hint {
		w.counter, w.counted = counter, true
	}
	return w, err
}

// parseHead reads the head item it (nil: missing) as the window it names
// at now.
func parseHead(k itemKeys, it *memcache.Item, now time.Time) (window, error) {
	if it == nil {
		return window{}, nil
	}
	ms, err := strconv.ParseInt(string(bytes.TrimSpace(it.Value)), 10, 64)
	if err != nil {
		return window{}, fmt.Errorf("memcached: window of %q holds %q: %w", k.id, it.Value, ErrBadItem)
	}
	return window{open: ms > now.UnixMilli(), resetAt: ms, item: it, found: true}, nil
}

// readCount gets the counter of window w; a missing counter counts 0.
func (b *Backend) readCount(ctx context.Context, k itemKeys, w window) (int64, error) {
	if w.counted {
		if w.counter == nil {
			return 0, nil
		}
		return parseCount(k, w.counter)
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("memcached: %w", err)
	}
	it, err := b.c.Get(k.counter(w.resetAt))
	if errors.Is(err, memcache.ErrCacheMiss) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("memcached: get count of %q: %w", k.id, err)
	}
	if it == nil {
		return 0, fmt.Errorf("memcached: get count of %q: %w: no item and no error", k.id, ErrBadItem)
	}
	return parseCount(k, it)
}

// parseCount reads a counter item's value. Memcached pads a value that incr
// or decr shortened with spaces.
func parseCount(k itemKeys, it *memcache.Item) (int64, error) {
	n, err := strconv.ParseUint(string(bytes.TrimSpace(it.Value)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("memcached: count of %q holds %q: %w", k.id, it.Value, ErrBadItem)
	}
	return used(k, n)
}

// used converts a counter value, rejecting one no admitted count can reach.
func used(k itemKeys, n uint64) (int64, error) {
	if n > math.MaxInt64 {
		return 0, fmt.Errorf("memcached: count of %q is %d: %w", k.id, n, ErrBadItem)
	}
	return int64(n), nil
}

// resetTime is the stored reset-at as a time in now's location.
func resetTime(ms int64, now time.Time) time.Time {
	return time.UnixMilli(ms).In(now.Location())
}

// exptime is the relative expiry of an item of the window ending at
// resetAtMs, as seen at now, margin after it; 0 (no expiry) when Memcached
// would read it as an absolute time.
func exptime(resetAtMs int64, now time.Time, margin time.Duration) int32 {
	d := time.UnixMilli(resetAtMs).Sub(now) // saturates instead of wrapping
	if d > maxRelativeExptime*time.Second-margin {
		return 0
	}
	secs := (d + margin + time.Second - 1) / time.Second
	if secs < 1 {
		secs = 1
	}
	return int32(secs)
}

// Peek reports the state of key's window without counting.
func (b *Backend) Peek(ctx context.Context, key string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	d, err := b.peek(ctx, key, p, now)
	if err != nil {
		return d, b.classify(key, p, err)
	}
	return d, nil
}

func (b *Backend) peek(ctx context.Context, key string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	if p.Composite() {
		return b.composite(ctx, throttler.OpPeek, key, p, 1, now)
	}
	if err := throttler.ValidateCall(throttler.OpPeek, key, p, 1, time.Time{}); err != nil {
		return throttler.Decision{}, err
	}
	if p.Algorithm != throttler.FixedWindow {
		return b.apply(ctx, throttler.OpPeek, key, p, 1, time.Time{}, now)
	}
	k := newItemKeys(b.opts.Prefix, p, key)
	w, err := b.head(ctx, k, now)
	if err != nil {
		return throttler.Decision{}, err
	}
	var n int64
	var resetAt time.Time
	if w.open {
		if n, err = b.readCount(ctx, k, w); err != nil {
			return throttler.Decision{}, err
		}
		resetAt = resetTime(w.resetAt, now)
	}
	return algo.PeekState(p, n, resetAt, now), nil
}

// Refund gives cost units back to what the Take of receipt counted them in
// (see throttler.Backend), never below zero; for a fixed window, only to
// key's open window whose reset-at is receipt.
func (b *Backend) Refund(ctx context.Context, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
	d, err := b.refund(ctx, key, p, cost, receipt, now)
	if err != nil {
		return d, b.classify(key, p, err)
	}
	return d, nil
}

func (b *Backend) refund(ctx context.Context, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
	if err := throttler.ValidateCall(throttler.OpRefund, key, p, cost, receipt); err != nil {
		return throttler.Decision{}, err
	}
	if p.Algorithm != throttler.FixedWindow {
		return b.apply(ctx, throttler.OpRefund, key, p, cost, receipt, now)
	}
	k := newItemKeys(b.opts.Prefix, p, key)
	w, err := b.head(ctx, k, now)
	if err != nil {
		return throttler.Decision{}, err
	}
	if !w.open {
		return algo.PeekState(p, 0, time.Time{}, now), nil
	}
	var n int64
	if w.resetAt != receipt.UnixMilli() {
		// A later window (or one this Take never counted in): answer
		// as Peek does, counting nothing.
		if n, err = b.readCount(ctx, k, w); err != nil {
			return throttler.Decision{}, err
		}
		return algo.PeekState(p, n, resetTime(w.resetAt, now), now), nil
	}
	if err := ctx.Err(); err != nil {
		return throttler.Decision{}, fmt.Errorf("memcached: %w", err)
	}
	v, err := b.c.Decrement(k.counter(w.resetAt), uint64(cost))
	switch {
	case errors.Is(err, memcache.ErrCacheMiss):
		// Nothing counted (or evicted): nothing to give back.
	case err != nil:
		return throttler.Decision{}, fmt.Errorf("memcached: refund %q: %w", k.id, err)
	default:
		if n, err = used(k, v); err != nil {
			return throttler.Decision{}, err
		}
	}
	return algo.PeekState(p, n, resetTime(w.resetAt, now), now), nil
}

// Take counts cost units against key's window if they fit, opening a window
// when none is open. A denied Take counts nothing; see the package comment
// for the sequence of calls and what it can and cannot promise.
func (b *Backend) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	d, err := b.take(ctx, key, p, cost, now)
	if err != nil {
		return d, b.classify(key, p, err)
	}
	return d, nil
}

func (b *Backend) take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	if p.Composite() {
		return b.composite(ctx, throttler.OpTake, key, p, cost, now)
	}
	if err := throttler.ValidateCall(throttler.OpTake, key, p, cost, time.Time{}); err != nil {
		return throttler.Decision{}, err
	}
	if p.Algorithm != throttler.FixedWindow {
		return b.apply(ctx, throttler.OpTake, key, p, cost, time.Time{}, now)
	}
	k := newItemKeys(b.opts.Prefix, p, key)
	missing := int64(0) // the reset-at of a window whose counter this Take found missing
	for attempt := 0; attempt < b.opts.MaxAttempts; attempt++ {
		w, err := b.head(ctx, k, now)
		if err != nil {
			return throttler.Decision{}, err
		}
		if w.open {
			// The head, read after the counter was found missing, still
			// names its window: the counter is not yet added by the
			// window's opener, or was evicted, not expired (it outlives
			// its head), so adding it loses no units.
			confirmed := !w.cached && missing == w.resetAt
			d, err := b.count(ctx, k, p, cost, now, w.resetAt, false, confirmed)
			if errors.Is(err, errStale) {
				// The counter is gone: not yet added, evicted, or
				// expired while this call stalled (the head may have
				// moved on). Ask the head rather than add a counter
				// for a window that may have ended with its units.
				b.forget(k)
				missing = w.resetAt
				continue
			}
			return d, err
		}
		resetAt := now.Add(p.Window).UnixMilli()
		won, err := b.open(ctx, k, w, resetAt, now)
		if err != nil {
			return throttler.Decision{}, err
		}
		if won {
			b.cache.put(k.head(), resetAt, now.UnixMilli(), false)
			return b.count(ctx, k, p, cost, now, resetAt, true, false)
		}
	}
	return throttler.Decision{}, fmt.Errorf("%w: %q after %d attempts", ErrContention, k.id, b.opts.MaxAttempts)
}

// open points the head at a window ending at resetAtMs; it reports false when
// another process changed the head first.
func (b *Backend) open(ctx context.Context, k itemKeys, w window, resetAtMs int64, now time.Time) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("memcached: %w", err)
	}
	it := &memcache.Item{Key: k.head(), Value: strconv.AppendInt(nil, resetAtMs, 10), Expiration: exptime(resetAtMs, now, b.opts.ExpiryMargin)}
	var err error
	if w.found {
		it.CasID = w.item.CasID
		err = b.c.CompareAndSwap(it)
	} else {
		err = b.c.Add(it)
	}
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, memcache.ErrNotStored), errors.Is(err, memcache.ErrCASConflict), errors.Is(err, memcache.ErrCacheMiss):
		return false, nil
	default:
		return false, fmt.Errorf("memcached: open window of %q: %w", k.id, err)
	}
}

// errStale reports that count found the window's counter missing and may
// not add it: the caller reads the head again.
var errStale = errors.New("memcached: no counter")

// count adds cost to the counter of the open window ending at resetAtMs
// (steps 3 and 4 of the package comment). opened says this call opened the
// window, so the counter most likely does not exist yet and add comes
// first. confirmed says the head was read from the server after this Take
// found the counter missing, and still names this window. Only then may
// count add a missing counter, once; any other miss returns errStale. A
// window read before a stall may have ended, its items expired with its
// units, and a newer window opened: adding its counter again would count
// in a window that has already admitted its limit.
func (b *Backend) count(ctx context.Context, k itemKeys, p throttler.Policy, cost int64, now time.Time, resetAtMs int64, opened, confirmed bool) (throttler.Decision, error) {
	fresh, mayAdd := opened, opened || confirmed
	key := k.counter(resetAtMs)
	resetAt := resetTime(resetAtMs, now)
	denied := false // a denial is what is left when the attempts run out
	var d int64
	for attempt := 0; attempt <= b.opts.MaxAttempts; attempt++ {
		if err := ctx.Err(); err != nil {
			return throttler.Decision{}, fmt.Errorf("memcached: %w", err)
		}
		if fresh {
			mayAdd = false
			err := b.c.Add(&memcache.Item{Key: key, Value: strconv.AppendInt(nil, cost, 10), Expiration: exptime(resetAtMs, now, b.opts.ExpiryMargin)})
			if err == nil {
				return algo.WindowState(p, cost, resetAt, now, true), nil
			}
			if !errors.Is(err, memcache.ErrNotStored) {
				return throttler.Decision{}, fmt.Errorf("memcached: add count of %q: %w", k.id, err)
			}
			fresh = false
			continue
		}
		v, err := b.c.Increment(key, uint64(cost))
		if errors.Is(err, memcache.ErrCacheMiss) {
			if !mayAdd {
				return throttler.Decision{}, errStale
			}
			fresh = true
			continue
		}
		if err != nil {
			return throttler.Decision{}, fmt.Errorf("memcached: count %q: %w", k.id, err)
		}
		if v < uint64(cost) {
			// Wrapped around 2^64 (see MaxLimit): put the value back, adding
			// 2^64-cost, and give up rather than admit on a count near zero.
			_, _ = b.c.Increment(key, -uint64(cost))
			return throttler.Decision{}, fmt.Errorf("memcached: count of %q wrapped around: %w", k.id, ErrBadItem)
		}
		if v <= uint64(p.Limit) {
			return algo.WindowState(p, int64(v), resetAt, now, true), nil
		}
		// Overshoot: undo it, even if ctx is done.
		dv, err := b.c.Decrement(key, uint64(cost))
		switch {
		case errors.Is(err, memcache.ErrCacheMiss):
			dv = 0 // evicted in between: nothing is counted any more
		case err != nil:
			return throttler.Decision{}, fmt.Errorf("memcached: undo overshoot of %q (the window keeps %d units too many until it ends): %w", k.id, cost, err)
		}
		if d, err = used(k, dv); err != nil {
			return throttler.Decision{}, err
		}
		denied = true
		if d+cost > p.Limit {
			break
		}
		// The cost fits without the overshoot of concurrent Takes: try again.
	}
	if !denied {
		return throttler.Decision{}, fmt.Errorf("%w: counter of %q kept vanishing after %d attempts", ErrContention, k.id, b.opts.MaxAttempts)
	}
	return algo.WindowState(p, d, resetAt, now, false), nil
}

// store names the server that holds key's items under p, as the client
// picks it ("memcached 10.0.0.2:11211"; see throttler.Traits), or "" when
// the backend cannot see the servers. For a fixed window that is the head's
// server: a window's counter may live on another, and a failure there is
// blamed on that server (see classify). Every op reaches it.
func (b *Backend) store(_ throttler.Op, key string, p throttler.Policy) string {
	if b.servers == nil {
		return ""
	}
	return b.serverOf(b.homeItem(key, p))
}

// homeItem is the item every call on (p, key) reads first; for a
// composite, its first member's.
func (b *Backend) homeItem(key string, p throttler.Policy) string {
	if p.Composite() {
		p = firstMember(p)
	}
	k := newItemKeys(b.opts.Prefix, p, key)
	if p.Algorithm == throttler.FixedWindow {
		return k.head()
	}
	return k.state()
}

// serverOf names the server of an item, or "" if the selector has none.
func (b *Backend) serverOf(item string) string { return b.pick(b.servers, item) }

// pick names the server of sel that holds item, or "" if sel has none.
func (b *Backend) pick(sel memcache.ServerSelector, item string) string {
	addr, err := sel.PickServer(item)
	if err != nil {
		return ""
	}
	return b.serverName(addr.String())
}

func (b *Backend) serverName(addr string) string {
	if n, ok := b.names.Load(addr); ok {
		return n.(string)
	}
	n, _ := b.names.LoadOrStore(addr, "memcached "+addr)
	return n.(string)
}

// classify marks err, from a call on (p, key), as a server's failure
// (throttler.StoreFailure, naming the server it came from) or as the key's
// (throttler.ErrKeyState) when it is known to be either; anything else, a
// context's end included, is left as it is for the caller to judge.
func (b *Backend) classify(key string, p throttler.Policy, err error) error {
	return b.classifyAt(func() string { return b.homeItem(key, p) }, err)
}

// classifyAt is classify for a call whose first item home names (asked
// only when a failure is blamed on a server).
func (b *Backend) classifyAt(home func() string, err error) error {
	switch {
	case throttler.IsInputError(err), errors.Is(err, throttler.ErrKeyState), errors.Is(err, throttler.ErrUnavailable):
		return err
	case clientError(err):
		return throttler.KeyFailure(err)
	case serverFailure(err):
		return b.storeFailure(home, err)
	}
	return err
}

// failedServer names the server a failure came from: the address in a
// network error when it is one of the selector's servers (a call may reach
// two: a head and a counter), else the server of the call's first item.
func (b *Backend) failedServer(home func() string, err error) string {
	if b.servers == nil {
		return ""
	}
	return b.serverIn(b.servers, home, err)
}

// serverIn names the server of sel that a failure came from (see
// failedServer).
func (b *Backend) serverIn(sel memcache.ServerSelector, home func() string, err error) string {
	if addr := errAddr(err); addr != nil {
		known := false
		_ = sel.Each(func(a net.Addr) error {
			known = known || a.String() == addr.String()
			return nil
		})
		if known {
			return b.serverName(addr.String())
		}
	}
	return b.pick(sel, home())
}

// errAddr is the server address in a network error, or nil.
func errAddr(err error) net.Addr {
	var opErr *net.OpError
	var dialErr *memcache.ConnectTimeoutError
	switch {
	case errors.As(err, &opErr):
		return opErr.Addr
	case errors.As(err, &dialErr):
		return dialErr.Addr
	}
	return nil
}

// gomemcache reports what a server answered in the text of its errors; the
// innermost error of a chain is gomemcache's own, while the backend's
// wrappers around it name the key, which must never decide anything.
func innermost(err error) error {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err
		}
		err = next
	}
}

// clientError reports a CLIENT_ERROR reply: Memcached refused the command
// on this item (incr of a value that is not a number), not the connection.
func clientError(err error) bool {
	return strings.HasPrefix(innermost(err).Error(), "memcache: client error: ")
}

// serverFailure reports a failure of the server or of the way to it: a
// network error, a timeout, a SERVER_ERROR, a reply out of step with the
// protocol (the connection is then closed).
func serverFailure(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false // whose deadline it was is the caller's to say
	}
	var ne net.Error
	var dialErr *memcache.ConnectTimeoutError
	// ErrNoServers: a selector left with no server (a ServerList emptied
	// at run time, a client New could not see into) fails every call.
	if errors.As(err, &ne) || errors.As(err, &dialErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, memcache.ErrServerError) || errors.Is(err, memcache.ErrNoServers) {
		return true
	}
	// incr and decr read a SERVER_ERROR line as a number.
	var numErr *strconv.NumError
	if errors.As(err, &numErr) && strings.HasPrefix(numErr.Num, "SERVER_ERROR") {
		return true
	}
	msg := innermost(err).Error()
	return strings.Contains(msg, "SERVER_ERROR") ||
		strings.HasPrefix(msg, "memcache: unexpected ") || strings.HasPrefix(msg, "memcache: corrupt get result")
}
