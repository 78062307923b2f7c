package migration

import (
	"context"
	"fmt"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/internal/rollout"
	"github.com/throttlekit/throttlekit/throttler"
)

// Moving keys (docs/migration.md, "Moving keys").
//
// The shadows mirror in the background, through queues that drop calls
// when full, so when the percentage moves a key, the store it moves to may
// be short of its recent calls: served from there alone, the key would get
// a fresh window or a refilled bucket. So a key is MOVING while its route
// under a percentage this process saw within horizon(p) + Settle differs
// from its route now, and a moving key's calls go to both stores,
// synchronously; the answer is the stricter one. Every process that has
// seen the change calls both stores, and one that has not yet seen it (it
// sees it within Settle) serves the key from the store it was on, so that
// store sees every call until every process has switched; the store the
// key moves to sees every call from then on, and horizon(p) later the
// calls it missed can no longer change an answer, so it serves alone.
// Two algorithms remember longer than their windows, and the store the key
// moves to is brought in line while it moves: a fixed window's is made to
// open its windows where the other store did (phased), a token bucket's is
// emptied down to the other's level (level).

// maxMarks bounds the history; beyond it the two oldest marks merge, which
// only ever treats more keys as moving.
const maxMarks = 32

// mark records percentages this process routed by until a change it saw
// at until (monotonic time): a key whose bucket lies between lo and hi and
// the current percentage was routed elsewhere then. A mark is one
// percentage (lo == hi) unless merged.
type mark struct {
	lo, hi int
	until  time.Duration
}

// history is what a mover knows, replaced whole on a change so that a call
// reads it with one atomic load.
type history struct {
	cur   int    // the percentage last seen
	marks []mark // oldest first; until ascending
}

// mover tracks the changes of a rollout's percentage seen by this process.
//
// Once it has seen one, every call needs the monotonic time, and reading
// the clock costs 20 to 100 ns; so from the first change on, a goroutine
// keeps a copy every tick, which lags the clock by a tick at most: a key
// is then moving up to a tick longer, never shorter.
type mover struct {
	pct     percenter
	bucket  rollout.Bucketer
	settle  time.Duration
	mono    func() time.Duration
	hist    atomic.Pointer[history]
	mu      sync.Mutex // serializes changes of hist, and start and stop of the ticker
	changes atomic.Uint64

	// The copy of mono kept by the ticker, valid while ticking.
	coarse  atomic.Int64
	ticking atomic.Bool
	tick    time.Duration // 0: no ticker (an injected clock is read directly)
	stop    chan struct{} // closed by close
	done    chan struct{} // closed when the ticker has stopped
	closed  bool
}

// clock returns the monotonic time, or the ticker's copy.
func (mv *mover) clock() time.Duration {
	if mv.ticking.Load() {
		return time.Duration(mv.coarse.Load())
	}
	return mv.mono()
}

// startTicker starts the ticker unless it runs, was stopped, or the clock
// is injected. mv.mu is held.
func (mv *mover) startTicker() {
	if mv.tick == 0 || mv.ticking.Load() || mv.closed {
		return
	}
	mv.coarse.Store(int64(mv.mono()))
	mv.ticking.Store(true)
	mv.done = make(chan struct{})
	go func() {
		defer close(mv.done)
		t := time.NewTicker(mv.tick)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				mv.coarse.Store(int64(mv.mono()))
			case <-mv.stop:
				return
			}
		}
	}()
}

// close stops the ticker and waits for it; calls go on reading the clock.
func (mv *mover) close() {
	mv.mu.Lock()
	if mv.closed {
		mv.mu.Unlock()
		return
	}
	mv.closed = true
	mv.ticking.Store(false)
	close(mv.stop)
	done := mv.done
	mv.mu.Unlock()
	if done != nil {
		<-done
	}
}

// percenter is a rollout that tells its percentage: it routes a key to
// the new store when Bucket(GroupID(), key) <= Percent() (see
// flags.Rollout). flags.Percent, flags.File and a source made by
// unleash.NewPercent are; a GroupID of "" says the rollout is not one
// percentage after all (a source made by unleash.New).
type percenter interface {
	Percent() int
	GroupID() string
}

// init sets up mv for pc, with mono as its monotonic clock (nil: the
// process's, kept by a ticker).
func (mv *mover) init(pc percenter, settle time.Duration, mono func() time.Duration) {
	mv.pct, mv.bucket, mv.settle, mv.mono, mv.stop = pc, rollout.NewBucketer(pc.GroupID()), settle, mono, make(chan struct{})
	if mono == nil {
		epoch := time.Now()
		mv.mono = func() time.Duration { return time.Since(epoch) }
		// A tick of a 32nd of Settle makes keys move at most 3% longer.
		mv.tick = min(max(settle/32, time.Millisecond), time.Second)
	}
	mv.hist.Store(&history{cur: min(max(pc.Percent(), 0), 100)})
}

// route returns where key goes under pct, and whether it is moving: routed
// elsewhere under a percentage seen within horizon(p) + Settle. h is the
// history the caller loaded; pct the percentage it read.
func (mv *mover) route(h *history, pct int, key string, p throttler.Policy) (toNew, moving bool) {
	return mv.routeWithin(h, pct, key, horizon(p))
}

// routeWithin is route for a limit whose old state can change an answer
// for horizon after a change (a policy's horizon, a lease's TTL).
func (mv *mover) routeWithin(h *history, pct int, key string, horizon time.Duration) (toNew, moving bool) {
	if pct != h.cur {
		h = mv.observe(pct)
	}
	// h.cur may be newer than pct (another call saw a later change):
	// either may be the current route.
	lo, hi := min(pct, h.cur), max(pct, h.cur)
	if n := len(h.marks); n > 0 {
		now, span := mv.clock(), addSat(horizon, mv.settle)
		for i := n - 1; i >= 0 && now-h.marks[i].until < span; i-- {
			lo, hi = min(lo, h.marks[i].lo), max(hi, h.marks[i].hi)
		}
	}
	// A key of bucket b is new under q iff b <= q (b is 1 to 100): its route
	// differs between two percentages iff b lies above the lower one and
	// at or below the higher one.
	b := mv.bucket.Bucket(key)
	return b <= pct, lo < b && b <= hi
}

// observe records that the percentage is now pct, unless another call did.
func (mv *mover) observe(pct int) *history {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	h := mv.hist.Load()
	if h.cur == pct {
		return h
	}
	marks := make([]mark, len(h.marks), len(h.marks)+1)
	copy(marks, h.marks)
	marks = append(marks, mark{lo: h.cur, hi: h.cur, until: mv.mono()})
	if len(marks) > maxMarks {
		marks[1] = mark{lo: min(marks[0].lo, marks[1].lo), hi: max(marks[0].hi, marks[1].hi), until: marks[1].until}
		marks = marks[1:]
	}
	nh := &history{cur: pct, marks: marks}
	mv.hist.Store(nh)
	mv.changes.Add(1)
	mv.startTicker()
	return nh
}

// horizon is how long a key's old state can still change an answer under
// p: a sliding log forgets an entry after Window; a sliding-window counter
// weighs the previous window, 2·Window; a token bucket refills from empty
// in Capacity·Window/Limit (and is leveled while it moves, see level, for
// under steady load it never refills at all). A fixed window needs
// 2·Window, not one: the
// store a key moves to may have opened its windows at other instants than
// the store it comes from (it missed the call that opened one), and only
// once it counts in the same windows (see phased) may it serve alone.
// Anything else (the store refuses such a policy) gets 2·Window. A
// composite's is the longest of its members': each member's old state
// changes answers as long as it would alone.
func horizon(p throttler.Policy) time.Duration {
	if p.Composite() {
		var h time.Duration
		for _, m := range p.Members() {
			h = max(h, horizon(m))
		}
		return h
	}
	w := p.Window
	if w <= 0 {
		return 0
	}
	switch p.Algorithm {
	case throttler.SlidingLog:
		return w
	case throttler.TokenBucket:
		c, l := p.Capacity(), p.Limit
		if c <= 0 || l <= 0 {
			return w
		}
		hi, lo := bits.Mul64(uint64(c), uint64(w))
		if hi >= uint64(l) {
			return math.MaxInt64
		}
		q, r := bits.Div64(hi, lo, uint64(l))
		if r != 0 {
			q++
		}
		if q > math.MaxInt64 {
			return math.MaxInt64
		}
		return time.Duration(q)
	}
	return addSat(w, w)
}

// addSat is a + b for non-negative durations, at most math.MaxInt64.
func addSat(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// store is one of the two stores, called directly for moving keys.
type store struct {
	b     throttler.Backend
	local bool // its calls never block: no goroutine to call it alongside the other
	isNew bool
}

// strategy is a Migration's rollout as its router sees it: the caller's
// rollout, which also routes each call (the Route and RouteLease methods a
// flags.Router looks for in its rollout), reading the percentage once per
// call and sending a moving key's call to both
// stores (a pair). Without a percentage (a rollout that cannot tell it) it
// routes by the rollout, and no key is ever moving. The mover is inline:
// every call reads it.
type strategy struct {
	mover
	tracked bool // the mover is set up
	rollout flags.Rollout
	// pairs[moving][toNew] are both stores, the serving one first.
	pairs [2][2]*pair
}

var _ flags.Rollout = (*strategy)(nil)

// UseNew is the rollout's: the store that serves key now.
func (s *strategy) UseNew(key string) bool { return s.rollout.UseNew(key) }

// init completes s for m, with mono as the mover's clock (see mover.init).
func (s *strategy) init(m *Migration, settle time.Duration, mono func() time.Duration) {
	if pc, ok := s.rollout.(percenter); ok && pc.GroupID() != "" {
		s.mover.init(pc, settle, mono)
		s.tracked = true
		m.moves = &s.mover
	}
	for i, moving := range []bool{false, true} {
		for j, toNew := range []bool{false, true} {
			s.pairs[i][j] = &pair{m: m, toNew: toNew, moving: moving}
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Route returns where a call for key under p goes, and whether the key is
// moving: its call then goes to the pair of stores, Both(toNew).
func (s *strategy) Route(key string, p throttler.Policy) (toNew, moving bool) {
	if !s.tracked {
		return s.rollout.UseNew(key), false
	}
	pct := min(max(s.pct.Percent(), 0), 100)
	h := s.hist.Load()
	if pct == h.cur && len(h.marks) == 0 {
		return pct == 100 || pct > 0 && s.bucket.Bucket(key) <= pct, false
	}
	return s.route(h, pct, key, p)
}

// Both returns the pair of stores for a moving key's rate calls.
func (s *strategy) Both(toNew bool) throttler.Backend { return s.pairs[1][b2i(toNew)] }

// RouteLease is Route for a lease call: key is moving for the lease's TTL
// plus Settle. The pair is returned whether or not the key is moving: the
// router's Release of a lease it does not know goes to both stores.
func (s *strategy) RouteLease(key string, p throttler.ConcurrencyPolicy) (bool, bool, throttler.LeaseBackend) {
	var toNew, moving bool
	if s.tracked {
		toNew, moving = s.leaseRoute(key, p.TTL)
	} else {
		toNew = s.rollout.UseNew(key)
	}
	return toNew, moving, s.pairs[b2i(moving)][b2i(toNew)]
}

// leaseRoute returns where key's lease calls go, and whether they are
// moving, for leases of ttl.
func (mv *mover) leaseRoute(key string, ttl time.Duration) (toNew, moving bool) {
	pct := min(max(mv.pct.Percent(), 0), 100)
	if h := mv.hist.Load(); pct != h.cur || len(h.marks) != 0 {
		return mv.routeWithin(h, pct, key, ttl)
	}
	return pct == 100 || pct > 0 && mv.bucket.Bucket(key) <= pct, false
}

// pair is both stores, as the backend the strategy hands the router for a
// call on both: a moving key's, or the Release of a lease the router does
// not know (moving or not, see Migration.Release).
type pair struct {
	m      *Migration
	toNew  bool // the new store serves the key
	moving bool
}

func (b *pair) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	return b.m.both(ctx, throttler.OpTake, key, p, cost, time.Time{}, now, b.toNew)
}

func (b *pair) Peek(ctx context.Context, key string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	return b.m.both(ctx, throttler.OpPeek, key, p, 1, time.Time{}, now, b.toNew)
}

func (b *pair) Refund(ctx context.Context, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
	return b.m.both(ctx, throttler.OpRefund, key, p, cost, receipt, now, b.toNew)
}

func (b *pair) Acquire(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (throttler.Decision, error) {
	return b.m.acquireBoth(ctx, key, p, id, now, b.toNew)
}

func (b *pair) Release(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (bool, throttler.Decision, error) {
	return b.m.releaseBoth(ctx, key, p, id, now, b.toNew, b.moving)
}

// movingCounters are the Migration's counts of moving keys' calls.
type movingCounters struct {
	calls, compensated, refundFailed, oneStore, leveled, late atomic.Uint64
}

// movingStats fills in s.Moving.
func (m *Migration) movingStats(s *Stats) {
	ms := &s.Moving
	ms.Calls, ms.Compensated = m.moving.calls.Load(), m.moving.compensated.Load()
	ms.RefundFailed, ms.OneStore = m.moving.refundFailed.Load(), m.moving.oneStore.Load()
	ms.Leveled, ms.Late = m.moving.leveled.Load(), m.moving.late.Load()
	if m.moves != nil {
		ms.Tracked = true
		ms.Changes = m.moves.changes.Load()
	}
}

// both serves a moving key from both stores, toNew saying which one serves
// it now. The router counts the call and names the serving store in its
// error. The serving store failing is the call's error; the other failing
// leaves the serving store's answer (counted in OneStore). A Take is
// admitted only if both admit; when one admits and the other denies, the
// admitting one is refunded the cost, so that neither keeps units nobody
// was given, and the denial is the answer. Otherwise the answer is the
// stricter decision, the serving store's on a tie. Nothing is mirrored.
//
// A Refund goes to both stores with the receipt it was given, the ResetAt
// of the Take's answer, which was the stricter store's (or, for a fixed
// window, the other store's window, s counting in it): a store whose state
// does not fit that receipt refunds nothing (see throttler.Backend), which
// leaves it stricter, never laxer.
func (m *Migration) both(ctx context.Context, op throttler.Op, key string, p throttler.Policy, cost int64, receipt, now time.Time, toNew bool) (throttler.Decision, error) {
	m.moving.calls.Add(1)
	s, o := m.stores[0], m.stores[1]
	if toNew {
		s, o = o, s
	}
	switch {
	case p.Composite():
		if op == throttler.OpTake && hasFixedWindow(p) {
			return m.phasedComposite(ctx, key, p, cost, now, s, o)
		}
	case p.Algorithm == throttler.FixedWindow && (op == throttler.OpTake || op == throttler.OpRefund):
		return m.phased(ctx, op, key, p, cost, receipt, now, s, o)
	}
	// A Refund of a composite is refused by the stores (see
	// throttler.Backend): it ends with the serving store's error.
	sd, serr, od, oerr := m.parallel(ctx, op, key, p, cost, receipt, now, s, o)
	switch {
	case serr != nil:
		if op == throttler.OpTake && oerr == nil && od.Allowed {
			m.giveBack(ctx, o, key, p, cost, od, now)
		}
		return throttler.Decision{}, serr
	case oerr != nil:
		m.moving.oneStore.Add(1)
		return sd, nil
	case op == throttler.OpTake && sd.Allowed != od.Allowed:
		if sd.Allowed {
			m.giveBack(ctx, s, key, p, cost, sd, now)
			return od, nil
		}
		m.giveBack(ctx, o, key, p, cost, od, now)
		return sd, nil
	case p.Composite():
		return m.stricterMembers(ctx, op, key, p, s, sd, od, now), nil
	case op == throttler.OpTake && p.Algorithm == throttler.TokenBucket:
		m.level(ctx, s, key, p, sd, od, now)
	}
	return stricter(sd, od), nil
}

// giveBack refunds cost to st, which admitted d, a Take the call did not admit
// in the end: see compensate, and for a composite compensateMembers.
func (m *Migration) giveBack(ctx context.Context, st store, key string, p throttler.Policy, cost int64, d throttler.Decision, now time.Time) {
	if p.Composite() {
		m.compensateMembers(ctx, st, key, policies(p), cost, decisions(d), nil, now)
		return
	}
	m.compensate(ctx, st, key, p, cost, d.ResetAt, now)
}

// level empties the serving store's token bucket down to the other's,
// when it is fuller. Unlike a window, a bucket never forgets: both stores
// see the same calls once every process has seen the change, but a bucket
// that the mirror left fuller stays fuller by as much for as long as
// calls keep it from filling up, which under steady load is for ever. So
// the store the key moves to is brought to the level of the store it
// comes from, which saw every call before the change, by taking the
// difference: each bucket is full again at its decision's ResetAt, the
// fuller one sooner by the difference's refill time. It rounds up, so the
// serving store ends at most a token stricter, never laxer.
func (m *Migration) level(ctx context.Context, s store, key string, p throttler.Policy, sd, od throttler.Decision, now time.Time) {
	ahead := od.ResetAt.Sub(sd.ResetAt).Milliseconds()
	w := p.Window.Milliseconds()
	if ahead <= 0 || w <= 0 || p.Limit <= 0 {
		return
	}
	ahead = min(ahead, horizon(p).Milliseconds()) // bounds ahead·Limit by Capacity·w
	tokens := min((ahead*p.Limit+w-1)/w, p.Capacity())
	m.moving.leveled.Add(1)
	if d, err := s.b.Take(ctx, key, p, tokens, now); err == nil && !d.Allowed && tokens > 1 {
		// It holds the difference, but a fraction of a token less than
		// rounded up.
		_, _ = s.b.Take(ctx, key, p, tokens-1, now)
	}
}

// parallel makes the call on both stores at once, the caller's context
// bounding both; an in-process other store is simply called first.
func (m *Migration) parallel(ctx context.Context, op throttler.Op, key string, p throttler.Policy, cost int64, receipt, now time.Time, s, o store) (sd throttler.Decision, serr error, od throttler.Decision, oerr error) {
	if o.local {
		od, oerr = backend.Do(ctx, o.b, op, key, p, cost, receipt, now)
		sd, serr = backend.Do(ctx, s.b, op, key, p, cost, receipt, now)
		return sd, serr, od, oerr
	}
	aside := m.aside(ctx, op, key, p, cost, receipt, now, o)
	sd, serr = backend.Do(ctx, s.b, op, key, p, cost, receipt, now)
	a := <-aside
	return sd, serr, a.d, a.err
}

// answer is one store's answer.
type answer struct {
	d   throttler.Decision
	err error
}

// aside makes the call on o on a goroutine of its own. It is apart from
// parallel so that the in-process path allocates nothing.
func (m *Migration) aside(ctx context.Context, op throttler.Op, key string, p throttler.Policy, cost int64, receipt, now time.Time, o store) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		var a answer
		// A panic here would take the process down, not the request.
		defer func() {
			if r := recover(); r != nil {
				a = answer{err: fmt.Errorf("migration: %s backend panicked: %v", m.name(o.isNew), r)}
			}
			ch <- a
		}()
		a.d, a.err = backend.Do(ctx, o.b, op, key, p, cost, receipt, now)
	}()
	return ch
}

// phased is both for a fixed window's Take and Refund. A fixed window
// opens at the call that finds the last one ended, so the store a key
// moves to (s) may count in windows that start at other instants than the
// other store's (o), having missed the call that opened one there. Served
// alone later, it would then admit a new window's Limit while the key's
// window in o, which the clients have been counted in, is still open. So
// o is asked first, and s is called at the start of o's window rather
// than at now: s then opens a window only where o opened one, so from the
// first window of o that starts after s's window ended, s counts in o's
// windows exactly (before that it counts those calls in its own older
// window, which only makes it stricter). A Take that o denies is not made
// on s at all: a denied Take stores nothing. A Refund's receipt is o's
// window's ResetAt (the Take answered with it), which is also s's once s
// counts in o's windows; before that s refunds nothing, staying stricter.
func (m *Migration) phased(ctx context.Context, op throttler.Op, key string, p throttler.Policy, cost int64, receipt, now time.Time, s, o store) (throttler.Decision, error) {
	od, oerr := backend.Do(ctx, o.b, op, key, p, cost, receipt, now)
	if oerr != nil {
		sd, serr := backend.Do(ctx, s.b, op, key, p, cost, receipt, now)
		if serr != nil {
			return throttler.Decision{}, serr
		}
		m.moving.oneStore.Add(1)
		return sd, nil
	}
	if op == throttler.OpTake && !od.Allowed {
		return od, nil
	}
	// The start of o's window, even when it is after now: a process whose
	// clock is ahead opened it, and s must open the same window.
	at := now
	if !od.ResetAt.IsZero() {
		at = od.ResetAt.Add(-p.Window)
	}
	sd, serr := backend.Do(ctx, s.b, op, key, p, cost, receipt, at)
	if serr != nil {
		if op == throttler.OpTake {
			m.compensate(ctx, o, key, p, cost, od.ResetAt, now)
		}
		return throttler.Decision{}, serr
	}
	if op == throttler.OpTake && !sd.Allowed {
		m.compensate(ctx, o, key, p, cost, od.ResetAt, now)
	}
	return inPhase(od, sd, now), nil
}

// inPhase is o's decision made as strict as s's: the window (ResetAt) is
// o's, which is the one the key's clients have been counted in (s's may be
// an older window it is still counting in); the counts are the stricter.
func inPhase(o, s throttler.Decision, now time.Time) throttler.Decision {
	out := o
	if s.Remaining < out.Remaining {
		out.Used, out.Remaining = s.Used, s.Remaining
	}
	if !s.Allowed && out.Allowed {
		out.Allowed = false
		if s.ResetAt.After(out.ResetAt) {
			out.ResetAt = s.ResetAt
		}
		out.RetryAfter = max(out.ResetAt.Sub(now), 0)
	}
	return out
}

// stricter returns the decision that admits less: a denial over an
// admission, the longer wait between two denials, the fewer Remaining
// between two admissions; s (the serving store's) on a tie.
func stricter(s, o throttler.Decision) throttler.Decision {
	switch {
	case s.Allowed != o.Allowed:
		if s.Allowed {
			return o
		}
		return s
	case !s.Allowed:
		if o.RetryAfter > s.RetryAfter {
			return o
		}
		return s
	case o.Remaining < s.Remaining:
		return o
	}
	return s
}

// compensate refunds cost to st, which admitted a Take the call did not
// admit in the end, at the Take's now; receipt is the ResetAt of st's own
// Decision for that Take. So if another call (a clock ahead) opened the
// next window or refilled the bucket in between, st refunds nothing rather
// than credit that: the units stay where the Take counted them.
func (m *Migration) compensate(ctx context.Context, st store, key string, p throttler.Policy, cost int64, receipt, now time.Time) {
	m.moving.compensated.Add(1)
	if _, err := st.b.Refund(ctx, key, p, cost, receipt, now); err != nil {
		m.moving.refundFailed.Add(1)
	}
}

// name is a store's name in errors.
func (m *Migration) name(isNew bool) string {
	if isNew {
		return m.newName
	}
	return m.oldName
}
