package migration

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/throttler"
)

// stalling is a store whose Take runs during, once, before it answers: a
// call in flight while the test changes the rollout and moves the clock.
type stalling struct {
	throttler.Backend
	once   sync.Once
	during func()
}

func (s *stalling) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	s.once.Do(s.during)
	return s.Backend.Take(ctx, key, p, cost, now)
}

// TestLateCalls: a Take one store serves alone, in flight while this
// process sees a change of percentage, is late when it is answered more
// than LateAfter (1s) after the process saw the change and the change moved
// its key; it is counted and passed to OnLate once. A key the change does
// not move, an answer within LateAfter, or a change the process sees only
// after the call, is not late.
func TestLateCalls(t *testing.T) {
	p := throttler.Policy{Name: "fw", Limit: 5, Window: time.Second}
	moved, stays := keyIn(t, 0, 50), keyIn(t, 50, 100)
	tests := []struct {
		name string
		from int // the percentage the call is routed by
		to   int // the percentage the process sees during the call
		key  string
		// stall is how long the call is answered after the process saw the
		// change; seen says whether the process saw it during the call.
		stall time.Duration
		seen  bool
		late  time.Duration // 0: not late
	}{
		{"moved old → new, answered 2s after", 0, 50, moved, 2 * time.Second, true, 2 * time.Second},
		{"moved new → old, answered 2s after", 50, 0, moved, 2 * time.Second, true, 2 * time.Second},
		{"moved, answered at LateAfter", 0, 50, moved, time.Second, true, 0},
		{"moved, answered just after LateAfter", 0, 50, moved, time.Second + time.Millisecond, true, time.Second + time.Millisecond},
		{"not moved by the change", 0, 50, stays, 2 * time.Second, true, 0},
		{"the change seen only after the call", 0, 50, moved, 2 * time.Second, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c monoClock
			c.set(time.Hour)
			r, err := flags.NewPercent(tt.from)
			if err != nil {
				t.Fatal(err)
			}
			r.SetMirror(true)
			old, nu := &stalling{Backend: mem(t)}, &stalling{Backend: mem(t)}
			var reported []string
			var m *Migration
			during := func() {
				if err := r.Set(tt.to); err != nil {
					t.Error(err)
				}
				if tt.seen { // another call of this process reads the change
					if _, err := m.Peek(context.Background(), stays, p, t0); err != nil {
						t.Error(err)
					}
				}
				c.set(c.now() + tt.stall)
			}
			if tt.from == 0 {
				old.during = during
				nu.during = func() {}
			} else {
				nu.during = during
				old.during = func() {}
			}
			m = c.migration(t, old, nu, r, &Options{Settle: 2 * time.Second, LateAfter: time.Second,
				OnLate: func(key string, p throttler.Policy, late time.Duration) {
					reported = append(reported, key+" "+p.Name+" "+late.String())
				}})
			if _, err := m.Take(context.Background(), tt.key, p, 1, t0); err != nil {
				t.Fatal(err)
			}
			var want []string
			if tt.late > 0 {
				want = []string{tt.key + " fw " + tt.late.String()}
			}
			if got := m.Stats().Moving.Late; got != uint64(len(want)) || strings.Join(reported, ";") != strings.Join(want, ";") {
				t.Errorf("Moving.Late %d, OnLate %q; want %d, %q", got, reported, len(want), want)
			}
		})
	}
}

// TestLateAfterOption: LateAfter defaults to Settle/2 and is refused
// beyond Settle or below 0, naming the field.
func TestLateAfterOption(t *testing.T) {
	r, err := flags.NewPercent(0)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		opts Options
		want string // "" for no error
	}{
		{Options{}, ""},
		{Options{Settle: time.Second, LateAfter: time.Second}, ""},
		{Options{Settle: time.Second, LateAfter: time.Second + 1}, "migration: Options.LateAfter is 1.000000001s; want 0 (default Settle/2) to Settle (1s)"},
		{Options{LateAfter: -1}, "migration: Options.LateAfter is -1ns; want 0 (default Settle/2) to Settle (30s)"},
	} {
		m, err := New(mem(t), mem(t), r, &tc.opts)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.opts, err)
		case tc.want != "" && (err == nil || err.Error() != tc.want):
			t.Errorf("%+v: error %v, want %q", tc.opts, err, tc.want)
		}
		if err == nil {
			if tc.opts.LateAfter == 0 && m.lateAfter != defaultSettle/2 {
				t.Errorf("default LateAfter %v, want %v", m.lateAfter, defaultSettle/2)
			}
			_ = m.Close()
		}
	}
}
