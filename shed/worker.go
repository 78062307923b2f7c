package shed

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// WorkerOptions configure NewWorker. The defaults are the constants of
// Stripe's worker utilization load shedder.
type WorkerOptions struct {
	// Workers is how many requests this process serves at once at full
	// utilization: the default Utilization is the requests in flight (those
	// Admit let through and Done has not ended) over Workers. Required
	// unless Utilization is set. default: none
	Workers int
	// Utilization returns the process's worker utilization, from 0 (idle)
	// to 1 (every worker busy). Update samples it once per tick; a value
	// outside [0, 1] counts as the nearer bound, and NaN holds the shedding
	// amount where it is. It must be safe for concurrent use.
	// default: in flight / Workers
	Utilization func() float64
	// GoodBelow is where good utilization ends: below it the shedding
	// amount falls, the faster the lower the utilization. default: 0.7
	GoodBelow float64
	// BadFrom is where bad utilization starts: from it on the shedding
	// amount rises, at full speed at utilization 1. Between GoodBelow and
	// BadFrom (the dead zone) it holds. default: 0.8
	BadFrom float64
	// Delay is how long utilization 1 takes to start shedding from rest:
	// the resting shedding amount is -Delay/Ramp, so brief spikes and
	// imprecise samples shed nothing. It also bounds the time one Update
	// accounts for, so a stalled ticker cannot jump the amount. default: 28s
	Delay time.Duration
	// Ramp is how long utilization 1 takes, once shedding has started, to
	// shed all shed-able traffic; recovery at utilization 0 is as slow.
	// default: 120s
	Ramp time.Duration
	// Interval is how often Run calls Update: the controller's tick. At
	// most Delay. default: 1s
	Interval time.Duration
	// Clock gives Run the instant of each tick. default: time.Now
	Clock func() time.Time
	// Random returns uniformly distributed 64-bit values for the drop
	// decisions. It is called on the hot path, from many goroutines at
	// once: it must be fast and safe for concurrent use.
	// default: math/rand/v2's Uint64
	Random func() uint64
}

func (o *WorkerOptions) withDefaults() (WorkerOptions, error) {
	var out WorkerOptions
	if o != nil {
		out = *o
	}
	switch {
	case out.Workers < 0:
		return out, fmt.Errorf("shed: WorkerOptions.Workers must be >= 0, got %d", out.Workers)
	case out.Workers == 0 && out.Utilization == nil:
		return out, errors.New("shed: WorkerOptions needs Workers (for the default utilization, in flight / Workers) or a Utilization source")
	case math.IsNaN(out.GoodBelow) || out.GoodBelow < 0 || out.GoodBelow >= 1:
		return out, fmt.Errorf("shed: WorkerOptions.GoodBelow must be in [0, 1) (0: default), got %v", out.GoodBelow)
	case math.IsNaN(out.BadFrom) || out.BadFrom < 0 || out.BadFrom >= 1:
		return out, fmt.Errorf("shed: WorkerOptions.BadFrom must be in [0, 1) (0: default), got %v", out.BadFrom)
	case out.Delay < 0:
		return out, fmt.Errorf("shed: WorkerOptions.Delay must be >= 0, got %v", out.Delay)
	case out.Ramp < 0:
		return out, fmt.Errorf("shed: WorkerOptions.Ramp must be >= 0, got %v", out.Ramp)
	case out.Interval < 0:
		return out, fmt.Errorf("shed: WorkerOptions.Interval must be >= 0, got %v", out.Interval)
	}
	if out.GoodBelow == 0 {
		out.GoodBelow = 0.7
	}
	if out.BadFrom == 0 {
		out.BadFrom = 0.8
	}
	if out.Delay == 0 {
		out.Delay = 28 * time.Second
	}
	if out.Ramp == 0 {
		out.Ramp = 120 * time.Second
	}
	if out.Interval == 0 {
		out.Interval = time.Second
	}
	if out.Clock == nil {
		out.Clock = time.Now
	}
	if out.Random == nil {
		out.Random = rand.Uint64
	}
	switch {
	case out.GoodBelow > out.BadFrom:
		return out, fmt.Errorf("shed: WorkerOptions.GoodBelow (%v) must not exceed BadFrom (%v)", out.GoodBelow, out.BadFrom)
	case out.Interval > out.Delay:
		return out, fmt.Errorf("shed: WorkerOptions.Interval (%v) must not exceed Delay (%v), which bounds the time one tick accounts for", out.Interval, out.Delay)
	}
	return out, nil
}

// Worker is Stripe's worker utilization load shedder: when this process's
// workers stay saturated it sheds a growing share of its least important
// traffic, slowly, so the process recovers without swinging between
// shedding everything and nothing.
//
// A derivative controller moves the shedding amount s, a number from
// -Delay/Ramp (at rest) to 1, on every tick (Update):
//
//	s += elapsed × d(u) / Ramp, clamped to [-Delay/Ramp, 1]
//	d(u) = u/GoodBelow - 1               below GoodBelow (from -1 to 0)
//	       0                             in the dead zone
//	       (u-BadFrom)/(1-BadFrom)       from BadFrom on (from 0 to 1)
//
// where u is the utilization sampled at the tick and elapsed the time since
// the previous tick (at most Delay). From rest, 28 s at utilization 1 bring
// s to 0, and 120 s more to 1. A positive s is spread over the shed-able
// classes least important first: with k = 3 classes (TestMode, Read, Write
// in that order), the i-th (from 0) is dropped with probability
// clamp(s×k - i, 0, 1), so test-mode traffic is shed entirely before the
// first read is, and at s = 1 everything but Critical is. Critical is never
// shed.
//
// Stripe's gist computes the resting amount -28/120 in integer arithmetic
// (Ruby's -28/120 is -1), which would delay shedding by 120 s instead of 28;
// here it is the real number. The gist also starts at 0 rather than at
// rest, and updates per request; here the controller starts at rest and
// updates on ticks, and the first tick only starts its clock.
//
// The hot path (Admit, Done) holds no lock: it reads the drop probability
// the last tick published and draws one random number when it is not zero.
// A Worker is safe for concurrent use. Build it with NewWorker and start its
// ticks with Run (or call Update yourself, as tests do).
type Worker struct {
	drop     [numClasses]atomic.Uint64 // per class: drop iff Random()>>11 < drop
	random   func() uint64
	_        [64]byte // inflight is written by every request: keep it off drop's cache line
	inflight atomic.Int64
	_        [64]byte

	opts    WorkerOptions
	running atomic.Bool
	amount  atomic.Uint64 // float64 bits of s, for Stats

	mu      sync.Mutex // held by Update alone, never by a request
	bad     float64    // s × Ramp in seconds, so that whole seconds of utilization 1 add up exactly
	last    time.Time
	started bool
}

// one is the drop threshold of probability 1: Admit compares 53 random bits
// with it.
const one = 1 << 53

// NewWorker returns a Worker at rest (shedding nothing), or an error naming
// the option that cannot work.
func NewWorker(o *WorkerOptions) (*Worker, error) {
	opts, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	w := &Worker{opts: opts, random: opts.Random}
	if w.opts.Utilization == nil {
		workers := float64(opts.Workers)
		w.opts.Utilization = func() float64 { return float64(w.inflight.Load()) / workers }
	}
	w.bad = -opts.Delay.Seconds()
	w.publish()
	return w, nil
}

// Admit decides whether a request of class c goes ahead, and if so counts it
// in flight until Done: call Done exactly once for every admitted request,
// when it ends. A class that is not Valid is treated as Write. A nil Worker
// admits everything.
func (w *Worker) Admit(c Class) bool {
	if w == nil {
		return true
	}
	if c >= numClasses {
		c = Write
	}
	if t := w.drop[c].Load(); t != 0 && w.random()>>11 < t {
		return false
	}
	w.inflight.Add(1)
	return true
}

// Done ends a request that Admit let through.
func (w *Worker) Done() {
	if w != nil {
		w.inflight.Add(-1)
	}
}

// Update is one tick of the controller at now: it samples the utilization,
// moves the shedding amount by the time since the previous tick, and
// publishes the new drop probabilities to Admit. The first Update only
// starts the clock. An instant before the previous tick's accounts for no
// time (a clock that steps back).
func (w *Worker) Update(now time.Time) {
	if w == nil || w.random == nil {
		return
	}
	u := w.opts.Utilization()
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.started {
		w.started, w.last = true, now
		return
	}
	elapsed := min(max(now.Sub(w.last), 0), w.opts.Delay)
	w.last = now
	w.bad = min(max(w.bad+elapsed.Seconds()*w.derivative(u), -w.opts.Delay.Seconds()), w.opts.Ramp.Seconds())
	w.publish()
}

// derivative is d(u) of the controller: from -1 (idle) to 1 (saturated).
func (w *Worker) derivative(u float64) float64 {
	switch {
	case math.IsNaN(u):
		return 0
	case u < w.opts.GoodBelow:
		return max(u, 0)/w.opts.GoodBelow - 1
	case u < w.opts.BadFrom:
		return 0
	}
	return (min(u, 1) - w.opts.BadFrom) / (1 - w.opts.BadFrom)
}

// publish stores the amount and every class's drop threshold. Callers hold
// mu (or own w alone).
func (w *Worker) publish() {
	s := w.bad / w.opts.Ramp.Seconds()
	w.amount.Store(math.Float64bits(s))
	k := float64(len(shedOrder))
	for i, c := range shedOrder {
		p := min(max(s*k-float64(i), 0), 1)
		w.drop[c].Store(uint64(p * one))
	}
}

// WorkerStats is a Worker's state as Stats reads it: for a status page,
// metrics, or a Utilization of your own built on InFlight.
type WorkerStats struct {
	// InFlight is how many requests Admit let through have not called
	// Done.
	InFlight int64
	// ShedAmount is the controller's shedding amount s: negative at rest
	// (-Delay/Ramp, shedding nothing), up to 1 (shedding every shed-able
	// request).
	ShedAmount float64
	// DropChance is, by Class, the probability with which Admit now drops
	// a request (DropChance[Read]); DropChance[Critical] is always 0.
	DropChance [4]float64
}

// Every class has its place in WorkerStats.DropChance.
var _ [4]float64 = [numClasses]float64{}

// Stats returns the Worker's state, each field read atomically: a tick
// that runs meanwhile may show in some fields and not yet in others. A nil
// Worker's is the zero WorkerStats.
func (w *Worker) Stats() WorkerStats {
	var s WorkerStats
	if w == nil {
		return s
	}
	s.InFlight = w.inflight.Load()
	s.ShedAmount = math.Float64frombits(w.amount.Load())
	for c := range numClasses {
		s.DropChance[c] = float64(w.drop[c].Load()) / one
	}
	return s
}

// Run calls Update every Interval, at the instants Clock gives, until ctx
// ends, and returns ctx's error. Only one Run may run at a time.
func (w *Worker) Run(ctx context.Context) error {
	if w == nil || w.random == nil {
		return errNilShedder
	}
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("shed: Worker.Run is already running")
	}
	defer w.running.Store(false)
	tick := time.NewTicker(w.opts.Interval)
	defer tick.Stop()
	w.Update(w.opts.Clock())
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			w.Update(w.opts.Clock())
		}
	}
}
