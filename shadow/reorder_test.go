package shadow

import (
	"context"
	"sync"
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
