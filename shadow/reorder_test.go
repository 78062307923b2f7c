package shadow

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// TestReorderRule: Options.ReorderSpan's rule on hand-made pairs, at fixed instants: span 100ms, 4
// units, a limit of 10 per second.
func TestReorderRule(t *testing.T) {
	fw := throttler.Policy{Limit: 10, Window: time.Second}
	tb := throttler.Policy{Limit: 10, Window: time.Second, Algorithm: throttler.TokenBucket}
	end := t0.Add(time.Second) // the control's window ends here
	d := func(allowed bool, used int64, reset time.Time, retry time.Duration) throttler.Decision {
		x := dec(allowed, used, reset)
		x.Limit, x.Remaining, x.RetryAfter = 10, max(0, 10-used), retry
		return x
	}
	o := reorder{span: 100 * time.Millisecond, units: 4}
	mid := t0.Add(500 * time.Millisecond)
	tests := []struct {
		name               string
		o                  reorder
		p                  throttler.Policy
		now                time.Time
		control, candidate throttler.Decision
		want               bool
		lag                time.Duration
	}{
		{"further apart, within the span and the call's lag", o, fw, mid, d(true, 5, end, 0), d(true, 5, end.Add(150*time.Millisecond), 0), true, 50 * time.Millisecond},
		{"beyond the span and the call's lag", o, fw, mid, d(true, 5, end, 0), d(true, 5, end.Add(151*time.Millisecond), 0), false, 50 * time.Millisecond},
		{"Used apart by the bound", o, fw, mid, d(true, 5, end, 0), d(true, 9, end, 0), true, 0},
		{"Used apart by more", o, fw, mid, d(true, 5, end, 0), d(true, 10, end, 0), false, 0},
		{"Allowed flips within the bound", o, fw, mid, d(true, 10, end, 0), d(false, 11, end, 500*time.Millisecond), true, 0},
		{"another Limit", o, fw, mid, d(true, 5, end, 0), func() throttler.Decision { x := d(true, 5, end, 0); x.Limit, x.Remaining = 11, 6; return x }(), false, 0},
		{"window opened by another call within the span", o, fw, mid, d(true, 5, end, 0), d(true, 6, end.Add(100*time.Millisecond), 0), true, 0},
		{"window opened further apart", o, fw, mid, d(true, 5, end, 0), d(true, 5, end.Add(101*time.Millisecond), 0), false, 0},
		{"counted in the next window at the end of one", o, fw, end.Add(-100 * time.Millisecond),
			d(false, 10, end, 100*time.Millisecond), d(true, 1, end.Add(time.Second+100*time.Millisecond), 0), true, 0},
		{"the next window, beyond the span", o, fw, end.Add(-100 * time.Millisecond),
			d(false, 10, end, 100*time.Millisecond), d(true, 1, end.Add(time.Second+101*time.Millisecond), 0), false, 0},
		{"a window lost mid-way", o, fw, mid, d(true, 9, end, 0), d(true, 1, mid.Add(time.Second), 0), false, 0},
		{"a window lost mid-way, early", o, fw, mid, d(true, 3, end, 0), d(true, 1, mid.Add(time.Second), 0), false, 0},
		// A bucket's times move by what 4 units take to refill: 400ms.
		{"bucket RetryAfter within span + refill", o, tb, mid, d(false, 10, mid.Add(time.Second), 100*time.Millisecond),
			d(false, 10, mid.Add(time.Second), 600*time.Millisecond), true, 0},
		{"bucket RetryAfter beyond", o, tb, mid, d(false, 10, mid.Add(time.Second), 100*time.Millisecond),
			d(false, 10, mid.Add(time.Second), 601*time.Millisecond), false, 0},
		{"fixed window RetryAfter beyond the span", o, fw, mid, d(false, 10, end, 500*time.Millisecond),
			d(false, 10, end, 601*time.Millisecond), false, 0},
		{"no span: nothing is reordered", reorder{units: 4}, fw, mid, d(true, 5, end, 0), d(true, 6, end, 0), false, 0},
		{"no units: only the boundary", reorder{span: 100 * time.Millisecond}, fw, mid, d(true, 5, end, 0), d(true, 6, end, 0), false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Result{Op: throttler.OpTake, Key: "k", Policy: tt.p, Cost: 1, Now: tt.now, Control: tt.control, Candidate: tt.candidate, Lag: tt.lag}
			r.Kinds = compare(r.Control, r.Candidate, 0, time.Millisecond)
			if r.Kinds&differs == 0 {
				t.Fatalf("the pair does not differ: %+v", r)
			}
			if got := tt.o.explains(&r); got != tt.want {
				t.Errorf("explains = %v, want %v (kinds %v)", got, tt.want, r.Kinds)
			}
		})
	}
}

// offBy is a candidate whose Used is off by a set amount, as a store that saw the key's calls in
// another order would be.
type offBy struct {
	throttler.Backend
	used int64
}

func (o offBy) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	d, err := o.Backend.Take(ctx, key, p, cost, now)
	d.Used += o.used
	d.Remaining = max(0, d.Limit-d.Used)
	return d, err
}

// TestReorderedIsCountedApart: a Reordered pair is published with its kinds, counted under
// Reordered alone, never a mismatch nor asked to Ignore; a pair outside the bound stays a mismatch.
func TestReorderedIsCountedApart(t *testing.T) {
	p := throttler.Policy{Limit: 10, Window: time.Minute}
	for _, tc := range []struct {
		off        int64
		reordered  bool
		mismatched uint64
	}{{2, true, 0}, {3, false, 1}} {
		var mu sync.Mutex
		var published []Result
		ignoreAsked := 0
		s := newShadow(t, mem(t), offBy{mem(t), tc.off}, &Options{
			ReorderSpan: 50 * time.Millisecond, ReorderUnits: 2,
			Publish: func(r Result) { mu.Lock(); published = append(published, r); mu.Unlock() },
			Ignore:  func(Result) bool { mu.Lock(); ignoreAsked++; mu.Unlock(); return false },
		})
		if _, err := s.Take(context.Background(), "k", p, 1, t0); err != nil {
			t.Fatal(err)
		}
		flush(t, s)
		st := s.Stats()
		mu.Lock()
		if len(published) != 1 || (published[0].Kinds&Reordered != 0) != tc.reordered || published[0].Kinds&UsedDiffers == 0 ||
			published[0].Mismatch() == tc.reordered {
			t.Errorf("off by %d: published %+v", tc.off, published)
		}
		if want := map[bool]int{true: 0, false: 1}[tc.reordered]; ignoreAsked != want {
			t.Errorf("off by %d: Ignore asked %d times, want %d", tc.off, ignoreAsked, want)
		}
		mu.Unlock()
		wantReordered := map[bool]uint64{true: 1}[tc.reordered]
		if st.Mismatched != tc.mismatched || st.ByKind[Reordered] != wantReordered || st.ByKind[UsedDiffers] != tc.mismatched ||
			uint64(len(st.LastMismatches)) != tc.mismatched || st.Compared != 1 {
			t.Errorf("off by %d: stats %+v", tc.off, st)
		}
	}
}

// TestReorderRuleComposites: Options.ReorderSpan's rule on a composite's pairs, member by member
// (span 100ms, 4 units), at fixed instants: a composite pair is Reordered exactly when each of its
// members' pairs would be as a single policy's, whichever member binds on each side.
func TestReorderRuleComposites(t *testing.T) {
	fw := throttler.Policy{Name: "s", Limit: 10, Window: time.Second}
	hour := throttler.Policy{Name: "h", Limit: 100, Window: time.Hour}
	log := throttler.Policy{Name: "l", Limit: 100, Window: time.Hour, Algorithm: throttler.SlidingLog}
	tb := throttler.Policy{Name: "b", Limit: 10, Window: time.Second, Algorithm: throttler.TokenBucket}
	end := t0.Add(time.Second)   // fw's window ends here
	hourEnd := t0.Add(time.Hour) // hour's window ends here
	mid := t0.Add(500 * time.Millisecond)
	m := func(p throttler.Policy, allowed bool, used int64, reset time.Time, retry time.Duration) throttler.Decision {
		return throttler.Decision{Allowed: allowed, Limit: p.Limit, Used: used, Remaining: max(0, p.Limit-used), ResetAt: reset, RetryAfter: retry}
	}
	all := func(ms ...throttler.Decision) throttler.Decision { return throttler.Combine(ms) }
	o := reorder{span: 100 * time.Millisecond, units: 4}
	fwHour := throttler.All(fw, hour)
	fwLog := throttler.All(fw, log)
	tests := []struct {
		name               string
		p                  throttler.Policy
		cost               int64
		now                time.Time
		control, candidate throttler.Decision
		want               bool
	}{
		{"the binding member differs, each member within the bound", fwHour, 1, mid,
			all(m(fw, true, 6, end, 0), m(hour, true, 95, hourEnd, 0)),        // fw binds: 4 left
			all(m(fw, true, 5, end, 0), m(hour, true, 97, hourEnd, 0)), true}, // hour binds: 3 left
		{"the binding members agree, another member beyond the bound", fwHour, 1, mid,
			all(m(fw, true, 8, end, 0), m(hour, true, 10, hourEnd, 0)),
			all(m(fw, true, 8, end, 0), m(hour, true, 50, hourEnd, 0)), false},
		{"a member counted in its next window at the end of one", fwHour, 1, end.Add(-100 * time.Millisecond),
			all(m(fw, false, 10, end, 100*time.Millisecond), m(hour, true, 20, hourEnd, 0)),
			all(m(fw, true, 1, end.Add(time.Second+100*time.Millisecond), 0), m(hour, true, 21, hourEnd, 0)), true},
		{"a member's next window beyond the span", fwHour, 1, end.Add(-100 * time.Millisecond),
			all(m(fw, false, 10, end, 100*time.Millisecond), m(hour, true, 20, hourEnd, 0)),
			all(m(fw, true, 1, end.Add(time.Second+101*time.Millisecond), 0), m(hour, true, 21, hourEnd, 0)), false},
		// The control admitted and counted 5 in the log; the candidate's fw denied, so its log
		// counted nothing and shows its state before the call: as the log's own Take it would
		// have counted 5 more and ended an hour from now.
		{"the composite flips: a member that admits on both sides counted on one", fwLog, 5, mid,
			all(m(fw, true, 10, end, 0), m(log, true, 40, mid.Add(time.Hour), 0)),
			all(m(fw, false, 9, end, 500*time.Millisecond), m(log, true, 35, t0.Add(time.Hour), 0)), true},
		{"the composite flips, a member beyond the bound", fwLog, 5, mid,
			all(m(fw, true, 10, end, 0), m(log, true, 40, mid.Add(time.Hour), 0)),
			all(m(fw, false, 9, end, 500*time.Millisecond), m(log, true, 30, t0.Add(time.Hour), 0)), false},
		// The bucket's 4 tokens before the call take 400ms to refill; its own Take of 5 would
		// have left 9 taken, full again 900ms on.
		{"the composite flips: a bucket counted on one side", throttler.All(fw, tb), 5, mid,
			all(m(fw, true, 10, end, 0), m(tb, true, 9, mid.Add(900*time.Millisecond), 0)),
			all(m(fw, false, 9, end, 500*time.Millisecond), m(tb, true, 4, mid.Add(400*time.Millisecond), 0)), true},
		{"a member's Limit differs", fwHour, 1, mid,
			all(m(fw, true, 5, end, 0), m(hour, true, 20, hourEnd, 0)),
			all(m(fw, true, 5, end, 0), func() throttler.Decision {
				x := m(hour, true, 20, hourEnd, 0)
				x.Limit, x.Remaining = 101, 81
				return x
			}()), false},
		{"one side is no composite", fwHour, 1, mid,
			all(m(fw, true, 5, end, 0), m(hour, true, 20, hourEnd, 0)), m(fw, true, 5, end, 0), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Result{Op: throttler.OpTake, Key: "k", Policy: tt.p, Cost: tt.cost, Now: tt.now, Control: tt.control, Candidate: tt.candidate}
			r.Kinds = compare(r.Control, r.Candidate, 0, time.Millisecond)
			if r.Kinds&differs == 0 {
				t.Fatalf("the pair does not differ: %+v", r)
			}
			if got := o.explains(&r); got != tt.want {
				t.Errorf("explains = %v, want %v (kinds %v)", got, tt.want, r.Kinds)
			}
		})
	}
}

// TestReorderedComposite: a composite's call that another process's call overtook on the way to
// the candidate, so that another member binds there, is Reordered through a real shadow, as the
// single policies' calls are; one whose hidden member is off by more is a mismatch.
func TestReorderedComposite(t *testing.T) {
	s := throttler.Policy{Name: "s", Limit: 10, Window: time.Second}
	h := throttler.Policy{Name: "h", Limit: 100, Window: time.Hour}
	c := throttler.All(s, h)
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		extra     int64 // units of h the candidate counted from calls the control has not seen
		reordered bool
	}{{"overtaken by 2", 2, true}, {"off by 20", 20, false}} {
		t.Run(tc.name, func(t *testing.T) {
			control, candidate := mem(t), mem(t)
			// Both saw 5 of s and 96-extra of h; the candidate also counted the extra units of
			// h that other processes' calls took and the control has yet to see. So after the
			// call s binds at the control (4 left to h's 3+extra), h at the candidate (3 left)
			// when extra is 2.
			for _, b := range []throttler.Backend{control, candidate} {
				if _, err := b.Take(ctx, "k", s, 5, t0); err != nil {
					t.Fatal(err)
				}
				if _, err := b.Take(ctx, "k", h, 96-tc.extra, t0); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := candidate.Take(ctx, "k", h, tc.extra, t0); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var published []Result
			sh := newShadow(t, control, candidate, &Options{ReorderSpan: 50 * time.Millisecond, ReorderUnits: 2,
				Publish: func(r Result) { mu.Lock(); published = append(published, r); mu.Unlock() }})
			if _, err := sh.Take(ctx, "k", c, 1, t0.Add(10*time.Millisecond)); err != nil {
				t.Fatal(err)
			}
			flush(t, sh)
			st := sh.Stats()
			mu.Lock()
			defer mu.Unlock()
			if len(published) != 1 || published[0].Kinds&UsedDiffers == 0 || (published[0].Kinds&Reordered != 0) != tc.reordered {
				t.Fatalf("published %+v", published)
			}
			if want := map[bool]uint64{false: 1}[tc.reordered]; st.Mismatched != want {
				t.Errorf("Mismatched = %d, want %d (%+v)", st.Mismatched, want, st)
			}
		})
	}
}

// TestTakenIsTheMembersOwnTake: on a real store, a member of a denied composite that would have
// admitted, made as taken makes it, answers what that member's own Take answers (ResetAt within the
// ms that taken's rounding allows), on every algorithm, with state before the call or not.
func TestTakenIsTheMembersOwnTake(t *testing.T) {
	ctx := context.Background()
	deny := throttler.Policy{Name: "deny", Limit: 10, Window: time.Hour} // spent: denies any cost
	for _, p := range []throttler.Policy{
		{Name: "fw", Limit: 10, Window: time.Second},
		{Name: "tb", Limit: 3, Window: time.Second, Algorithm: throttler.TokenBucket, Burst: 10},
		{Name: "log", Limit: 10, Window: time.Second, Algorithm: throttler.SlidingLog},
		{Name: "sw", Limit: 10, Window: time.Second, Algorithm: throttler.SlidingWindow},
	} {
		for _, before := range []int64{0, 3} {
			for _, cost := range []int64{1, 4} {
				now := t0.Add(1700*time.Millisecond + 300*time.Microsecond)
				composite, alone := mem(t), mem(t)
				for _, b := range []throttler.Backend{composite, alone} {
					if before > 0 {
						if _, err := b.Take(ctx, "k", p, before, t0.Add(1234*time.Millisecond)); err != nil {
							t.Fatal(err)
						}
					}
				}
				if _, err := composite.Take(ctx, "k", deny, 10, t0); err != nil {
					t.Fatal(err)
				}
				c := throttler.All(deny, p)
				d, err := composite.Take(ctx, "k", c, cost, now)
				if err != nil || d.Allowed {
					t.Fatalf("%s: the composite %+v, %v; want denied", p.Name, d, err)
				}
				var m throttler.Decision
				for i, x := range d.Members() {
					if i == 1 {
						m = x
					}
				}
				want, err := alone.Take(ctx, "k", p, cost, now)
				if err != nil || !want.Allowed || !m.Allowed {
					t.Fatalf("%s: alone %+v, %v; member %+v", p.Name, want, err, m)
				}
				got := taken(m, false, p, cost, now)
				if got.Used != want.Used || got.Remaining != want.Remaining ||
					abs(int64(got.ResetAt.Sub(want.ResetAt))) > int64(time.Millisecond) {
					t.Errorf("%s, %d before, cost %d: taken %+v, own Take %+v", p.Name, before, cost, got, want)
				}
			}
		}
	}
}

// slowControl answers with a fixed decision and, while it does, moves the shadow's monotonic
// clock on by took: a control that answered late (a slow round trip, a process starved of CPU).
type slowControl struct {
	throttler.Backend
	d     throttler.Decision
	clock *atomic.Int64
	took  time.Duration
}

func (s slowControl) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	s.clock.Add(int64(s.took))
	return s.d, nil
}

// fixedAnswer answers every Take with d.
type fixedAnswer struct {
	throttler.Backend
	d throttler.Decision
}

func (f fixedAnswer) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	return f.d, nil
}

// TestLateAnswer: a call made 600 ms before the end of its window in the control (limit 40,
// span 400 ms), counted by the candidate in the next window. Answered by the control at once it
// is a mismatch (the candidate lost or misplaced a window); answered 700 ms after the shadow got
// it, the two stores counted it at instants further apart than its now says, and the pair is
// Late, not a mismatch; answered 100 ms late, still a mismatch.
func TestLateAnswer(t *testing.T) {
	p := throttler.Policy{Name: "late", Limit: 40, Window: time.Second}
	end := t0.Add(time.Second)
	now := end.Add(-600 * time.Millisecond)
	control := throttler.Decision{Allowed: false, Limit: 40, Used: 40, Remaining: 0, ResetAt: end, RetryAfter: 600 * time.Millisecond}
	candidate := throttler.Decision{Allowed: true, Limit: 40, Used: 6, Remaining: 34, ResetAt: end.Add(time.Second)}
	for _, tc := range []struct {
		name               string
		took               time.Duration
		mismatched, late   uint64
		wantElapsedAtLeast time.Duration
	}{
		{"answered at once", 0, 1, 0, 0},
		{"answered 100 ms late", 100 * time.Millisecond, 1, 0, 100 * time.Millisecond},
		{"answered 700 ms late", 700 * time.Millisecond, 0, 1, 700 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var clock atomic.Int64
			clock.Store(1)
			var mu sync.Mutex
			var got []Result
			s := newShadow(t, slowControl{mem(t), control, &clock, tc.took}, fixedAnswer{mem(t), candidate},
				&Options{Workers: 1, ReorderSpan: 400 * time.Millisecond, ReorderUnits: 40, Publish: func(r Result) {
					mu.Lock()
					got = append(got, r)
					mu.Unlock()
				}})
			s.mono = clock.Load
			if _, err := s.Take(context.Background(), "k", p, 1, now); err != nil {
				t.Fatal(err)
			}
			if err := s.Flush(context.Background()); err != nil {
				t.Fatal(err)
			}
			st := s.Stats()
			if st.Mismatched != tc.mismatched || st.ByKind[Late] != tc.late || st.ByKind[Reordered] != 0 {
				t.Errorf("mismatched %d, late %d, reordered %d; want %d, %d, 0 (%+v)", st.Mismatched, st.ByKind[Late], st.ByKind[Reordered], tc.mismatched, tc.late, st)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(got) != 1 || got[0].Elapsed < tc.wantElapsedAtLeast || got[0].Elapsed < got[0].Lag {
				t.Errorf("published %+v; want one Result with Elapsed at least %v and its Lag", got, tc.wantElapsedAtLeast)
			}
		})
	}
}
