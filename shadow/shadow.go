// Package shadow serves every call from a control backend and mirrors it, in the background, to a
// candidate backend, comparing the two decisions: the "shadow" stage of a migration between stores,
// after github/scientist.
//
// The caller always gets the control's decision and error. The mirrored call (same key, policy,
// cost and now) waits in a bounded queue for a worker; a slow, failing or dead candidate fills the
// queue and further calls are dropped and counted, so it never slows or fails the control path.
// Every comparison becomes a Result, summed in Stats and passed to Options.Publish on the shadow's
// own goroutines, never on a caller's; Flush waits until everything mirrored so far has been
// compared and published.
//
// Calls for one key reach the candidate in the order the control answered them, as far as that
// order is known: each call is queued after its control call returns, so two concurrent calls for
// one key may be queued in either order (their totals agree), and calls of other processes reach
// the candidate in yet another order than the control: differences that such reordering explains
// are their own kind, Reordered, not mismatches (see Options.ReorderSpan), and so are those
// explained once the control's own delay is counted, Late. Candidate calls run
// under the Backend's own context, not the caller's, which ends with the request.
package shadow

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/internal/leaseop"
	"github.com/throttlekit/throttlekit/internal/nilness"
	"github.com/throttlekit/throttlekit/throttler"
)

// The shadow's own errors, unexported: a timeout matches context.DeadlineExceeded (see
// Result.CandidateErr), a panicking candidate is a bug read in the message, and Flush after
// Close is the caller's doing.
var (
	errCandidatePanic = errors.New("shadow: candidate panicked")
	// errNotSent is a Dropped call's CandidateErr when an earlier call of its batch timed out
	// (see Options.Timeout). One value for every such call: a dead candidate makes them many.
	errNotSent = fmt.Errorf("shadow: candidate call not sent: an earlier call queued with it "+
		"timed out: %w", context.DeadlineExceeded)
	// errClosed is Flush's error after Close: Close has compared, dropped or given up on every
	// call, so there is nothing left to wait for.
	errClosed = errors.New("shadow: flush after Close")
)

// Options configure a Backend. The zero value (or nil) means defaults; a negative number is an
// error.
type Options struct {
	// Workers is how many goroutines call the candidate. Calls for one key always go to the
	// same worker, in order. A network candidate needs several: each worker makes one call at a
	// time. default: 8
	Workers int
	// QueueSize is how many mirrored calls may wait for each worker; when its queue is full a
	// call is dropped (a Result of kind Dropped). A worker also holds the batch it is working
	// through, so at most 2*Workers*QueueSize calls are held in all, and with Publish as many
	// drops again may wait for it (see Publish). default: 1024
	QueueSize int
	// Timeout bounds each candidate call, through its context's deadline (the calls to an
	// in-process candidate share a context while at least about 7/8 of Timeout is left of it).
	// A call that fails once the deadline has passed is a CandidateError matching
	// context.DeadlineExceeded. The worker waits for a candidate that may block (one that is
	// not throttler.InProcess) no longer than the deadline: a call still running then is
	// abandoned, counted as a timeout, and left to return on its own; the worker sends the
	// candidate nothing more until it has returned, and waits for that at most Timeout per
	// batch. After a timeout, the rest of the calls the worker took with it, all queued before
	// it timed out, are not sent: they are Dropped, their CandidateErr matching
	// context.DeadlineExceeded. So a dead candidate costs each worker about one Timeout per
	// batch of calls it takes, not one per call: every call is accounted within about twice
	// Timeout of being queued, however the keys fall on the workers, and Flush returns. A
	// Timeout below 1ms is an error (Timeout: 100 is 100ns, a unit slip). default: 100ms
	Timeout time.Duration
	// DrainTimeout is how long Close lets the workers finish the queued calls before it cancels
	// the calls in flight and drops the rest. default: 1s
	DrainTimeout time.Duration
	// UsedTolerance is how far Used and Remaining may differ before a pair counts as
	// UsedDiffers. default: 0, exact
	UsedTolerance int64
	// ResetAtTolerance is how far ResetAt, or RetryAfter, may differ before a pair counts as
	// ResetAtDiffers, or RetryAfterDiffers. Stores keep milliseconds, so a finer tolerance
	// would flag their rounding. default: 1ms
	ResetAtTolerance time.Duration
	// ReorderSpan and ReorderUnits bound the differences counted as Reordered rather than as
	// mismatches. A pair of a Take, Peek or Refund whose decisions differ is Reordered when
	// ReorderSpan is set and
	//   - both stores answered the same Limit, and
	//   - either the call's now is within ReorderSpan of the earlier of the two ResetAts (one
	//     store may have counted it, or calls before it, in the window that the other had
	//     already ended and replaced): then ResetAt and RetryAfter differ by at most Window +
	//     ReorderSpan, and Used by anything;
	//   - or Used (counted up to the Limit: units beyond it were never admitted) and Remaining
	//     differ by at most ReorderUnits, and ResetAt and RetryAfter by at most ReorderSpan (a
	//     fixed window's was opened by another of the calls within the span), plus, for the
	//     other algorithms, the time ReorderUnits units take to refill or age out
	//     (Window·ReorderUnits/Limit, at most Window).
	// The shadow adds each call's own lag (Result.Lag) to the span. Set ReorderSpan to the
	// spread of the processes' clocks plus how much longer another process's mirror may lag
	// than this one's (a window one store opened while a mirror lagged stays offset while the
	// key stays busy), and ReorderUnits to the most units of one key that all processes can
	// have counted in one store and not yet in the other: the requests one key can have in
	// flight at once across the processes, times their cost, plus what the key is admitted
	// within the mirror's lag. docs/migration.md explains the choice. A difference outside
	// these bounds (a different Limit, a window lost mid-way, counts further apart) stays a
	// mismatch. A composite's pair (throttler.All) is Reordered when each member whose answers
	// differ is, under its own policy; in a Take, a member of a denied composite that would
	// have admitted is compared as its own Take would have answered. A pair outside the bounds
	// with its Lag but within them with its Elapsed (the control answered late) is Late, not a
	// mismatch either. default: 0, nothing is Reordered or Late
	ReorderSpan time.Duration
	// ReorderUnits: see ReorderSpan. default: 0
	ReorderUnits int64
	// Ignore, if set, is asked about every pair whose decisions differ; returning true marks a
	// known, accepted difference: the Result is published with Ignored set and not counted as a
	// mismatch. It runs on a worker goroutine. A panic in it is recovered, counted in
	// Stats.IgnorePanics, and the difference is not ignored. default: nil, nothing ignored
	Ignore func(Result) bool
	// Publish, if set, receives every Result: matches, differences, candidate errors and drops.
	// It runs on the shadow's own goroutines, never on a caller's, so it must be safe for
	// concurrent use: the workers pass it their comparisons, and one publishing goroutine the
	// drops, which wait for it in a queue of QueueSize per worker; a drop that finds that queue
	// full is counted in Stats.PublishDropped instead. A slow Publish slows the workers, whose
	// queues then fill and drop calls (Dropped), so it should still be quick. A panic in it is
	// recovered and counted in Stats.PublishPanics. default: nil
	Publish func(Result)
	// Enabled, if set, is asked on every call whether to mirror it; false serves from the
	// control alone and records nothing. It runs on the control path, so it must be cheap (an
	// atomic load). default: nil, always mirror
	Enabled func() bool
	// KeepMismatches is how many of the latest mismatches Stats returns. default: 100
	KeepMismatches int
}

// minTimeout is the shortest Options.Timeout New accepts: a shorter one is most likely a unit slip
// (Timeout: 100 is 100ns).
const minTimeout = time.Millisecond

// withDefaults returns o with its zero fields set to their defaults, or an error naming the first
// negative field, as "Field is …" (New adds "shadow: Options.", package migration "migration:
// Options.Forward.").
func (o *Options) withDefaults() (Options, error) {
	var out Options
	if o != nil {
		out = *o
	}
	neg := func(field string, v any, def string) (Options, error) {
		return out, fmt.Errorf("%s is %v; want 0 (default %s) or more", field, v, def)
	}
	switch {
	case out.Workers < 0:
		return neg("Workers", out.Workers, "8")
	case out.QueueSize < 0:
		return neg("QueueSize", out.QueueSize, "1024")
	case out.Timeout < 0:
		return neg("Timeout", out.Timeout, "100ms")
	case out.Timeout > 0 && out.Timeout < minTimeout:
		// Timeout: 100 is 100ns, not 100ms: every candidate call would time out, and the
		// shadow would compare nothing.
		return out, fmt.Errorf("%s is %v; want 0 (default 100ms) or at least %v: no store answers sooner", "Timeout", out.Timeout, minTimeout)
	case out.DrainTimeout < 0:
		return neg("DrainTimeout", out.DrainTimeout, "1s")
	case out.UsedTolerance < 0:
		return neg("UsedTolerance", out.UsedTolerance, "0, exact")
	case out.ResetAtTolerance < 0:
		return neg("ResetAtTolerance", out.ResetAtTolerance, "1ms")
	case out.ReorderSpan < 0:
		return neg("ReorderSpan", out.ReorderSpan, "0, nothing reordered")
	case out.ReorderUnits < 0:
		return neg("ReorderUnits", out.ReorderUnits, "0")
	case out.KeepMismatches < 0:
		return neg("KeepMismatches", out.KeepMismatches, "100")
	}
	if out.Workers == 0 {
		out.Workers = 8
	}
	if out.QueueSize == 0 {
		out.QueueSize = 1024
	}
	if out.Timeout == 0 {
		out.Timeout = 100 * time.Millisecond
	}
	if out.DrainTimeout == 0 {
		out.DrainTimeout = time.Second
	}
	if out.ResetAtTolerance == 0 {
		out.ResetAtTolerance = time.Millisecond
	}
	if out.KeepMismatches == 0 {
		out.KeepMismatches = 100
	}
	return out, nil
}

// A worker that finds its queue empty naps this long, up to maxNaps times, before it sleeps until a
// caller wakes it. Under load it therefore collects calls in batches without any caller paying to
// wake it; a caller wakes it early when its queue reaches 1/wakeAt of QueueSize, so that a nap does
// not let the queue fill.
const (
	nap     = 500 * time.Microsecond
	maxNaps = 4
	wakeAt  = 4 // a quarter
)

// opFunc is backend.OpFunc under a name that is not exported, so that embedding it gives Backend
// its Take, Peek and Refund without a field anyone outside could reassign.
type opFunc = backend.OpFunc

// Backend is a throttler.Backend that answers from the control and mirrors to the candidate: its
// Take, Peek and Refund return the control's answer and queue the same call for the candidate. It
// is safe for concurrent use. Create it with New and stop its workers with Close.
type Backend struct {
	opFunc             // b.do(): Take, Peek and Refund
	control, candidate throttler.Backend
	// The two as lease backends (see lease.go); nil when they hold none.
	controlLeases, candidateLeases throttler.LeaseBackend
	controlTraits                  throttler.Traits
	opts                           Options
	reorder                        reorder
	mono                           func() int64 // monoNow; tests move their own
	seed                           maphash.Seed
	workers                        []*worker
	wakeLen                        int
	pub                            *publisher // nil without Options.Publish

	ctx       context.Context // cancelled when Close gives up draining
	cancel    context.CancelFunc
	discard   atomic.Bool // set with cancel: drop what is still queued
	discarded atomic.Uint64
	wg        sync.WaitGroup
	closing   sync.Once
	closed    atomic.Bool

	// Panics in the hooks: rare, so shared counters.
	publishPanics, ignorePanics atomic.Uint64

	mismatches ring
}

var _ throttler.Backend = (*Backend)(nil)

// call is one mirrored operation waiting for its worker.
type call struct {
	op         throttler.Op
	key        string
	p          throttler.Policy
	cost       int64
	receipt    time.Time // a Refund's: the control's Take's ResetAt
	now        time.Time
	control    throttler.Decision
	controlErr error
	// got is when the shadow received the call (b.mono), before it asked the control; 0 when
	// not read (no ReorderSpan: nothing is Late without it).
	got int64
	// lease is a lease operation's; a rate operation leaves it as the slot's last user did, and
	// nothing reads it.
	lease leaseCall
}

type worker struct {
	mu       sync.Mutex
	queue    []call
	sleeping bool // parked until woken; a caller must signal wake
	closed   bool
	dropped  uint64        // calls refused by a full or closed queue
	wake     chan struct{} // capacity 1
	// Flush waits for done to reach taken plus what is queued: counters, not items in the
	// queue, so that a Flush that gives up leaves nothing behind and every Flush waiting on the
	// worker shares one channel, closed when a batch ends.
	taken, done uint64 // calls taken from the queue, and finished with
	flushed     chan struct{}
	// Drops waiting for the publisher (see publish.go); nil without Options.Publish.
	outbox       []call
	outboxClosed bool     // Close is done publishing: count, do not queue
	pubDropped   uint64   // drops refused by a full or closed outbox
	_            [64]byte // keep workers' locks on separate cache lines

	// Owned by the worker goroutine.
	spare  []call
	ctx    context.Context // shared by calls while enough of it is left
	cancel context.CancelFunc
	// stale is set by aging, Timeout/8 after ctx was made, and when a call ends in ctx's
	// expiry: the next call needs a new context. A flag set by a timer spares the worker a
	// clock read per call. It is allocated on its own so that the timer, until the runtime
	// drops it, holds only the flag and not the worker's queues.
	stale *atomic.Bool
	aging *time.Timer

	// A candidate that may block runs on the runner goroutine (see runner), so that the worker
	// can stop waiting for it; jobs is nil for one that is throttler.InProcess, which the
	// worker calls itself.
	jobs    chan *job // to the runner
	answers chan *job // from the runner, capacity 1
	job     *job      // the runner's; reused once its answer is read
	stuck   bool      // job was abandoned and has not returned yet
	skip    bool      // a call of this batch timed out: send no more of it

	tally  tally    // this batch's results, not yet in counts
	counts counters // what Stats reads
}

// job is one call handed to the runner: a copy, since an abandoned call outlives the queue slot it
// came from.
type job struct {
	ctx  context.Context
	c    call
	undo bool // release c's lease (undoAcquire) instead of making c
	d    throttler.Decision
	held bool
	err  error
}

// New returns a Backend that serves from control and mirrors to candidate, and starts its workers.
// Both backends are required. Nil options mean defaults; a negative number in them is an error.
// Call Close to stop the workers.
func New(control, candidate throttler.Backend, opts *Options) (*Backend, error) {
	if err := nilness.Check("shadow: control backend", control); err != nil {
		return nil, err
	}
	if err := nilness.Check("shadow: candidate backend", candidate); err != nil {
		return nil, err
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("shadow: Options.%w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &Backend{
		control: control, candidate: candidate, opts: o,
		reorder: reorder{span: o.ReorderSpan, units: o.ReorderUnits, usedTol: o.UsedTolerance, resetTol: o.ResetAtTolerance},
		mono:    monoNow, seed: maphash.MakeSeed(), workers: make([]*worker, o.Workers),
		wakeLen: max(1, o.QueueSize/wakeAt),
		ctx:     ctx, cancel: cancel,
	}
	b.opFunc = b.do()
	b.controlTraits = throttler.TraitsOf(control)
	candidateTraits := throttler.TraitsOf(candidate)
	// A composite is mirrored as it is: both must take them.
	b.controlTraits.Composites = b.controlTraits.Composites && candidateTraits.Composites
	if b.controlTraits.Leases {
		b.controlLeases = control.(throttler.LeaseBackend)
	}
	if candidateTraits.Leases {
		b.candidateLeases = candidate.(throttler.LeaseBackend)
	}
	b.mismatches.init(o.KeepMismatches)
	if o.Publish != nil {
		b.pub = newPublisher(o.Workers)
	}
	blocks := !candidateTraits.InProcess
	for i := range b.workers {
		w := &worker{wake: make(chan struct{}, 1)}
		if blocks {
			w.jobs, w.answers, w.job = make(chan *job, 1), make(chan *job, 1), new(job)
			b.wg.Add(1)
			go b.runner(w)
		}
		stale := new(atomic.Bool)
		stale.Store(true)
		w.stale = stale
		w.aging = time.AfterFunc(time.Hour, func() { stale.Store(true) })
		w.aging.Stop()
		b.workers[i] = w
		b.wg.Add(1)
		go b.run(w)
	}
	if b.pub != nil {
		go b.publishLoop()
	}
	return b, nil
}

// do returns the function behind Take, Peek and Refund: it serves the call from the control and
// mirrors it, unless the control rejected it as bad input, which the candidate would reject too,
// leaving nothing to compare. The shadow does not validate: the control does. It is a closure over
// b rather than a method value, and it switches on op itself rather than calling backend.Do: either
// would cost the caller's path one more frame.
func (b *Backend) do() backend.OpFunc {
	return func(ctx context.Context, op throttler.Op, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
		var d throttler.Decision
		var err error
		var got int64
		if b.reorder.span > 0 {
			got = b.mono()
		}
		switch op {
		case throttler.OpTake:
			d, err = b.control.Take(ctx, key, p, cost, now)
		case throttler.OpPeek:
			d, err = b.control.Peek(ctx, key, p, now)
		case throttler.OpRefund:
			d, err = b.control.Refund(ctx, key, p, cost, receipt, now)
		default:
			return backend.Do(ctx, b.control, op, key, p, cost, receipt, now) // ErrUnknownOp
		}
		if err != nil && throttler.IsInputError(err) {
			return d, err
		}
		b.mirror(op, key, p, cost, receipt, now, got, &d, err, nil)
		return d, err
	}
}

// mirror queues the call for the key's worker, or drops it. It is the whole cost that shadowing
// adds to the control path: one hash, one uncontended lock, one copy. lc is a lease operation's
// part, nil for a rate one's. A Refund mirrors the same receipt, the control's Take's ResetAt: the
// candidate refunds only if its state fits it (see throttler.Backend), which it does when it
// counted the Take alike.
func (b *Backend) mirror(op throttler.Op, key string, p throttler.Policy, cost int64, receipt, now time.Time, got int64, d *throttler.Decision, err error, lc *leaseCall) {
	if b.opts.Enabled != nil && !b.opts.Enabled() {
		return
	}
	w := b.workers[0]
	if len(b.workers) > 1 {
		w = b.workers[maphash.String(b.seed, key)%uint64(len(b.workers))]
	}
	w.mu.Lock()
	n := len(w.queue)
	if w.closed || n >= b.opts.QueueSize {
		// Counted under the lock already held: a dead candidate makes every call drop, and
		// a shared atomic would then be contended. For the same reason the drop waits for
		// the publisher in this worker's outbox, under this lock.
		w.dropped++
		wake, force := false, false
		if b.pub != nil {
			if n := len(w.outbox); w.outboxClosed || n >= b.opts.QueueSize {
				w.pubDropped++
			} else {
				c := grow(&w.outbox)
				c.op, c.key, c.p, c.cost, c.receipt, c.now, c.control, c.controlErr = op, key, p, cost, receipt, now, *d, err
				if lc != nil {
					c.lease = *lc
				}
				wake, force = b.pub.wakeFor(n, n+1, b.wakeLen)
			}
		}
		w.mu.Unlock()
		if wake {
			b.pub.signal(force)
		}
		return
	}
	c := grow(&w.queue)
	c.op, c.key, c.p, c.cost, c.receipt, c.now, c.control, c.controlErr = op, key, p, cost, receipt, now, *d, err
	c.got = got
	if lc != nil {
		c.lease = *lc
	}
	signal := w.sleeping || len(w.queue) == b.wakeLen
	w.sleeping = false
	w.mu.Unlock()
	if signal {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// grow extends *s by one call and returns it, for the caller to fill in place: the call is large,
// and copying it twice would be a visible share of the control path's cost.
func grow(s *[]call) *call {
	n := len(*s)
	if n < cap(*s) {
		*s = (*s)[:n+1]
	} else {
		*s = append(*s, call{})
	}
	return &(*s)[n]
}

// run is a worker: it takes its whole queue at once and calls the candidate for each call, in
// order.
func (b *Backend) run(w *worker) {
	defer b.wg.Done()
	defer func() {
		w.aging.Stop()
		if w.cancel != nil {
			w.cancel()
		}
		if w.jobs != nil {
			close(w.jobs)
		}
	}()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	naps := 0
	var batch []call // the batch just worked through
	// looked is when the worker last found its queue (empty, or taken): every call it takes
	// next was queued after it, so time since it bounds how long a call waited (see
	// Result.Lag).
	looked := time.Now()
	for {
		w.mu.Lock()
		if batch != nil {
			b.finishBatch(w, batch)
			batch = nil
		}
		next := w.queue
		if len(next) == 0 {
			if w.closed {
				w.mu.Unlock()
				return
			}
			naps++
			sleep := naps > maxNaps
			w.sleeping = sleep
			w.mu.Unlock()
			if sleep {
				<-w.wake
				// Woken by the first call queued since: about now.
				looked = time.Now()
				continue
			}
			looked = time.Now()
			timer.Reset(nap)
			select {
			case <-w.wake:
				timer.Stop()
			case <-timer.C:
			}
			continue
		}
		w.queue = w.spare[:0]
		w.taken += uint64(len(next))
		w.mu.Unlock()
		naps = 0
		// The slots are not zeroed after use: the next caller overwrites every field, and a
		// worker writing them would make each caller's write a cache miss. They keep at
		// most QueueSize keys alive.
		floor := looked
		looked = time.Now()
		w.skip = false
		for i := range next {
			b.process(w, &next[i], floor)
		}
		w.counts.absorb(&w.tally) // in Stats before Flush hears of it
		batch = next
	}
}

// finishBatch, under w.mu, tells the Flushes waiting that the batch is done, and keeps its slots
// for the next queue.
func (b *Backend) finishBatch(w *worker, batch []call) {
	w.done += uint64(len(batch))
	if w.flushed != nil {
		close(w.flushed)
		w.flushed = nil
	}
	w.spare = batch
}

// process calls the candidate for c and records the comparison. c was queued after queued (see
// run).
func (b *Backend) process(w *worker, c *call, queued time.Time) {
	r := c.result()
	if b.discard.Load() {
		b.discarded.Add(1)
		r.Kinds = Dropped
		b.record(w, &r)
		return
	}
	if w.skip || w.stuck && !b.awaitRunner(w) {
		w.skip = true
		r.Kinds, r.CandidateErr = Dropped, errNotSent
		b.record(w, &r)
		return
	}
	r.Candidate, r.CandidateHeld, r.CandidateErr = b.callCandidate(w, c)
	if r.ControlErr != nil {
		r.Kinds |= ControlError
	}
	if r.CandidateErr != nil {
		r.Kinds |= CandidateError
	}
	if r.Kinds == 0 {
		r.Kinds = compare(r.Control, r.Candidate, b.opts.UsedTolerance, b.opts.ResetAtTolerance)
		if r.ControlHeld != r.CandidateHeld {
			// The stores disagreed on the leases held before the call.
			r.Kinds |= UsedDiffers
		}
		if r.Kinds != 0 {
			// Read only for differences: a clock read per call would be a visible share
			// of an in-process candidate's cost.
			r.Lag = time.Since(queued)
			if c.got != 0 {
				r.Elapsed = max(time.Duration(b.mono()-c.got), r.Lag)
			}
		}
		rate := c.op != throttler.OpAcquire && c.op != throttler.OpRelease
		switch {
		case r.Kinds == 0:
		case rate && b.reorder.explains(&r):
			r.Kinds |= Reordered
		case rate && b.reorder.explainsLate(&r):
			r.Kinds |= Late
		case b.opts.Ignore != nil:
			r.Ignored = b.ignore(r)
		}
	}
	if c.op == throttler.OpAcquire && r.CandidateErr == nil && r.Candidate.Allowed && (r.ControlErr != nil || !r.Control.Allowed) {
		b.undoAcquire(w, c)
	}
	b.record(w, &r)
}

// epoch is the origin of monoNow.
var epoch = time.Now()

// monoNow is the monotonic time in ns since epoch, never 0 (0 is "not read").
func monoNow() int64 { return int64(time.Since(epoch)) + 1 }

// result is the Result of c before the candidate answers.
func (c *call) result() Result {
	r := Result{Op: c.op, Key: c.key, Now: c.now, Control: c.control, ControlErr: c.controlErr}
	if c.op == throttler.OpAcquire || c.op == throttler.OpRelease {
		r.Concurrency, r.Lease, r.ControlHeld = c.lease.p, c.lease.id, c.lease.held
	} else {
		r.Policy, r.Cost, r.Receipt = c.p, c.cost, c.receipt
	}
	return r
}

// callCandidate makes the call with a deadline, turning a timeout or a panic into an error; held is
// a Release's answer. A timeout makes the worker skip the rest of its batch.
func (b *Backend) callCandidate(w *worker, c *call) (d throttler.Decision, held bool, err error) {
	var ctx context.Context
	abandoned := false
	if w.jobs == nil {
		ctx = w.callContext(b.ctx, b.opts.Timeout)
		d, held, err = b.invoke(ctx, c, false)
	} else {
		// Its own context: a shared one, made stale by a timer, can be handed on expired
		// when that timer is late, and then the worker would abandon a call that never had
		// its Timeout.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(b.ctx, b.opts.Timeout)
		defer cancel()
		d, held, err, abandoned = w.hand(ctx, c, false)
	}
	if err == nil {
		// A call that answered is compared, even if it answered late.
		return d, held, nil
	}
	how := ""
	if abandoned {
		how = ", still running: abandoned"
	}
	switch cerr := ctx.Err(); {
	case errors.Is(cerr, context.DeadlineExceeded):
		w.stale.Store(true)
		w.skip = true
		if !errors.Is(err, context.DeadlineExceeded) {
			// The store's own error, returned once the deadline had passed: the timeout
			// is what a reader of the Result matches.
			err = fmt.Errorf("%w: %w", context.DeadlineExceeded, err)
		}
		return throttler.Decision{}, false, fmt.Errorf("shadow: candidate timed out after %v%s: %s %q: %w",
			b.opts.Timeout, how, c.op, c.key, err)
	case cerr != nil:
		w.stale.Store(true)
		return throttler.Decision{}, false, fmt.Errorf("candidate %s %q cancelled by Close%s: %w", c.op, c.key, how, err)
	}
	return throttler.Decision{}, false, fmt.Errorf("candidate %s %q: %w", c.op, c.key, err)
}

// invoke calls the candidate for c (or, with undo, releases c's lease on it), turning a panic into
// an error.
func (b *Backend) invoke(ctx context.Context, c *call, undo bool) (d throttler.Decision, held bool, err error) {
	defer func() {
		if v := recover(); v != nil {
			d, held, err = throttler.Decision{}, false, fmt.Errorf("%w: %s %q: %v", errCandidatePanic, c.op, c.key, v)
		}
	}()
	switch {
	case undo:
		held, d, err = b.candidateLeases.Release(ctx, c.key, c.lease.p, c.lease.id, c.now)
	case c.op == throttler.OpAcquire || c.op == throttler.OpRelease:
		held, d, err = leaseop.Do(ctx, b.candidateLeases, c.op, c.key, c.lease.p, c.lease.id, c.now)
	default:
		d, err = backend.Do(ctx, b.candidate, c.op, c.key, c.p, c.cost, c.receipt, c.now)
	}
	return d, held, err
}

// runner makes w's candidate calls for a candidate that may block, one at a time, until the worker
// stops. A call that ignores its context holds the runner, never the worker (see hand).
func (b *Backend) runner(w *worker) {
	defer b.wg.Done()
	for j := range w.jobs {
		j.d, j.held, j.err = b.invoke(j.ctx, &j.c, j.undo)
		w.answers <- j
	}
}

// hand has the runner make the call and waits for its answer until ctx ends; then it abandons the
// call, marks the runner stuck and reports ctx's error. The runner is idle: the worker hands it
// nothing while it is stuck (see awaitRunner).
func (w *worker) hand(ctx context.Context, c *call, undo bool) (d throttler.Decision, held bool, err error, abandoned bool) {
	j := w.job
	j.ctx, j.c, j.undo = ctx, *c, undo
	w.jobs <- j
	select {
	case <-w.answers:
	case <-ctx.Done():
		select {
		case <-w.answers: // it answered as the deadline passed
		default:
			w.stuck = true
			return throttler.Decision{}, false, ctx.Err(), true
		}
	}
	d, held, err = j.d, j.held, j.err
	j.ctx, j.d, j.err = nil, throttler.Decision{}, nil
	return d, held, err, false
}

// awaitRunner waits up to Timeout for the runner's abandoned call to return, and reports whether it
// did: a candidate that honours its context returns just after its deadline, one that ignores it
// may never. Its answer is discarded: the call was counted as a timeout.
func (b *Backend) awaitRunner(w *worker) bool {
	timer := time.NewTimer(b.opts.Timeout)
	defer timer.Stop()
	select {
	case j := <-w.answers:
		j.ctx, j.d, j.err = nil, throttler.Decision{}, nil
		w.stuck = false
		return true
	case <-timer.C:
	case <-b.ctx.Done():
	}
	return false
}

// callContext returns a context whose deadline is Timeout after it was made, and reuses it until it
// is stale: making a context and its timer for every call would cost the worker more than an
// in-process candidate's call. So every call starts with at least about 7/8 of Timeout left (less
// only by how late the aging timer fires on a busy machine).
func (w *worker) callContext(parent context.Context, timeout time.Duration) context.Context {
	if !w.stale.Load() {
		return w.ctx
	}
	if w.cancel != nil {
		w.cancel()
	}
	w.stale.Store(false)
	w.ctx, w.cancel = context.WithTimeout(parent, timeout)
	w.aging.Reset(timeout / 8)
	return w.ctx
}

// ignore asks Options.Ignore, counting a panic and taking it as "not ignored".
func (b *Backend) ignore(r Result) (ok bool) {
	defer func() {
		if recover() != nil {
			b.ignorePanics.Add(1)
			ok = false
		}
	}()
	return b.opts.Ignore(r)
}

// record counts r, keeps it if it is a mismatch and publishes it.
func (b *Backend) record(w *worker, r *Result) {
	if w.tally.add(r) {
		b.mismatches.add(*r)
	}
	if b.pub != nil {
		b.publish(r)
	}
}

// Flush waits until every call mirrored before it was called has been compared (or dropped) and its
// Result published, or until ctx is done, and keeps the shadow running; Close stops it. Operators
// use Flush before reading Stats at a stage boundary, and tests to compare deterministically. A
// Flush that gives up leaves nothing behind. After Close (or during it), Flush returns an error at
// once: Close has compared, dropped or given up on every call.
func (b *Backend) Flush(ctx context.Context) error {
	if b.closed.Load() {
		return errClosed
	}
	for _, w := range b.workers {
		if err := w.flush(ctx); err != nil {
			return err
		}
	}
	if b.pub != nil {
		return b.pub.flush(ctx)
	}
	return nil
}

// flush waits until the worker has finished every call queued or in hand when it was called.
func (w *worker) flush(ctx context.Context) error {
	w.mu.Lock()
	target := w.taken + uint64(len(w.queue))
	for w.done < target {
		ch := w.flushed
		if ch == nil {
			ch = make(chan struct{})
			w.flushed = ch
		}
		w.sleeping = false
		w.mu.Unlock()
		select { // a napping worker would find its queue anyway, later
		case w.wake <- struct{}{}:
		default:
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("shadow: flush: %w", ctx.Err())
		}
		w.mu.Lock()
	}
	w.mu.Unlock()
	return nil
}

// Close stops mirroring and stops the workers and the publisher. It lets them finish the queued
// calls and drops for up to Options.DrainTimeout, then cancels the candidate calls in flight and
// drops what is left, counted (as Dropped calls and PublishDropped drops), returning an error that
// says how many calls it dropped. A worker or publisher still busy another DrainTimeout later (a
// candidate that ignores the cancellation, a Publish that does not return) is left to finish on its
// own, and Close returns an error saying so: shutdown is bounded even then. Calls made after Close
// are still served by the control, and counted as dropped. Close never closes the control or the
// candidate; it is safe to call more than once.
func (b *Backend) Close() error {
	var err error
	b.closing.Do(func() {
		b.closed.Store(true)
		for _, w := range b.workers {
			w.mu.Lock()
			w.closed = true
			w.mu.Unlock()
			select {
			case w.wake <- struct{}{}:
			default:
			}
		}
		b.stopPublishing()
		stopped := make(chan struct{})
		go func() { b.wg.Wait(); close(stopped) }()
		// Each is set to nil once it has closed.
		workers, published := (<-chan struct{})(stopped), (<-chan struct{})(nil)
		if b.pub != nil {
			published = b.pub.done
		}
		timer := time.NewTimer(b.opts.DrainTimeout)
		defer timer.Stop()
		expired := false
		for workers != nil || published != nil {
			select {
			case <-workers:
				workers = nil
				continue
			case <-published:
				published = nil
				continue
			case <-timer.C:
			}
			if expired {
				if workers != nil {
					err = fmt.Errorf("shadow: close: workers still busy %v after their candidate calls were cancelled (a candidate that ignores its context, or a Publish that does not return); left to finish: %w", b.opts.DrainTimeout, context.DeadlineExceeded)
				}
				if published != nil {
					err = errors.Join(err, fmt.Errorf("shadow: close: Publish still running %v after draining ended; left to finish: %w", b.opts.DrainTimeout, context.DeadlineExceeded))
				}
				break
			}
			expired = true
			b.discard.Store(true)
			if b.pub != nil {
				b.pub.discard.Store(true)
			}
			b.cancel()
			timer.Reset(b.opts.DrainTimeout)
		}
		if n := b.discarded.Load(); n > 0 {
			err = errors.Join(fmt.Errorf("shadow: close: %d queued calls dropped after draining for %v: %w", n, b.opts.DrainTimeout, context.DeadlineExceeded), err)
		}
		if b.pub != nil {
			if n := b.pub.discarded.Load(); n > 0 {
				err = errors.Join(err, fmt.Errorf("shadow: close: %d drops not published after draining for %v: %w", n, b.opts.DrainTimeout, context.DeadlineExceeded))
			}
		}
		b.cancel()
	})
	return err
}

// Stats returns a snapshot of the comparisons so far.
func (b *Backend) Stats() Stats {
	s := Stats{ByKind: make(map[Kind]uint64)}
	var dropped uint64
	for _, w := range b.workers {
		w.counts.addTo(&s)
		w.mu.Lock()
		s.Queued += len(w.queue)
		dropped += w.dropped
		s.PublishDropped += w.pubDropped
		w.mu.Unlock()
	}
	if dropped > 0 {
		s.Results += dropped
		s.ByKind[Dropped] += dropped
	}
	s.LastMismatches = b.mismatches.appendTo(nil)
	s.PublishPanics, s.IgnorePanics = b.publishPanics.Load(), b.ignorePanics.Load()
	if b.pub != nil {
		s.PublishDropped += b.pub.discarded.Load()
	}
	return s
}
