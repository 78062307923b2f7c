package shadow

import (
	"sync"
	"sync/atomic"
)

// Stats is a snapshot of a Backend's comparisons. It is a value: later comparisons do not change
// it.
type Stats struct {
	// Results counts every Result published: compared, failed or dropped.
	Results uint64
	// Compared counts the pairs where both sides answered without error.
	Compared uint64
	// Mismatched counts the compared pairs whose decisions really differ (Result.Mismatch):
	// neither Reordered nor Late (counted in ByKind[Reordered] and ByKind[Late]) nor ignored. Mismatched/Compared is the
	// mismatch rate. Healthy: 0.
	Mismatched uint64
	// Ignored counts the differences that Options.Ignore accepted.
	Ignored uint64
	// ByKind counts the Results that carried each single kind: ByKind[Dropped] is how many
	// calls were dropped. The difference kinds count mismatches only: a Reordered (or Late) pair
	// counts under Reordered (or Late) alone, and an ignored difference not at all. Kinds never
	// seen are absent, and read as 0.
	ByKind map[Kind]uint64
	// LastMismatches holds the latest mismatches, oldest first, at most Options.KeepMismatches.
	LastMismatches []Result
	// Queued is how many calls were waiting for a worker when the snapshot was taken (the
	// batches being worked through are not included). It never exceeds Workers*QueueSize.
	Queued int
	// PublishPanics counts the panics recovered from Options.Publish: each is a Result that the
	// hook did not take in. Healthy: 0.
	PublishPanics uint64
	// PublishDropped counts the drops never passed to Options.Publish: the queue where drops
	// wait for it was full (Publish is slower than calls drop), or Close had stopped
	// publishing. Every Result counted in Results is passed to Publish or counted here.
	// Healthy: 0.
	PublishDropped uint64
	// IgnorePanics counts the panics recovered from Options.Ignore; each such difference was
	// counted as a mismatch. Healthy: 0.
	IgnorePanics uint64
}

// tally counts Results on one goroutine, without atomics; a worker adds its tally to its counters
// once per batch.
type tally struct {
	results, compared, mismatched, ignored uint64
	byKind                                 [len(kinds)]uint64
}

// add counts r and reports whether it is a mismatch.
func (t *tally) add(r *Result) bool {
	t.results++
	if r.compared() {
		t.compared++
	}
	k := r.Kinds
	if r.Ignored {
		t.ignored++
		k &^= differs
	}
	if k&explained != 0 {
		k &^= differs
	}
	for i, x := range kinds {
		if k&x != 0 {
			t.byKind[i]++
		}
	}
	if r.Mismatch() {
		t.mismatched++
		return true
	}
	return false
}

// counters are the totals that Stats reads. Each worker has its own, so that workers never contend
// on a cache line.
type counters struct {
	results, compared, mismatched, ignored atomic.Uint64
	byKind                                 [len(kinds)]atomic.Uint64
	_                                      [64]byte
}

// absorb adds t to c and zeroes t.
func (c *counters) absorb(t *tally) {
	if t.results == 0 {
		return
	}
	c.results.Add(t.results)
	c.compared.Add(t.compared)
	if t.mismatched > 0 {
		c.mismatched.Add(t.mismatched)
	}
	if t.ignored > 0 {
		c.ignored.Add(t.ignored)
	}
	for i, n := range t.byKind {
		if n > 0 {
			c.byKind[i].Add(n)
		}
	}
	*t = tally{}
}

func (c *counters) addTo(s *Stats) {
	s.Results += c.results.Load()
	s.Compared += c.compared.Load()
	s.Mismatched += c.mismatched.Load()
	s.Ignored += c.ignored.Load()
	for i, x := range kinds {
		if n := c.byKind[i].Load(); n > 0 {
			s.ByKind[x] += n
		}
	}
}

// ring keeps the latest mismatches. Only mismatches, which should be rare, take its lock.
type ring struct {
	mu   sync.Mutex
	buf  []Result // circular
	next int      // where the next mismatch goes
	full bool
}

func (g *ring) init(keep int) { g.buf = make([]Result, keep) }

func (g *ring) add(r Result) {
	g.mu.Lock()
	g.buf[g.next] = r
	g.next++
	if g.next == len(g.buf) {
		g.next, g.full = 0, true
	}
	g.mu.Unlock()
}

// appendTo appends the kept mismatches to dst, oldest first.
func (g *ring) appendTo(dst []Result) []Result {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.full {
		dst = append(dst, g.buf[g.next:]...)
	}
	return append(dst, g.buf[:g.next]...)
}
