package unleash

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/migration"
	"github.com/throttlekit/throttlekit/throttler"
)

func percentSource(t *testing.T, f *fakeUnleash, group string) (*Rollout, func()) {
	t.Helper()
	c, wait := f.client(t, 5*time.Millisecond)
	wait()
	ps, err := NewPercent(c, "feat", group, &Options{Recheck: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	return ps, wait
}

// TestPercentSourceReadsDefinitions walks one feature through definitions
// a NewPercent source follows and ones it must not, in order: what it cannot
// read keeps the last percentage and says why.
func TestPercentSourceReadsDefinitions(t *testing.T) {
	flex := func(group string, rollout any) map[string]any {
		return strategy("flexibleRollout", map[string]any{"rollout": rollout, "stickiness": "userId", "groupId": group}, nil)
	}
	steps := []struct {
		name    string
		def     map[string]any
		want    int
		problem bool
	}{
		{"rollout 30 in the feature's group", feature(true, flex("feat", "30")), 30, false},
		{"another groupId", feature(true, flex("other", "40")), 30, true},
		{"two rollouts", feature(true, flex("feat", "10"), flex("feat", "60")), 30, true},
		{"a fraction", feature(true, flex("feat", 45.5)), 30, true},
		{"a constraint", feature(true, strategy("flexibleRollout",
			map[string]any{"rollout": "50", "stickiness": "userId", "groupId": "feat"},
			map[string]any{"constraints": []any{map[string]any{"contextName": "appName", "operator": "IN", "values": []any{"x"}}}})), 30, true},
		{"rollout 70", feature(true, flex("feat", "70")), 70, false},
		{"disabled", feature(false, flex("feat", "70")), 0, false},
		{"enabled, no strategy", feature(true), 100, false},
		{"100 in any group", feature(true, flex("other", "100")), 100, false},
		{"default strategy", feature(true, strategy("default", map[string]any{}, nil)), 100, false},
	}
	f := newFakeUnleash(t)
	f.set(steps[0].def)
	ps, wait := percentSource(t, f, "")
	for i, st := range steps {
		if i > 0 {
			f.set(st.def)
			wait()
		}
		if got := ps.Percent(); got != st.want {
			t.Errorf("%s: Percent() = %d, want %d", st.name, got, st.want)
		}
		err := ps.Problem()
		if st.problem != (err != nil) || (err != nil && !errors.Is(err, ErrNotPercent)) {
			t.Errorf("%s: Problem() = %v, want a problem: %v", st.name, err, st.problem)
		}
	}
}

// TestPercentSourceRoutesAsClient: where the feature is one percentage, the
// source's routing is the client's, key by key, in the configured group.
func TestPercentSourceRoutesAsClient(t *testing.T) {
	for _, tc := range []struct {
		group, feature string
		opt            string // NewPercent's group
	}{
		{"feat", "feat", ""},
		{"shared-group", "feat", "shared-group"},
	} {
		f := newFakeUnleash(t)
		def := flexible("feat", tc.group, 37)
		f.set(def)
		ps, _ := percentSource(t, f, tc.opt)
		if ps.GroupID() != tc.group || ps.Percent() != 37 || ps.Problem() != nil {
			t.Fatalf("group %q: GroupID %q, Percent %d, Problem %v", tc.group, ps.GroupID(), ps.Percent(), ps.Problem())
		}
		for _, key := range testKeys(5000) {
			if got, want := ps.UseNew(key), clientSays(ps.c, "feat", key); got != want {
				t.Fatalf("group %q: UseNew(%q) = %v, the client says %v", tc.group, key, got, want)
			}
		}
	}
}

// TestPercentSourceMovesKeysInAMigration: over a NewPercent source, a
// migration knows which keys a change in Unleash moves and sends them to
// both stores (over a source made by New it cannot).
func TestPercentSourceMovesKeysInAMigration(t *testing.T) {
	f := newFakeUnleash(t)
	f.set(flexible("feat", "feat", 0))
	ps, wait := percentSource(t, f, "")
	old, _ := memory.New(nil)
	new, _ := memory.New(nil)
	m, err := migration.New(old, new, ps, &migration.Options{Settle: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	ctx, now, p := context.Background(), time.Unix(1_700_000_000, 0), throttler.PerHour(5)
	keys := testKeys(200)
	for _, k := range keys {
		if _, err := m.Take(ctx, k, p, 1, now); err != nil {
			t.Fatal(err)
		}
	}
	f.set(flexible("feat", "feat", 50))
	wait()
	moved := 0
	for _, k := range keys {
		if ps.UseNew(k) {
			moved++
		}
		if _, err := m.Take(ctx, k, p, 1, now); err != nil {
			t.Fatal(err)
		}
	}
	if moved == 0 {
		t.Fatal("no key moved at 50%")
	}
	if got := m.Stats().Moving; got.Calls == 0 {
		t.Errorf("%d keys moved to the new store, and the migration saw no moving key: %+v", moved, got)
	}
	// A moved key kept its count: its second Take was its second unit.
	for _, k := range keys {
		d, err := m.Peek(ctx, k, p, now)
		if err != nil {
			t.Fatal(err)
		}
		if d.Used != 2 {
			t.Fatalf("key %q (new: %v) counts %d after two Takes, want 2 (a fresh window)", k, ps.UseNew(k), d.Used)
		}
	}
}

// A source made by New tells the feature's percentage while it reads as
// one, but no group: a migration over it tracks no moving keys.
func TestSourceByNewIsNotAPercentage(t *testing.T) {
	f := newFakeUnleash(t)
	f.set(flexible("feat", "feat", 37))
	c, wait := f.client(t, 5*time.Millisecond)
	wait()
	u := source(t, c, "feat", &Options{Recheck: time.Nanosecond})
	if u.Percent() != 37 || u.GroupID() != "" || u.Problem() != nil {
		t.Fatalf("Percent %d, GroupID %q, Problem %v; want 37, \"\", nil", u.Percent(), u.GroupID(), u.Problem())
	}
	f.set(feature(true, strategy("flexibleRollout", map[string]any{"rollout": "10", "stickiness": "userId", "groupId": "feat"}, nil),
		strategy("flexibleRollout", map[string]any{"rollout": "60", "stickiness": "userId", "groupId": "feat"}, nil)))
	wait()
	if u.Percent() != -1 || u.Problem() != nil {
		t.Errorf("two rollouts: Percent %d, Problem %v; want -1, nil", u.Percent(), u.Problem())
	}
	old, _ := memory.New(nil)
	new, _ := memory.New(nil)
	m, err := migration.New(old, new, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if m.Stats().Moving.Tracked {
		t.Error("a migration over a source made by New tracks moving keys")
	}
}
