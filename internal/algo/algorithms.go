// Package algo is the arithmetic of the token bucket, the sliding log and
// the sliding-window counter, exactly as docs/algorithms.md states it, and
// the Decision of a fixed window (WindowState, PeekState), for the backends
// written in Go (memory, Memcached); the Redis backend's scripts compute the
// same in Lua, and its over-limit cache answers with these functions.
//
// Each function is pure: it takes the stored state (or none), the call and
// its instant t in Unix milliseconds, and returns the Decision, the state
// after the call, and whether that state must be written. A denied Take
// and a Peek never write. Inputs must have passed throttler.ValidateCall.
//
// A Refund names the Take that counted its units by r, that Take's
// Decision.ResetAt in Unix ms (its receipt), and gives units back only to
// the state that counted them: never to a later window or to a bucket that
// has been full since, whatever the clocks of the processes that wrote the
// state. Take and Peek ignore r.
//
// Every product is bounded before it is formed (Policy.Validate bounds
// Burst·Window and Limit·Window by 2^53), so nothing overflows, and every
// division is an integer floor or ceiling.
package algo

import (
	"math/bits"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// TokenBucketState is a token bucket's stored state.
type TokenBucketState struct {
	// Tokens is the bucket's content scaled by the window in ms: one
	// token is Window.Milliseconds() units, so refills stay integers.
	Tokens int64
	// At is the Unix ms of the last refill (t0): a call at or before it
	// refills nothing.
	At int64
	// Window is the policy's window in ms when the state was written: the
	// scale of Tokens. A state of another window (a live policy whose
	// Window changed) reads as no state.
	Window int64
}

// TokenBucket applies op (cost units; Peek ignores it) at t to a token bucket
// whose state is st when stored is true, and a full bucket otherwise.
//
// A state written under another Window reads as none (a full bucket). A
// call at t > At refills (t−At)·Limit scaled units, up to the capacity,
// and moves At to t; a call at t <= At (a clock behind the one that wrote
// the state) refills nothing and leaves At, and its RetryAfter counts from
// At. Take admits c when the bucket holds c tokens; Refund adds tokens back
// (clamped to the capacity) to a stored bucket that is not full only, and
// only while max(t, At) < r: no clock that wrote or reads the state has
// reached the instant the bucket was full again after the Take (later
// Takes only delay that), so a refund never returns tokens that came back
// by refill.
func TokenBucket(p throttler.Policy, st TokenBucketState, stored bool, op throttler.Op, cost, r, t int64) (d throttler.Decision, next TokenBucketState, write bool) {
	w, limit, capacity := p.Window.Milliseconds(), p.Limit, p.Capacity()
	full := capacity * w
	s, t0 := full, t
	if stored = stored && st.Window == w; stored {
		s, t0 = min(max(st.Tokens, 0), full), st.At
	}
	if t > t0 {
		// t−t0 >= ceil(deficit/Limit) is (t−t0)·Limit >= deficit: one
		// multiplication, 128 bits wide, instead of a division.
		if hi, lo := bits.Mul64(uint64(t-t0), uint64(limit)); hi != 0 || lo >= uint64(full-s) {
			s = full
		} else {
			s += int64(lo) // < deficit: no overflow
		}
		t0 = t
	}
	need := w // what one more unit needs: Peek's and Refund's question
	switch op {
	case throttler.OpTake:
		need = cost * w
		if s >= need {
			s -= need
			write = true
		}
		d.Allowed = write
	case throttler.OpRefund:
		// A full bucket takes no refund and stores nothing, as a key
		// with no state does: a backend that dropped a full bucket must
		// answer every later call alike, clocks behind included.
		if stored && s < full && t0 < r {
			s = min(full, s+min(cost, capacity)*w)
			write = true
		}
		d.Allowed = s >= w
	default:
		d.Allowed = s >= w
	}
	d.Limit = capacity
	d.Remaining = s / w
	d.Used = capacity - d.Remaining
	d.ResetAt = time.UnixMilli(t0 + ceilDiv(full-s, limit))
	if !d.Allowed {
		d.RetryAfter = msDuration(t0 - t + ceilDiv(need-s, limit))
	}
	return d, TokenBucketState{Tokens: s, At: t0, Window: w}, write
}

// TokenBucketEnd is when a stored bucket is full again (its ResetAt), in Unix
// ms: from then on it answers like no state at all, so it may be dropped.
func TokenBucketEnd(p throttler.Policy, st TokenBucketState) int64 {
	full := p.Capacity() * p.Window.Milliseconds()
	return st.At + ceilDiv(full-min(max(st.Tokens, 0), full), p.Limit)
}

// CounterState is a sliding-window counter's stored state.
type CounterState struct {
	// K is the index of the newest window with a count: window K covers
	// [K·w, (K+1)·w) in Unix ms.
	K int64
	// Curr counts the units admitted in window K, Prev those in K−1.
	Curr, Prev int64
	// Window is the policy's window in ms when the state was written: the
	// unit of K. A state of another window reads as no state.
	Window int64
}

// Counter applies op at t to a sliding-window counter whose state is st
// when stored is true, and empty otherwise.
//
// Windows are aligned to the epoch. A state written under another Window
// reads as none. A call in window K+1 sees Prev = Curr
// and Curr = 0; later, both are 0. A call in a window before K (a clock
// behind the one that wrote the state) is answered as if made at K·w, and
// its RetryAfter adds the difference. Used weighs Prev by the part of the
// previous window still inside the last Window, rounded up. Stored counts
// above Limit (a Limit lowered while the state lived) read as Limit.
// Refund takes units from Curr only when the call's window (after that
// rule) is the stored K and is the Take's: r == (K+1)·w.
func Counter(p throttler.Policy, st CounterState, stored bool, op throttler.Op, cost, r, t int64) (d throttler.Decision, next CounterState, write bool) {
	w, limit := p.Window.Milliseconds(), p.Limit
	k := floorDiv(t, w)
	e := t - k*w
	var curr, prev, behind int64
	if stored = stored && st.Window == w; stored {
		if k < st.K {
			behind, k, e = st.K*w-t, st.K, 0
		}
		switch k - st.K {
		case 0:
			curr, prev = min(max(st.Curr, 0), limit), min(max(st.Prev, 0), limit)
		case 1:
			prev = min(max(st.Curr, 0), limit)
		}
	}
	// Prev's weight does not change within the call: one division.
	weighted := counterUsed(0, prev, e, w)
	want := int64(1)
	switch op {
	case throttler.OpTake:
		want = cost
		if cost <= limit-curr-weighted {
			curr += cost
			write = true
		}
	case throttler.OpRefund:
		if stored && k == st.K && r == (k+1)*w {
			curr = max(0, curr-min(cost, limit))
			write = true
		}
	}
	used := curr + weighted
	d.Limit, d.Used, d.Remaining = limit, used, max(0, limit-used)
	d.ResetAt = time.UnixMilli((k + 1) * w)
	if op == throttler.OpTake {
		d.Allowed = write
		if !write {
			d.RetryAfter = msDuration(behind + counterWait(limit, curr, prev, want, e, w))
		}
	} else if d.Allowed = d.Remaining >= 1; !d.Allowed {
		d.RetryAfter = msDuration(behind + counterWait(limit, curr, prev, want, e, w))
	}
	return d, CounterState{K: k, Curr: curr, Prev: prev, Window: w}, write
}

// counterUsed is curr + ceil(prev·(w−e)/w).
func counterUsed(curr, prev, e, w int64) int64 { return curr + ceilDiv(prev*(w-e), w) }

// counterWait is the least wait after which a Take of c fits if nothing
// else happens: within this window once Prev's weight has fallen enough,
// or else in the next window as the count moved to Prev falls.
func counterWait(limit, curr, prev, c, e, w int64) int64 {
	if r := limit - curr - c; r >= 0 && prev > 0 {
		if q := r * w / prev; q > 0 {
			return w - q - e
		}
	}
	wait := w - e
	if curr > 0 {
		wait += w - min(w, (limit-c)*w/curr)
	}
	return wait
}

// CounterEnd is when a stored counter pair stops mattering, (K+2)·w in
// Unix ms: both of its windows are then older than the previous one.
func CounterEnd(p throttler.Policy, st CounterState) int64 {
	return (st.K + 2) * p.Window.Milliseconds()
}

// LogEntry is one admitted Take of a sliding log: Units admitted at At
// (Unix ms). Takes of the same ms share an entry.
type LogEntry struct {
	At, Units int64
}

// Log applies op at t to a sliding log, entries sorted by At (oldest
// first) with Units >= 1, empty when none is stored. It works in place: the
// returned slice shares log's array (growing it when an entry must be
// added) and is the state to write when write is true.
//
// An entry is live at t while t < At+w, so after a clock goes back, entries
// "from the future" count. Take admits c when the live units plus c fit in
// Limit; it then drops the entries that ended by t and logs (t, c). Refund
// removes up to c units from the live entries logged at or before r−w,
// newest first: the Take's own entry is the newest of those unless a clock
// behind logged one of the same or an earlier ms later (then units of that
// entry go instead, never more than c), and entries a clock ahead logged
// after the Take are never touched.
// ResetAt is when the newest live entry ends (t+w with none); a denied
// Take's RetryAfter is when enough of the oldest live entries have ended.
//
// Log is LogBuffer.Apply on a buffer made from log for this one call.
func Log(p throttler.Policy, log []LogEntry, op throttler.Op, cost, r, t int64) (d throttler.Decision, next []LogEntry, write bool) {
	sum := int64(0)
	for i := range log {
		sum += log[i].Units
		log[i].Units = sum
	}
	l := LogBuffer{e: log}
	d, write = l.Apply(p, op, cost, r, t)
	next = l.e[l.head:]
	prev := l.base
	for i := range next {
		prev, next[i].Units = next[i].Units, next[i].Units-prev
	}
	return d, next, write
}

// LogBuffer is a sliding log kept in memory from call to call, as the
// memory backend keeps each key's. Apply answers exactly as Log does, but
// it keeps running sums of the units rather than the units, so a call finds
// the live units and a denied Take its RetryAfter by binary search instead
// of a pass over the log, and a Take drops the entries that ended by moving
// an index: a Take costs O(1) amortised, any call O(log n). The zero value
// is an empty log.
type LogBuffer struct {
	// e[head:] is the log, oldest first. In it, Units is the running sum
	// of the units up to and including the entry, from base.
	e    []LogEntry
	head int
	base int64
}

// Apply applies op at t to the log, as Log does (r is a Refund's receipt),
// and reports whether the log changed.
func (l *LogBuffer) Apply(p throttler.Policy, op throttler.Op, cost, r, t int64) (d throttler.Decision, write bool) {
	w, limit := p.Window.Milliseconds(), p.Limit
	first := l.liveFrom(t, w)
	before := l.sumTo(first)
	used := l.sumTo(len(l.e)) - before
	want := int64(1)
	switch op {
	case throttler.OpTake:
		if used, resetAt, ok := l.take(w, limit, first, before, used, cost, t); ok {
			return throttler.Decision{Allowed: true, Limit: limit, Used: used, Remaining: limit - used, ResetAt: time.UnixMilli(resetAt)}, true
		}
		want = cost
	case throttler.OpRefund:
		// Only the live entries logged at or before r−w: [first, to).
		to := l.upTo(first, r-w)
		left := min(cost, l.sumTo(to)-before)
		used -= left
		write = left > 0
		l.removeNewest(to, left)
	}
	d.Limit, d.Used, d.Remaining = limit, used, max(0, limit-used)
	if first < len(l.e) {
		d.ResetAt = time.UnixMilli(l.e[len(l.e)-1].At + w)
	} else {
		d.ResetAt = time.UnixMilli(t + w)
	}
	if op == throttler.OpTake {
		d.Allowed = write
	} else {
		d.Allowed = used+1 <= limit
	}
	if !d.Allowed {
		// The oldest live entries end first: wait for the first one by
		// which the live units reach used+want−Limit (<= used, so found).
		need := before + used + want - limit
		lo, hi := first, len(l.e)-1
		for lo < hi {
			if m := int(uint(lo+hi) >> 1); l.e[m].Units >= need {
				hi = m
			} else {
				lo = m + 1
			}
		}
		d.RetryAfter = msDuration(l.e[lo].At + w - t)
	}
	return d, write
}

// Take is Apply's Take of cost at t when it is admitted: it logs the
// units and returns the Decision's Used and ResetAt (Unix ms, which is also
// the log's End). When cost does not fit it changes nothing and reports
// false; Apply answers that call. Hot paths call it first to skip building
// the general Decision.
func (l *LogBuffer) Take(p throttler.Policy, cost, t int64) (used, resetAt int64, ok bool) {
	w := p.Window.Milliseconds()
	first := l.liveFrom(t, w)
	before := l.sumTo(first)
	return l.take(w, p.Limit, first, before, l.sumTo(len(l.e))-before, cost, t)
}

// take admits cost at t if it fits with the used units live from first
// (before: the running sum before first): it drops the entries that ended
// by t and logs (t, cost).
func (l *LogBuffer) take(w, limit int64, first int, before, used, cost, t int64) (int64, int64, bool) {
	if used+cost > limit {
		return 0, 0, false
	}
	l.head, l.base = first, before
	l.insert(t, cost)
	return used + cost, l.e[len(l.e)-1].At + w, true
}

// End is when the log stops mattering, as LogEnd: when its newest entry
// ends, or at once (0) when it is empty.
func (l *LogBuffer) End(p throttler.Policy) int64 {
	if len(l.e) == l.head {
		return 0
	}
	return l.e[len(l.e)-1].At + p.Window.Milliseconds()
}

// Len is the number of entries held.
func (l *LogBuffer) Len() int { return len(l.e) - l.head }

// liveFrom returns the index of the first entry live at t: entries are
// sorted by At, so the live ones are a suffix. Before a Take's drop only
// the entries that ended since the last Take precede it, usually one or
// none, so it gallops from the front: O(1) then, O(log n) at worst.
func (l *LogBuffer) liveFrom(t, w int64) int {
	lo, n := l.head, len(l.e)
	if lo == n || l.e[lo].At+w > t {
		return lo
	}
	// e[lo] ended; find the first live one in (lo, hi].
	hi := lo + 1
	for step := 2; hi < n && l.e[hi].At+w <= t; step *= 2 {
		lo, hi = hi, min(hi+step, n)
	}
	for lo+1 < hi {
		if m := int(uint(lo+hi) >> 1); l.e[m].At+w > t {
			hi = m
		} else {
			lo = m
		}
	}
	return hi
}

// sumTo is the running sum before entry i (base before the first).
func (l *LogBuffer) sumTo(i int) int64 {
	if i == l.head {
		return l.base
	}
	return l.e[i-1].Units
}

// insert adds c units at t, merging with an entry of the same ms; an entry
// from a later ms (a clock gone back) keeps its place.
func (l *LogBuffer) insert(t, c int64) {
	n := len(l.e)
	if l.head == n {
		// Everything was dropped: start again at the array's front.
		l.e, l.head, l.base, n = l.e[:0], 0, 0, 0
	}
	if n < cap(l.e) && (n == l.head || l.e[n-1].At < t) {
		// The usual case: a new ms, appended in room the array has.
		l.e = l.e[:n+1]
		l.e[n] = LogEntry{At: t, Units: l.sumTo(n) + c}
		return
	}
	i := n
	for i > l.head && l.e[i-1].At > t {
		i--
	}
	if i > l.head && l.e[i-1].At == t {
		for j := i - 1; j < n; j++ {
			l.e[j].Units += c
		}
		return
	}
	if n == cap(l.e) && l.head >= n-l.head {
		// The array is full and at least half of it ended: reuse it
		// rather than let append grow it, rebasing the sums.
		for j := l.head; j < n; j++ {
			l.e[j-l.head] = LogEntry{At: l.e[j].At, Units: l.e[j].Units - l.base}
		}
		i, n = i-l.head, n-l.head
		l.e, l.head, l.base = l.e[:n], 0, 0
	}
	prev := l.sumTo(i)
	l.e = append(l.e, LogEntry{})
	copy(l.e[i+1:], l.e[i:n])
	for j := i + 1; j <= n; j++ {
		l.e[j].Units += c
	}
	l.e[i] = LogEntry{At: t, Units: prev + c}
}

// upTo returns the index after the last entry from first on logged at or
// before at (entries are sorted by At).
func (l *LogBuffer) upTo(first int, at int64) int {
	lo, hi := first, len(l.e)
	for lo < hi {
		if m := int(uint(lo+hi) >> 1); l.e[m].At <= at {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// removeNewest takes left units (no more than the entries before to hold)
// from the entries before to, newest first, dropping each it empties; the
// entries from to on keep their units, their running sums lowered.
func (l *LogBuffer) removeNewest(to int, left int64) {
	if left == 0 {
		return
	}
	from := to // the emptied entries are [from, to)
	part := left
	for from > l.head {
		u := l.e[from-1].Units - l.sumTo(from-1)
		if u > part {
			break
		}
		from, part = from-1, part-u
	}
	if part > 0 {
		l.e[from-1].Units -= part
	}
	for i := to; i < len(l.e); i++ {
		l.e[i].Units -= left
	}
	l.e = append(l.e[:from], l.e[to:]...)
	if len(l.e) == l.head {
		l.e, l.head, l.base = l.e[:0], 0, 0
	}
}

// LogEnd is when a stored log stops mattering, in Unix ms: when its newest
// entry ends (or at once, for an empty log).
func LogEnd(p throttler.Policy, log []LogEntry) int64 {
	if len(log) == 0 {
		return 0
	}
	return log[len(log)-1].At + p.Window.Milliseconds()
}

func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

// floorDiv rounds towards minus infinity, for instants before 1970 too.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

func msDuration(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }
