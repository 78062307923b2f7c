package migration

import (
	"context"
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

// A population runs through the stages inside one window. With mirroring
// on, no client is admitted more than its limit across any switch and both
// shadows agree on every call; with mirroring off, the same ramp hands the
// moved clients fresh windows, which proves the check can fail.
func TestStagesKeepCountsWarm(t *testing.T) {
	stages := []int{0, 10, 50, 0, 100}
	cases := []struct {
		mirror        bool
		wantOverLimit bool
	}{
		{mirror: true, wantOverLimit: false},
		{mirror: false, wantOverLimit: true},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint("mirror=", tc.mirror), func(t *testing.T) {
			ctx := context.Background()
			p := throttler.Policy{Name: "api", Limit: 5, Window: time.Minute}
			now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
			rollout := flags.NewPercent(0)
			rollout.SetMirror(tc.mirror)
			m := New(memory.New(nil), memory.New(nil), rollout, nil)
			defer m.Close()

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
				t.Fatalf("without mirroring no client got a fresh window; the check cannot fail")
			}
			st := m.Stats()
			if !tc.mirror {
				if st.Forward.Results+st.Reverse.Results != 0 {
					t.Errorf("mirroring off, yet results were recorded: %+v", st)
				}
				return
			}
			for name, s := range map[string]shadow.Stats{"forward": st.Forward, "reverse": st.Reverse} {
				if s.Compared == 0 || s.Mismatched != 0 || s.Count(shadow.Dropped) != 0 {
					t.Errorf("%s: compared %d, mismatched %d, dropped %d", name, s.Compared, s.Mismatched, s.Count(shadow.Dropped))
				}
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
		{"nil rollout keeps keys old", nil, &Options{Mirror: func() bool { return true }}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := New(memory.New(nil), memory.New(nil), tc.rollout, tc.opts)
			defer m.Close()
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

func TestBadInput(t *testing.T) {
	m := New(memory.New(nil), memory.New(nil), flags.NewPercent(50), nil)
	defer m.Close()
	if _, err := m.Take(context.Background(), "", throttler.PerMinute(1), 1, time.Unix(0, 0)); !throttler.IsInputError(err) {
		t.Fatalf("got %v, want an input error", err)
	}
}
