package migration

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/shadow"
	"github.com/throttlekit/throttlekit/throttler"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// mem returns a default memory backend.
func mem(t testing.TB) *memory.Backend {
	t.Helper()
	b, err := memory.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// percent is flags.NewPercent for a p the test knows is valid.
func percent(t testing.TB, p int) *flags.Percent {
	t.Helper()
	r, err := flags.NewPercent(p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// newMigration is New for arguments the test knows are valid, closed when
// the test ends.
func newMigration(t *testing.T, old, new throttler.Backend, r flags.Rollout, opts *Options) *Migration {
	t.Helper()
	m, err := New(old, new, r, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// TestNewErrors: every refusal names what the caller passed; none leaves a
// worker running (TestMain checks that).
func TestNewErrors(t *testing.T) {
	var nilMem *memory.Backend
	var nilPct *flags.Percent
	tests := []struct {
		name     string
		old, new throttler.Backend
		rollout  flags.Rollout
		opts     *Options
		want     string
	}{
		{"nil old", nil, mem(t), percent(t, 0), nil, "migration: old backend is nil"},
		{"nil new", mem(t), nil, percent(t, 0), nil, "migration: new backend is nil"},
		{"typed nil old", nilMem, mem(t), percent(t, 0), nil, "migration: old backend is a nil *memory.Backend"},
		{"typed nil new", mem(t), nilMem, percent(t, 0), nil, "migration: new backend is a nil *memory.Backend"},
		{"nil rollout", mem(t), mem(t), nil, nil, "migration: rollout is nil; pass flags.NewPercent(0) to keep every key on old"},
		{"typed nil rollout", mem(t), mem(t), nilPct, nil, "migration: rollout is a nil *flags.Percent"},
		{"bad forward options", mem(t), mem(t), percent(t, 0), &Options{Forward: &shadow.Options{Workers: -1}},
			"migration: Options.Forward.Workers is -1; want 0 (default 8) or more"},
		{"bad reverse options", mem(t), mem(t), percent(t, 0), &Options{Reverse: &shadow.Options{Timeout: -time.Second}},
			"migration: Options.Reverse.Timeout is -1s; want 0 (default 100ms) or more"},
		{"negative Settle", mem(t), mem(t), percent(t, 0), &Options{Settle: -time.Nanosecond},
			"migration: Options.Settle is -1ns; want 0 (default 30s) or more"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := New(tt.old, tt.new, tt.rollout, tt.opts)
			if m != nil || err == nil || err.Error() != tt.want {
				if m != nil {
					m.Close()
				}
				t.Fatalf("New = %v, %v; want error %q", m, err, tt.want)
			}
		})
	}
}

// A population runs through the stages inside one window. No client is
// admitted more than its limit across any switch: with mirroring on and a
// Flush at every switch, the moved keys find their counts in the other
// store; with mirroring off, the moved keys are served by both stores
// (every change here is within the window, so every moved key is moving).
// A rollout that hides its percentage turns the moving keys off: with the
// mirror and the Flush that is still exact, and without the mirror the same
// ramp hands the moved clients fresh windows, which proves the check can
// fail.
func TestStagesKeepCountsWarm(t *testing.T) {
	stages := []int{0, 10, 50, 0, 100}
	cases := []struct {
		mirror, hide  bool
		wantOverLimit bool
	}{
		{mirror: true},
		{mirror: false},
		{mirror: true, hide: true},
		{mirror: false, hide: true, wantOverLimit: true},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("mirror=%v,hidden=%v", tc.mirror, tc.hide), func(t *testing.T) {
			ctx := context.Background()
			p := throttler.Policy{Name: "api", Limit: 5, Window: time.Minute}
			now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
			rollout := percent(t, 0)
			rollout.SetMirror(tc.mirror)
			var r flags.Rollout = rollout
			if tc.hide {
				r = opaque{rollout}
			}
			m := newMigration(t, mem(t), mem(t), r, nil)

			const clients = 300
			admitted := make([]int64, clients)
			over := 0
			for _, pct := range stages {
				if err := rollout.Set(pct); err != nil {
					t.Fatal(err)
				}
				for c := range clients {
					for range 3 {
						d, err := m.Take(ctx, fmt.Sprint("client-", c), p, 1, now)
						if err != nil {
							t.Fatal(err)
						}
						if d.Allowed {
							admitted[c]++
						}
					}
				}
				now = now.Add(time.Second) // every stage inside the one window
				// The stage boundary: every mirrored call has landed before
				// the percentage moves again.
				if err := m.Flush(ctx); err != nil {
					t.Fatal(err)
				}
			}
			for c, n := range admitted {
				if n > p.Limit {
					over++
					if !tc.wantOverLimit {
						t.Errorf("client-%d admitted %d in one window, limit %d", c, n, p.Limit)
					}
				}
			}
			if tc.wantOverLimit && over == 0 {
				t.Fatalf("without mirroring or moving keys no client got a fresh window; the check cannot fail")
			}
			st := m.Stats()
			if moved := st.Moving.Calls != 0; moved == tc.hide {
				t.Errorf("hidden %v, yet %d moving keys' calls", tc.hide, st.Moving.Calls)
			}
			if !tc.mirror {
				if st.Forward.Results+st.Reverse.Results != 0 {
					t.Errorf("mirroring off, yet results were recorded: %+v", st)
				}
				return
			}
			for name, s := range map[string]shadow.Stats{"forward": st.Forward, "reverse": st.Reverse} {
				if s.Mismatched != 0 || s.ByKind[shadow.Dropped] != 0 {
					t.Errorf("%s: compared %d, mismatched %d, dropped %d", name, s.Compared, s.Mismatched, s.ByKind[shadow.Dropped])
				}
			}
			// Every call was compared or, a moving key's, made on both stores.
			if got := st.Forward.Compared + st.Reverse.Compared + st.Moving.Calls; got != uint64(len(stages)*clients*3) {
				t.Errorf("%d calls compared or moving, want every one", got)
			}
			if st.Routed.New == 0 || st.Routed.Old == 0 {
				t.Errorf("routing did not use both stores: %+v", st.Routed)
			}
		})
	}
}

func TestMirrorOption(t *testing.T) {
	ctx := context.Background()
	p := throttler.PerMinute(10)
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		name    string
		rollout flags.Rollout
		opts    *Options
		want    uint64 // forward results after one call
	}{
		{"rollout without a mirror setting never mirrors", onlyOld{}, nil, 0},
		{"Mirror overrides the rollout", onlyOld{}, &Options{Mirror: func() bool { return true }}, 1},
		{"forward Enabled must agree too", onlyOld{}, &Options{Mirror: func() bool { return true },
			Forward: &shadow.Options{Enabled: func() bool { return false }}}, 0},
		{"0% keeps keys old", percent(t, 0), &Options{Mirror: func() bool { return true }}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := newMigration(t, mem(t), mem(t), tc.rollout, tc.opts)
			if _, err := m.Take(ctx, "k", p, 1, now); err != nil {
				t.Fatal(err)
			}
			if err := m.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			st := m.Stats()
			if st.Forward.Results != tc.want || st.Routed.Old != 1 {
				t.Errorf("forward results %d (want %d), routed %+v", st.Forward.Results, tc.want, st.Routed)
			}
		})
	}
}

type onlyOld struct{}

func (onlyOld) UseNew(string) bool { return false }

// Bad input is rejected by the store that serves the key, returned as it
// is, and mirrored to neither.
func TestBadInput(t *testing.T) {
	rollout := percent(t, 50)
	rollout.SetMirror(true)
	m := newMigration(t, mem(t), mem(t), rollout, nil)
	ctx := context.Background()
	_, err := m.Take(ctx, "", throttler.PerMinute(1), 1, time.Unix(0, 0))
	if !errors.Is(err, throttler.ErrInvalidKey) || err.Error() != "throttler: invalid key: empty" {
		t.Fatalf("got %v, want the backend's ErrInvalidKey as it is", err)
	}
	if err := m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if st := m.Stats(); st.Forward.Results+st.Reverse.Results != 0 || st.Routed.Old+st.Routed.New != 1 {
		t.Errorf("a bad call was mirrored or not routed once: %+v", st)
	}
}

func TestInProcessAndRouting(t *testing.T) {
	ctx, p := context.Background(), throttler.PerMinute(3)
	m := newMigration(t, mem(t), mem(t), percent(t, 100), nil)
	if _, err := m.Take(ctx, "k", p, 1, t0); err != nil {
		t.Fatal(err)
	}
	if st := m.Stats().Routed; !m.Traits().InProcess || st.New != 1 || st.Old != 0 {
		t.Errorf("two memory stores at 100%%: InProcess %v, routed %+v; want true, on new", m.Traits().InProcess, st)
	}
	m2 := newMigration(t, mem(t), struct{ throttler.Backend }{mem(t)}, percent(t, 0), nil)
	if _, err := m2.Take(ctx, "k", p, 1, t0); err != nil {
		t.Fatal(err)
	}
	if st := m2.Stats().Routed; m2.Traits().InProcess || st.Old != 1 || st.New != 0 {
		t.Errorf("a store that may block at 0%%: InProcess %v, routed %+v; want false, on old", m2.Traits().InProcess, st)
	}
}
