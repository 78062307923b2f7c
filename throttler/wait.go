package throttler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/throttlekit/throttlekit/internal/nilness"
	"github.com/throttlekit/throttlekit/internal/sleep"
)

// ErrWouldExceedDeadline is returned by Wait, at once, when the context's
// deadline comes before the earliest instant the units could be admitted:
// waiting would only hold the caller and end in the context's error (as
// golang.org/x/time/rate's Wait does). The Decision returned with it is the
// denial, whose RetryAfter says how long admission would have taken.
var ErrWouldExceedDeadline = errors.New("throttler: wait would exceed the context's deadline")

// The retries of a waiting caller.
const (
	// A sleep is stretched by a random extra of up to a tenth of it, within
	// these bounds, so that waiters denied until the same instant reach the
	// store spread out rather than all at once. Only one waiter per process
	// and key sleeps (see WaitN), so 100ms spreads even a large fleet,
	// and a long wait does not lose seconds to it.
	minJitter = time.Millisecond
	maxJitter = 100 * time.Millisecond
	// A denial that does not say when to retry (RetryAfter 0, which no
	// backend of this module returns) is retried after firstBackoff,
	// doubling up to maxBackoff: Wait never spins.
	firstBackoff = 50 * time.Millisecond
	maxBackoff   = time.Second
	// A waiter whose policy has an Enforcer re-reads its key's enforcement
	// this often while it sleeps, so that a rollback to dry run reaches it
	// within a second rather than at the end of a sleep that may last a
	// window. A check is an Enforced call, no store call.
	enforcementCheck = time.Second
)

// Wait takes one unit from key's window under p, blocking until it is
// admitted: WaitN(ctx, key, p, 1).
func (t *Throttler) Wait(ctx context.Context, key string, p Policy) (Decision, error) {
	return t.WaitN(ctx, key, p, 1)
}

// WaitN takes n units from key's window under p, blocking until they are
// admitted, ctx is done, or ctx's deadline is sure to come first. A key
// that p runs in dry run (Policy.EnforcedBy) never waits: a would-be denial is
// an admission (Decision.WouldDeny). Which keys p enforces is read at each
// call, as Allow reads it: a key rolled back to dry run is asked at once,
// never queued behind waiters that were denied while it was enforced, and a
// waiter asleep re-reads it every second, asking the store again as soon as
// it changed, so the waiters of a key rolled back are admitted within a
// second, one after another. It returns the admitting Decision, or with an
// error the last Decision it saw:
//   - ctx's error, wrapped (errors.Is matches context.Canceled or
//     context.DeadlineExceeded, and the context's cause), when ctx ends first;
//   - ErrWouldExceedDeadline, at once, when ctx's deadline comes no later
//     than the earliest instant the units could be admitted (see below),
//     queued or not;
//   - an input error at once, such as ErrInvalidCost for an n above p's
//     capacity, which no wait could admit;
//   - when the store is down: ErrUnavailable at once from a Throttler that
//     fails closed; a Throttler that fails open admits at once (Degraded);
//     one with a Fallback waits on the fallback's decisions (Degraded).
//
// A denied caller sleeps the denial's RetryAfter plus a random extra of up to
// a tenth of it (at least 1ms, at most 100ms, and never past half the time
// left before ctx's deadline), so that waiters denied until the same instant
// reach the store spread out. It never retries earlier than RetryAfter,
// which would only cost a denied round trip, unless the key's enforcement
// changed (see above). A denial without a RetryAfter is retried after 50ms,
// doubling up to 1s.
//
// The waiters of one key and policy on one Throttler queue in the process,
// first come first served: only the first asks the store and sleeps, the
// others wait for their turn (until their own context ends), so a busy key
// costs the store one call per RetryAfter per process however many
// goroutines wait on it. A call that finds no one waiting asks the store at
// once, in parallel with others.
//
// The earliest instant units could be admitted is what the store's denials say,
// as a RetryAfter does: the least wait if nothing else happened (no units given
// back by a Refund, no Limit raised in between). A caller that asked the store
// itself and was denied has its own: that instant plus the denial's RetryAfter.
// A queued caller that has not asked has the one the waiter at the head of the
// queue last learned from the store (not from a Fallback), when its own cost is
// at least the head's: the head was denied cost c until an instant A, and no
// Take of c or more can be admitted before A (a larger cost never fits sooner;
// others' admissions only push it later), whether the head stays or leaves. A
// queued caller's deadline at or before A is ErrWouldExceedDeadline at once,
// also when the head learns A while the caller waits, with the head's denial
// (its RetryAfter counted from now). The head's own admission, and the waiters
// between, are not added: any of them may leave before its turn. A caller whose
// cost is smaller than the head's has no such instant (it could fit while the
// head's cost does not) and waits for its turn.
//
// Deadlines are compared with the wall clock (time.Now), on which contexts
// set them; RetryAfter, a duration, comes from the Throttler's Clock.
func (t *Throttler) WaitN(ctx context.Context, key string, p Policy, n int64) (Decision, error) {
	if t == nil || t.backend == nil {
		return Decision{}, errNotBuilt
	}
	if ctx.Err() != nil {
		return Decision{}, waitEnded(ctx)
	}
	k := laneKey{key: key, p: p}
	var d Decision
	var asked time.Time // when d was asked for, on the wall clock
	denied := false     // d is a denial fresh from the store, to sleep on
	// The parts of p that enforced key when d was asked for, read before
	// it: a key in dry run (0) asks at once, never queued behind waiters
	// of a moment it was enforced, and its denials are admissions.
	enforced := enforcedParts(key, p)
	if enforced == 0 || !t.lanes.busy(k) {
		var err error
		asked = t.wait.now()
		if d, err = t.AllowN(ctx, key, p, n); err != nil || d.Allowed {
			return d, waitFailed(ctx, err)
		}
		denied = true
	} else if err := ValidateCall(OpTake, key, p, n, time.Time{}); err != nil {
		// Bad input is said at once, not after a turn in the queue.
		return Decision{}, err
	}
	l, head := t.lanes.join(k)
	defer t.lanes.leave(k, l)
	if !head {
		if denied {
			// Someone queued while this one asked: its own denial bounds
			// its wait, as it does a caller alone.
			if _, err := t.untilRetry(ctx, d.RetryAfter, n); err != nil {
				return d, err
			}
		}
		if ahead, err := l.await(ctx, n, t.wait.now); err != nil {
			if errors.Is(err, ErrWouldExceedDeadline) {
				return ahead, err
			}
			return d, waitEnded(ctx)
		}
		denied = false // stale: others were admitted while this one queued
	}
	defer l.pass()
	var backoff time.Duration
	for {
		if !denied {
			if ctx.Err() != nil {
				return d, waitEnded(ctx)
			}
			var err error
			enforced = enforcedParts(key, p)
			asked = t.wait.now()
			if d, err = t.AllowN(ctx, key, p, n); err != nil || d.Allowed {
				return d, waitFailed(ctx, err)
			}
		}
		l.learn(n, asked, d)
		if err := t.sleepUntilRetry(ctx, d, &backoff, n, watch{key, p, enforced}); err != nil {
			return d, err
		}
		denied = false
	}
}

// sleepUntilRetry sleeps until the denial d may be retried, or until w
// sees the key's enforcement change, or returns at once why it will not:
// ctx's deadline comes first.
func (t *Throttler) sleepUntilRetry(ctx context.Context, d Decision, backoff *time.Duration, n int64, w watch) error {
	wait := d.RetryAfter
	if wait > 0 {
		*backoff = 0
	} else {
		*backoff = min(max(2**backoff, firstBackoff), maxBackoff)
		wait = *backoff
	}
	extra := t.wait.jitter(jitterBound(wait))
	left, err := t.untilRetry(ctx, wait, n)
	if err != nil {
		return err
	}
	if left > 0 {
		extra = min(extra, (left-wait)/2)
	}
	if err := t.sleepWatching(ctx, wait+extra, w); err != nil {
		return waitEnded(ctx)
	}
	return nil
}

// watch is what a sleeping waiter watches: which parts of p enforced key
// when its denial was asked for (enforcedParts).
type watch struct {
	key      string
	p        Policy
	enforced uint8
}

// sleepWatching sleeps for d, or until ctx is done (then its error), or
// until the key's enforcement differs from w's: then it returns nil early,
// for the waiter to ask again. Only a policy with an Enforcer (EnforcedBy,
// a composite's members') is checked, after each enforcementCheck slept:
// never before the first, so that even an Enforcer whose answers flip
// cannot make a waiter spin on the store.
func (t *Throttler) sleepWatching(ctx context.Context, d time.Duration, w watch) error {
	if w.p.enforce == nil {
		return t.wait.sleep(ctx, d)
	}
	for d > 0 {
		step := min(d, enforcementCheck)
		if err := t.wait.sleep(ctx, step); err != nil {
			return err
		}
		if d -= step; d > 0 && enforcedParts(w.key, w.p) != w.enforced {
			return nil
		}
	}
	return nil
}

// enforcedParts reports which parts of p enforce key at this moment: bit
// i for member i of a composite whose members have their own enforcement,
// bit 0 for any other policy. 0 means that key runs in dry run: every
// denial is answered as an admission, so a wait on it never waits. An
// Enforcer that cannot be used counts as enforcing, so that the call
// reports it (see Policy.EnforcedBy).
func enforcedParts(key string, p Policy) uint8 {
	switch p.enforce {
	case nil:
		return 1
	case memberEnforcement:
		var parts uint8
		for i, m := range p.all.members {
			if enforces(m.enforce, key) {
				parts |= 1 << i
			}
		}
		return parts
	}
	if enforces(p.enforce, key) {
		return 1
	}
	return 0
}

// enforces reports whether the enforcement e enforces key: a policy
// without one (nil) enforces every key.
func enforces(e *enforcement, key string) bool {
	return e == nil || nilness.IsNil(e.e) || e.e.Enforced(key)
}

// untilRetry returns the time left before ctx's deadline (0 without one), or
// ErrWouldExceedDeadline when a cost of n that can be admitted in wait at
// the earliest cannot be before the deadline.
func (t *Throttler) untilRetry(ctx context.Context, wait time.Duration, n int64) (time.Duration, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return 0, nil
	}
	left := deadline.Sub(t.wait.now())
	if wait >= left {
		return left, fmt.Errorf("%w: a cost of %d could be admitted in %v at the earliest; the deadline is in %v", ErrWouldExceedDeadline, n, wait, left)
	}
	return left, nil
}

// jitterBound is the largest extra added to a sleep of d.
func jitterBound(d time.Duration) time.Duration {
	return min(max(d/10, minJitter), maxJitter)
}

// waitFailed is the error for a call that ended the wait: nil when it
// admitted, ctx's when the caller gave up (the store's error is then only a
// consequence), else the call's own (bad input, ErrUnavailable).
func waitFailed(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return waitEnded(ctx)
	}
	return err
}

// waitEnded wraps the error of a context that ended the wait, and its cause
// when the context was given one.
func waitEnded(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause != nil && cause != err {
		return fmt.Errorf("throttler: wait ended before admission: %w: %w", err, cause)
	}
	return fmt.Errorf("throttler: wait ended before admission: %w", err)
}

// waitEnv is what Wait takes from the world besides the store: the wall
// clock on which contexts set their deadlines, a sleep that a context
// interrupts, and randomness for the jitter. New sets a Throttler's to the
// real ones (realWait); tests replace it on their Throttler
// (wait_export_test.go) to run Wait at fixed instants, with a sleep that
// moves the fake clock the Throttler reads.
type waitEnv struct {
	now    func() time.Time
	sleep  func(ctx context.Context, d time.Duration) error
	jitter func(bound time.Duration) time.Duration // in [0, bound]
}

// realWait is the world a Throttler waits in.
func realWait() waitEnv {
	return waitEnv{now: time.Now, sleep: sleep.Context, jitter: sleep.UpTo}
}

// laneKey names the waiters of one Throttler that queue together: one key
// and policy.
type laneKey struct {
	key string
	p   Policy
}

// lane queues the waiters of one laneKey in this process. Holding its turn
// is being the one waiter that asks the store and sleeps; the runtime
// serves goroutines blocked on a channel in order, so turns go first come,
// first served.
type lane struct {
	turn    chan struct{} // capacity 1: full while someone holds the turn
	waiters int           // holding or awaiting the turn; guarded by laneSet.mu

	mu sync.Mutex
	// head is the head's latest denial with a RetryAfter, for the queued
	// waiters' deadlines (see WaitN); head.cost 0: none yet.
	head headDenial
	// learned is closed, and replaced, when head changes.
	learned chan struct{}
}

// headDenial is a denial the head of a lane got: no Take of cost or more
// can be admitted before at, on the wall clock.
type headDenial struct {
	d    Decision
	cost int64
	at   time.Time
}

// laneSet is a Throttler's lanes: one for each laneKey with waiters, and
// only while it has some, so it never outgrows the goroutines waiting. Each
// Throttler has its own, so the waiters of one never contend with
// another's for its lock. The zero laneSet is empty and ready.
type laneSet struct {
	mu sync.Mutex
	m  map[laneKey]*lane
}

// busy reports whether someone waits on k.
func (s *laneSet) busy(k laneKey) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[k] != nil
}

// join enters k's lane. head reports that the lane was empty: the caller
// holds the turn already.
func (s *laneSet) join(k laneKey) (l *lane, head bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l = s.m[k]; l == nil {
		if s.m == nil {
			s.m = map[laneKey]*lane{}
		}
		l = &lane{turn: make(chan struct{}, 1), learned: make(chan struct{})}
		l.turn <- struct{}{}
		s.m[k] = l
		head = true
	}
	l.waiters++
	return l, head
}

// leave exits k's lane, after the turn was passed on if it was held.
func (s *laneSet) leave(k laneKey, l *lane) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.waiters--; l.waiters == 0 {
		delete(s.m, k)
	}
}

// await blocks until the caller, of cost n, holds the turn, or ctx is
// done, or ctx's deadline comes no later than the head's denial says a cost
// of n could be admitted: then it returns that denial, its RetryAfter
// counted from now (the wall clock), and ErrWouldExceedDeadline.
func (l *lane) await(ctx context.Context, n int64, wallNow func() time.Time) (Decision, error) {
	deadline, bounded := ctx.Deadline()
	for {
		var learned chan struct{} // nil without a deadline: never ready
		if bounded {
			l.mu.Lock()
			h := l.head
			learned = l.learned
			l.mu.Unlock()
			if h.cost > 0 && n >= h.cost && !h.at.Before(deadline) {
				now := wallNow()
				d := h.d
				d.RetryAfter = max(h.at.Sub(now), 0)
				return d, fmt.Errorf("%w: queued behind a waiter denied a cost of %d, a cost of %d could be admitted in %v at the earliest; the deadline is in %v",
					ErrWouldExceedDeadline, h.cost, n, d.RetryAfter, deadline.Sub(now))
			}
		}
		select {
		case l.turn <- struct{}{}:
			return Decision{}, nil
		case <-ctx.Done():
			return Decision{}, ctx.Err()
		case <-learned: // the head learned another denial: check again
		}
	}
}

// learn records the denial d of a cost of n, asked for at asked, by the
// head of the lane, and wakes the queued waiters to check their deadlines.
// A denial without a RetryAfter says nothing of when, and a Degraded one
// (the fallback's) nothing of the store, which may admit as soon as it is
// back.
func (l *lane) learn(n int64, asked time.Time, d Decision) {
	if d.RetryAfter <= 0 || d.Degraded {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	// asked is before the store's instant of the decision: counting from
	// it can only make the earliest admission earlier than it is.
	l.head = headDenial{d: d, cost: n, at: asked.Add(d.RetryAfter)}
	close(l.learned)
	l.learned = make(chan struct{})
}

// pass gives up the turn held, to the next waiter.
func (l *lane) pass() { <-l.turn }
