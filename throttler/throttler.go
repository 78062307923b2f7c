package throttler

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit/internal/nilness"
)

// Source says which part of a Throttler made a decision.
type Source int

const (
	SourcePrimary     Source = iota // the primary backend answered
	SourceFallback                  // the primary failed and the fallback answered
	SourceFailureMode               // no backend answered: the failure mode (Options.FailClosed)
	SourceNone                      // bad input or a caller's cancelled context: no decision
)

func (s Source) String() string {
	names := [...]string{"primary", "fallback", "failure-mode", "none"}
	if s < 0 || int(s) >= len(names) {
		return fmt.Sprintf("Source(%d)", int(s))
	}
	return names[s]
}

// Observation describes one Throttler call, for metrics and alerts.
type Observation struct {
	Op  Op
	Key string
	// Policy is the rate policy of OpTake, OpPeek and OpRefund; Concurrency
	// the concurrency policy of OpAcquire and OpRelease.
	Policy      Policy
	Concurrency ConcurrencyPolicy
	Cost        int64
	Decision    Decision
	// Err is the primary backend's failure, reported even when the call was
	// answered by the fallback or failed open, so that it can raise an alert.
	Err error
	// Source is which part of the Throttler made the decision.
	Source Source
	// Store is the store the call went to, or would have gone to had its
	// breaker been closed, as the backend names it (see Traits.Store); "" for a
	// backend that is one store.
	Store string
	// Latency is the wall time the call took, fallback included.
	Latency time.Duration
}

// Options configure a Throttler. Nil options mean defaults.
type Options struct {
	// Clock is the one source of time for every window. default: time.Now
	Clock func() time.Time
	// Timeout bounds how long a call waits for the store, through the
	// context of each backend call: 0 (the default) or at least 1ms. A
	// shorter one is an error from New: no store answers in microseconds,
	// so every call would time out and fail open (a bare number such as
	// 100 is 100ns, not 100ms).
	//
	// It measures the wait for an answer, not the caller's time on a CPU.
	// An answer the backend has returned when the caller looks is used,
	// even if the Timeout has passed by then (a process starved of CPU or
	// paused by its GC looks late): it is never replaced by the fallback
	// or the failure mode, and it is no failure toward a breaker. Only a
	// call with no answer yet when the caller looks is a timeout. So a call
	// can return later than Timeout, by as long as its caller waited for a
	// CPU, with the store's answer or with the timeout. default: 100ms
	Timeout time.Duration
	// FailClosed says what a Throttler answers when its backend fails or
	// times out and no fallback answers either (its failure mode): false
	// (the default) fails open, allowing the call and marking the Decision
	// Degraded, since a dead store must not take the site down (Stripe's
	// choice); true fails closed, denying the call with an error matching
	// ErrUnavailable.
	FailClosed bool
	// Fallback, if set, answers while the primary fails: typically a memory
	// backend, so that limits keep holding per process during an outage.
	// Its Decisions are Degraded (Observe: SourceFallback). It counts each
	// policy's share (FallbackFleetSize), and once it answers a Take or a
	// Peek of a key under a policy it answers that key under that policy,
	// without calling the primary, until the state it counted has ended:
	// one store answers each window (docs/operations.md, "Fallback").
	// Observe sees such a call with no Err: the primary was not called.
	// default: none
	Fallback Backend
	// FallbackFleetSize is how many processes share each limit while they
	// answer from their fallbacks: the fallback counts a policy's Limit
	// and a token bucket's Burst divided by it, rounded down, never below
	// 1, so that a fleet in fallback admits about one limit, not one per
	// process. Set it to the number of processes a client's calls spread
	// over. It needs a Fallback. default: 1 (each process a whole limit)
	FallbackFleetSize int
	// BreakerThreshold is how many consecutive store failures of one store
	// make the Throttler skip that store for BreakerCooldown (its calls get
	// the fallback or the failure mode at once), so that an outage does not
	// cost every request a timeout. Calls already in flight when a run of
	// failures began count as one failure however many fail with it (a
	// store's blip, or this process starved of CPU past their deadline):
	// the rest of the run is counted in calls made after it began. There
	// is a breaker per store the backend names (Traits.Store: a Redis shard
	// or Cluster master, a Memcached server), so one failing store never
	// switches limiting off for keys on the others; a backend that names
	// none is one store.
	//
	// A store failure is an error or a timeout of the store itself:
	//   - this Throttler's Timeout expiring on the call (not the caller's
	//     context: a caller that gives up says nothing about the store);
	//   - a network error: a net.Error, io.EOF or io.ErrUnexpectedEOF, a
	//     refused, reset or broken connection;
	//   - an error matching ErrUnavailable, which is how backends mark the
	//     failures they know to be their store's (StoreFailure: a
	//     server loading, read-only, out of memory).
	// Nothing else counts: not bad input, not one key's bad state (an
	// error matching ErrKeyState, such as a corrupt item, never
	// counts whatever it wraps), not a full in-process table
	// (memory.ErrFull), not contention on one key, not MaxDetached being
	// reached. Such a call still gets the fallback or the failure mode,
	// and Observe sees its error, but it never trips a breaker. default: 5
	BreakerThreshold int
	// BreakerCooldown is how long a store is skipped once its breaker
	// opens, on the monotonic clock of the process (never on Clock, which
	// may step). When it ends, exactly one call (the probe) tries the
	// store; the others keep skipping it until the probe succeeds (the
	// breaker closes) or fails (another cooldown). default: 1s
	BreakerCooldown time.Duration
	// Detach runs each primary backend call on a goroutine of its own and stops
	// waiting for it at Timeout, so that a client that ignores its context
	// (gomemcache, go-redis's AutoPipeliner) cannot hold a request longer.
	// An abandoned call finishes in the background, bounded by the client's
	// own timeouts; at most MaxDetached run at once, beyond which calls fail
	// at once. It costs a goroutine and a channel per call. The fallback,
	// meant to be in-process, is always called inline. A primary that says
	// its calls may outlive their context (Traits.IgnoresContext:
	// the Memcached backend, the Redis backend over an AutoPipeliner, and
	// wrappers of either) is always detached: without it, a killed or
	// stalled store holds requests for as long as the client's own timeouts
	// and retries add up to. default: false
	Detach bool
	// MaxDetached bounds the abandoned calls still running. default: 1024
	MaxDetached int
	// Observe, if set, is called after every call, synchronously: keep it
	// fast. default: none
	Observe func(Observation)
}

// minTimeout is the shortest Options.Timeout: below it a store call cannot
// answer, so a shorter Timeout is a unit slip (100 for 100ms), never a choice.
const minTimeout = time.Millisecond

// withDefaults validates o and fills in the defaults. Negative numbers and
// unknown modes are errors: a misconfigured Throttler must fail when it is
// built, never turn into "allow everything" at call time.
func (o *Options) withDefaults() (Options, error) {
	var out Options
	if o != nil {
		out = *o
	}
	switch {
	case out.Timeout < 0:
		return out, fmt.Errorf("throttler: Options.Timeout must be >= 0, got %v", out.Timeout)
	case out.Timeout > 0 && out.Timeout < minTimeout:
		return out, fmt.Errorf("throttler: Options.Timeout must be 0 (the default, 100ms) or at least %v, got %v: every call would time out and fail open (a duration counts nanoseconds)", minTimeout, out.Timeout)
	case out.BreakerThreshold < 0:
		return out, fmt.Errorf("throttler: Options.BreakerThreshold must be >= 0, got %d", out.BreakerThreshold)
	case out.BreakerCooldown < 0:
		return out, fmt.Errorf("throttler: Options.BreakerCooldown must be >= 0, got %v", out.BreakerCooldown)
	case out.MaxDetached < 0:
		return out, fmt.Errorf("throttler: Options.MaxDetached must be >= 0, got %d", out.MaxDetached)
	case out.Fallback != nil && nilness.IsNil(out.Fallback):
		return out, fmt.Errorf("throttler: Options.Fallback is a nil %T", out.Fallback)
	case out.FallbackFleetSize < 0:
		return out, fmt.Errorf("throttler: Options.FallbackFleetSize must be >= 0, got %d", out.FallbackFleetSize)
	case out.FallbackFleetSize > 1 && out.Fallback == nil:
		return out, fmt.Errorf("throttler: Options.FallbackFleetSize is %d but there is no Options.Fallback to share", out.FallbackFleetSize)
	}
	if out.Clock == nil {
		out.Clock = time.Now
	}
	if out.Timeout == 0 {
		out.Timeout = 100 * time.Millisecond
	}
	if out.BreakerThreshold == 0 {
		out.BreakerThreshold = 5
	}
	if out.BreakerCooldown == 0 {
		out.BreakerCooldown = time.Second
	}
	if out.MaxDetached == 0 {
		out.MaxDetached = 1024
	}
	if out.FallbackFleetSize == 0 {
		out.FallbackFleetSize = 1
	}
	return out, nil
}

// Throttler applies policies to keys over a Backend. It owns the clock, the
// per-call timeout and what happens when the backend fails. It is safe for
// concurrent use; most callers want Allow (or package httplimit, for HTTP).
// The zero value has no backend: build one with New (a zero or nil
// Throttler answers every call with an error, never a panic).
type Throttler struct {
	backend Backend
	opts    Options
	// store names the store of each rate call, leaseStore of each lease
	// call (the backend's Traits); nil: the backend is one store (for that
	// kind of call).
	store      func(op Op, key string, p Policy) string
	leaseStore func(key string, p ConcurrencyPolicy) string
	// route names the store of each rate call and the backend that makes
	// it (the backend's Traits.Route); nil: store names it, b makes it.
	route func(b Backend, op Op, key string, p Policy) (string, Backend)
	// primary is the backend, fallback Options.Fallback (b nil without one).
	primary, fallback target
	// stints are the keys the fallback answers (nil without one).
	stints *stints

	// wallClock: Options.Clock is time.Now (the default).
	wallClock bool
	// composites: the backend, and the fallback if any, take composite
	// policies (Traits.Composites).
	composites bool

	breakersState
	detached atomic.Int64 // detached calls still running
	// callContext derives a backend call's context, ending at Timeout:
	// context.WithTimeout (tests replace it to choose when it ends).
	callContext func(context.Context, time.Duration) (context.Context, context.CancelFunc)
	// wait is the world Wait runs in (realWait; tests replace it).
	wait waitEnv
	// lanes queues the Wait callers of each key and policy.
	lanes laneSet
}

// target is a backend as the Throttler calls it.
type target struct {
	b Backend
	// lb is b as a LeaseBackend; nil when b holds no leases (see
	// Traits.Leases).
	lb LeaseBackend
	// local: b is in process (Traits), called without a timeout context.
	// detach: its calls run detached (Options.Detach, or a backend that
	// ignores its context; never the fallback).
	local, detach bool
}

// New returns a Throttler over b. Nil options mean defaults. It returns an
// error naming the problem for a nil backend and for options that cannot
// work (a negative duration or count, a Timeout under 1ms).
func New(b Backend, opts *Options) (*Throttler, error) {
	if b == nil {
		return nil, errors.New("throttler: New needs a backend, got nil")
	}
	if nilness.IsNil(b) {
		return nil, fmt.Errorf("throttler: New needs a backend, got a nil %T", b)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	t := &Throttler{backend: b, opts: o, wallClock: opts == nil || opts.Clock == nil}
	tr := declaredTraits(b)
	t.store, t.leaseStore, t.route = tr.Store, tr.LeaseStore, tr.Route
	epoch := time.Now()
	t.mono = func() time.Duration { return time.Since(epoch) }
	t.wait = realWait()
	t.callContext = context.WithTimeout
	t.primary = target{b: b, lb: leasesOf(b, tr), local: tr.InProcess, detach: o.Detach || tr.IgnoresContext}
	if o.Fallback != nil {
		ft := declaredTraits(o.Fallback)
		t.fallback = target{b: o.Fallback, lb: leasesOf(o.Fallback, ft), local: ft.InProcess}
		t.stints = new(stints)
	}
	t.composites = tr.Composites && (o.Fallback == nil || declaredTraits(o.Fallback).Composites)
	return t, nil
}

// errNotBuilt answers calls on a Throttler that New did not build.
var errNotBuilt = errors.New("throttler: Throttler has no backend; build one with New")

// Allow takes one unit from key's window under p.
func (t *Throttler) Allow(ctx context.Context, key string, p Policy) (Decision, error) {
	return t.do(ctx, OpTake, key, p, 1)
}

// AllowN takes n units from key's window under p, all or none.
func (t *Throttler) AllowN(ctx context.Context, key string, p Policy, n int64) (Decision, error) {
	return t.do(ctx, OpTake, key, p, n)
}

// Peek reports key's window under p without counting.
func (t *Throttler) Peek(ctx context.Context, key string, p Policy) (Decision, error) {
	return t.do(ctx, OpPeek, key, p, 1)
}

// Refund gives n units back to what counted them, for work that turned out
// free (a 304 Not Modified, a request never sent). taken is the Decision of
// the Take that took them (Allow, AllowN, Wait or WaitN): the units go back
// only while what counted them is still current, so that a refund never
// credits a later window with units the earlier one counted (20 admitted
// against a limit of 10, when 304s finished after their window ended).
// Nothing is refunded, and the error matches ErrNotRefunded, when
//   - taken was denied, or would have been (WouldDeny): it counted nothing;
//   - taken is Degraded: the fallback or the failure mode admitted it, and
//     the primary store's count never held the units;
//   - the Throttler's clock has reached taken.ResetAt: the fixed window
//     or the sliding-window counter's window that counted the units has
//     ended, the token bucket is full again (the units came back by
//     refill), or the sliding log's entries of that instant have ended.
//
// Otherwise the store gets taken.ResetAt as the refund's receipt and gives
// the units back only to the state that counted them (see Backend), so a
// process whose clock runs ahead and opened the next window early never
// has that window credited. A sliding log refunds from its entries logged
// no later than the Take's, newest first: the Take's own unless a clock
// behind logged one of the same or an earlier ms after it.
func (t *Throttler) Refund(ctx context.Context, key string, p Policy, n int64, taken Decision) (Decision, error) {
	if t == nil || t.backend == nil {
		return Decision{}, errNotBuilt
	}
	if p.all != nil {
		return t.refundComposite(ctx, key, p, n, taken)
	}
	var r request // filled in place, as in do
	r.op, r.key, r.p, r.n, r.receipt = OpRefund, key, p, n, taken.ResetAt
	t.start(&r)
	if why := unrefundable(taken, r.now); why != "" {
		// Bad input is still reported as such, whatever the take was.
		err := r.validate()
		if err == nil {
			err = fmt.Errorf("%w: %s", ErrNotRefunded, why)
		}
		return t.refuse(&r, err)
	}
	if p.enforce != nil {
		return t.doEnforced(ctx, &r)
	}
	return t.doAt(ctx, &r)
}

func (t *Throttler) do(ctx context.Context, op Op, key string, p Policy, n int64) (Decision, error) {
	if t == nil || t.backend == nil {
		return Decision{}, errNotBuilt
	}
	// Filled in place: a composite literal is built aside and copied, and
	// the copy's loads of what was just stored cost more than the fields.
	var r request
	r.op, r.key, r.p, r.n = op, key, p, n
	t.start(&r)
	if p.enforce != nil {
		return t.doEnforced(ctx, &r)
	}
	return t.doAt(ctx, &r)
}

// unrefundable says why the units of taken cannot be refunded at now, or "".
func unrefundable(taken Decision, now time.Time) string {
	switch {
	case !taken.Allowed:
		return "the take was denied, so it counted nothing"
	case taken.WouldDeny:
		return "the take would have been denied (dry run), so it counted nothing"
	case taken.Degraded:
		return "the take was answered by the fallback or the failure mode, not counted by the store"
	case !now.Before(taken.ResetAt):
		return fmt.Sprintf("what counted the units ended at %v", taken.ResetAt)
	}
	return ""
}

// start reads the clock for r.
func (t *Throttler) start(r *request) {
	r.now = t.opts.Clock()
	if t.opts.Observe != nil {
		if t.wallClock {
			r.started = r.now // time.Now: it carries the monotonic reading
		} else {
			r.started = time.Now()
		}
	}
}

// doAt decides the rate operation r at r.now and observes it: run, written
// out, one frame less on every rate call's path.
func (t *Throttler) doAt(ctx context.Context, r *request) (Decision, error) {
	if r.p.all != nil && !t.composites {
		return t.refuseComposite(r)
	}
	store := t.storeOf(r)
	d, src, primaryErr, err := t.decide(ctx, r, store, SourcePrimary)
	d.At = r.now
	if t.opts.Observe != nil {
		if primaryErr == nil {
			primaryErr = err
		}
		t.observe(r, store, d, src, primaryErr)
	}
	return d, err
}

// request is one call through the Throttler: a rate operation (OpTake,
// OpPeek, OpRefund) of n units under p, or a lease operation (OpAcquire,
// OpRelease) of lease id under cp. Every operation takes the one path of
// run, decide, call and dispatch, which pass it by pointer.
type request struct {
	op  Op
	key string
	p   Policy
	n   int64
	// receipt is a Refund's: the ResetAt of the Take that counted the units.
	receipt time.Time
	cp      ConcurrencyPolicy
	id      LeaseID
	// now is the instant of the call, read from Options.Clock once.
	now time.Time
	// started is when the call started, for Observe's Latency: now itself
	// under the default clock (a second reading of the clock would cost
	// more than everything an observer adds), time.Now under another.
	started time.Time
	// held is a Release's answer, set by dispatch: carried here rather
	// than returned, so that no rate call pays for passing it back.
	held bool
	// to makes the primary's call in its place when set (Traits.Route).
	to Backend
	// stint: the fallback holds the key under p (see stints), so it
	// answers without a call to the primary.
	stint bool
}

// isLease reports whether r is a LeaseBackend's operation.
func (r *request) isLease() bool { return r.op == OpAcquire || r.op == OpRelease }

// validate reports why r cannot be made, as the backend would. A Refund's
// receipt is not the caller's input but its Take's ResetAt, which Refund
// judges itself (unrefundable): r.now stands in for it, so that a Take
// whose Decision names no window is ErrNotRefunded, not ErrInvalidReceipt.
func (r *request) validate() error {
	if r.isLease() {
		return ValidateLease(r.key, r.cp, r.id)
	}
	return ValidateCall(r.op, r.key, r.p, r.n, r.now)
}

// run decides r, starting at from (SourcePrimary, or SourceFallback for the
// release of a lease the fallback granted), and observes it.
func (t *Throttler) run(ctx context.Context, r *request, store string, from Source) (Decision, Source, error) {
	t.start(r)
	d, src, primaryErr, err := t.decide(ctx, r, store, from)
	d.At = r.now
	if t.opts.Observe != nil {
		if primaryErr == nil {
			primaryErr = err
		}
		t.observe(r, store, d, src, primaryErr)
	}
	return d, src, err
}

// observe calls Options.Observe. It stays out of line, and so does the
// Observation, off the path of a Throttler that observes nothing.
//
//go:noinline
func (t *Throttler) observe(r *request, store string, d Decision, src Source, err error) {
	o := Observation{Op: r.op, Key: r.key, Decision: d, Err: err, Source: src, Store: store}
	o.Latency = time.Since(r.started)
	if r.isLease() {
		o.Concurrency = r.cp
	} else {
		o.Policy, o.Cost = r.p, r.n
	}
	t.opts.Observe(o)
}

// decide returns the decision, who made it, the primary's failure (if any)
// and the error for the caller; a Release's answer is left in r.held.
//
// The primary validates the input itself (every Backend does, once per
// call, however many wrappers it passes through); the Throttler validates
// only when the primary does not answer, so that bad input never reaches the
// fallback or the failure mode, which would allow it.
//
// The call goes to the primary unless the breaker of its store is open; only
// a failure of the store itself counts toward that breaker (see
// Options.BreakerThreshold), and a failure the backend blames on another of
// its stores counts toward that one's.
//
// A Take or a Peek of a key the fallback holds (see stints) skips the
// primary and its breaker: the fallback answers it, under the policy's
// share (callFallback). So does one that the primary answered while
// another call of the key, in flight beside it, fell back: what the
// primary counted ends before the fallback's stint does.
//
// The fallback answers rate operations, and Acquire if it holds leases. A
// Release goes where its lease was granted: from is SourceFallback for a
// lease of the fallback's, and a lease of the primary's is never released
// to the fallback, which does not hold it.
func (t *Throttler) decide(ctx context.Context, r *request, store string, from Source) (Decision, Source, error, error) {
	now := r.now
	var primaryErr error
	r.stint = from == SourcePrimary && t.stints.holds(r)
	if from == SourcePrimary && !r.stint {
		br := t.breakerFor(store)
		if ok, probe := br.admit(t.mono); ok {
			started := br.started(t.mono)
			d, timedOut, err := t.call(ctx, &t.primary, r, now)
			switch {
			case err == nil:
				br.succeeded(probe)
				if r.stint = t.stints.holds(r); !r.stint {
					return d, SourcePrimary, nil, nil
				}
				// Another call of the key fell back while this one was in
				// flight: the fallback answers the key from now on.
			case IsInputError(err) || ctx.Err() != nil:
				// Neither is the store's fault: a backend refusing the key
				// (e.g. too long for it), or a caller that gave up.
				br.inconclusive(probe)
				return Decision{}, SourceNone, nil, err
			default:
				t.record(br, probe, started, store, err, timedOut)
				primaryErr = err
			}
		} else {
			primaryErr = t.skipped(store)
		}
	}
	if from == SourcePrimary {
		if err := r.validate(); err != nil {
			return Decision{}, SourceNone, nil, err
		}
	}
	if t.fallback.b != nil && (from == SourceFallback || r.op != OpRelease && (!r.isLease() || t.fallback.lb != nil)) {
		r.to = nil // the primary's route
		d, err := t.callFallback(ctx, r)
		if err == nil {
			return d, SourceFallback, primaryErr, nil
		}
		if from == SourceFallback && (IsInputError(err) || ctx.Err() != nil) {
			return Decision{}, SourceNone, nil, err
		}
		primaryErr = errors.Join(primaryErr, fmt.Errorf("fallback: %w", err))
	}
	d := t.failureMode(r)
	if d.Allowed {
		return d, SourceFailureMode, primaryErr, nil
	}
	if !errors.Is(primaryErr, ErrUnavailable) {
		primaryErr = fmt.Errorf("%w: %w", ErrUnavailable, primaryErr)
	}
	return d, SourceFailureMode, primaryErr, primaryErr
}

// failureMode is the decision of the failure mode (Options.FailClosed) for
// r, made without any store.
// Its Limit is what a store's Decision says (a token bucket's capacity, as
// the algorithm's Decision reports it), so X-RateLimit-Limit does not
// change while the store is down.
func (t *Throttler) failureMode(r *request) Decision {
	limit := r.p.Capacity()
	if r.isLease() {
		limit = r.cp.Limit
	}
	return Decision{Allowed: !t.opts.FailClosed, Limit: limit, Degraded: true}
}

// record counts a failed primary call toward the breaker it concerns: br,
// the call's store's, or the breaker of the store the backend blamed.
//
//go:noinline
func (t *Throttler) record(br *breaker, probe bool, started int64, store string, err error, timedOut bool) {
	if !isStoreFailure(err, timedOut) {
		br.inconclusive(probe)
		return
	}
	if name := failedStore(err); name != "" && name != store {
		br.inconclusive(probe) // the call's own store did not fail
		// started was read from the call's own breaker: a failure blamed
		// on another store counts toward its run, as any failure did.
		br, probe, started = t.breakerFor(name), false, int64(t.mono())
	}
	br.failed(probe, started, t.mono, int64(t.opts.BreakerThreshold), t.opts.BreakerCooldown)
}

// skipped is the primary's error for a call whose store's breaker is open.
func (t *Throttler) skipped(store string) error {
	if store == "" {
		store = "the backend"
	}
	return fmt.Errorf("%w: %s skipped: its breaker opened after %d consecutive store failures (cooldown %v)",
		ErrUnavailable, store, t.opts.BreakerThreshold, t.opts.BreakerCooldown)
}

// call runs r on tg, under the Timeout unless tg is in process; timedOut
// says that this Throttler's own deadline expired.
func (t *Throttler) call(ctx context.Context, tg *target, r *request, now time.Time) (d Decision, timedOut bool, err error) {
	if tg.local {
		d, err = dispatch(ctx, tg, r, now)
		return d, false, err
	}
	ctx, cancel := t.callContext(ctx, t.opts.Timeout)
	defer cancel()
	if !tg.detach {
		d, err = dispatch(ctx, tg, r, now)
		return d, err != nil && ctx.Err() == context.DeadlineExceeded, err
	}
	return t.detachedCall(ctx, tg, r, now)
}

// detachedCall runs r on tg on a goroutine of its own and stops waiting
// when ctx ends (see Options.Detach). It allocates, so it stays apart from
// call, whose other paths allocate nothing.
func (t *Throttler) detachedCall(ctx context.Context, tg *target, r *request, now time.Time) (d Decision, timedOut bool, err error) {
	if t.detached.Add(1) > int64(t.opts.MaxDetached) {
		t.detached.Add(-1)
		return Decision{}, false, fmt.Errorf("%w (%d)", errTooManyDetached, t.opts.MaxDetached)
	}
	type result struct {
		d    Decision
		held bool
		err  error
	}
	done := make(chan result, 1) // buffered: an abandoned call never blocks
	// The goroutine gets a copy of r: the caller's may be gone when it ends.
	go func(r request) {
		defer t.detached.Add(-1)
		d, err := dispatch(ctx, tg, &r, now)
		done <- result{d, r.held, err}
	}(*r)
	var res result
	select {
	case res = <-done:
	case <-ctx.Done():
		// Both may be ready when the caller gets the CPU back, and select
		// picks at random: an answer already there is the answer.
		select {
		case res = <-done:
		default:
			return Decision{}, ctx.Err() == context.DeadlineExceeded, fmt.Errorf("%w: no answer from the backend: %w", ErrUnavailable, ctx.Err())
		}
	}
	r.held = res.held
	return res.d, res.err != nil && ctx.Err() == context.DeadlineExceeded, res.err
}

// dispatch calls tg's method for r's op, one of the Throttler's own five.
func dispatch(ctx context.Context, tg *target, r *request, now time.Time) (Decision, error) {
	b := tg.b
	if r.to != nil {
		b = r.to
	}
	switch r.op {
	case OpPeek:
		return b.Peek(ctx, r.key, r.p, now)
	case OpRefund:
		return b.Refund(ctx, r.key, r.p, r.n, r.receipt, now)
	case OpAcquire, OpRelease:
		return dispatchLease(ctx, tg, r, now)
	}
	return b.Take(ctx, r.key, r.p, r.n, now)
}

// dispatchLease is dispatch for the lease operations, out of line so that
// the rate operations' frame stays as small as it was before leases.
//
//go:noinline
func dispatchLease(ctx context.Context, tg *target, r *request, now time.Time) (d Decision, err error) {
	if tg.lb == nil {
		return Decision{}, fmt.Errorf("%w: %T", ErrLeasesUnsupported, tg.b)
	}
	if r.op == OpAcquire {
		return tg.lb.Acquire(ctx, r.key, r.cp, r.id, now)
	}
	r.held, d, err = tg.lb.Release(ctx, r.key, r.cp, r.id, now)
	return d, err
}
