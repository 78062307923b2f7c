package migration

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/throttler"
)

// oneAtATime is a store that takes no composites.
type oneAtATime struct{ throttler.Backend }

// A Migration takes composites when both stores do, and says so in its
// Traits; with a store that takes none it refuses them as input errors. A
// key that is not moving sends its composite to its store through the
// shadow, which mirrors it and compares every member.
func TestMigrationTakesComposites(t *testing.T) {
	c := throttler.All(throttler.PerSecond(1).Named("s"), throttler.PerHour(5).Named("h"))
	now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	ctx := context.Background()
	for _, stores := range [][2]throttler.Backend{{mem(t), oneAtATime{mem(t)}}, {oneAtATime{mem(t)}, mem(t)}} {
		m := newMigration(t, stores[0], stores[1], percent(t, 50), nil)
		assert.False(t, m.Traits().Composites)
		_, err := m.Take(ctx, "k", c, 1, now)
		assert.ErrorIs(t, err, throttler.ErrInvalidPolicy)
		_, err = m.Peek(ctx, "k", c, now)
		assert.ErrorIs(t, err, throttler.ErrInvalidPolicy)
	}

	old, nw := mem(t), mem(t)
	r := percent(t, 0)
	r.SetMirror(true)
	m := newMigration(t, old, nw, r, nil)
	require.True(t, m.Traits().Composites)
	th, err := throttler.New(m, &throttler.Options{Clock: func() time.Time { return now }})
	require.NoError(t, err)
	require.True(t, th.SupportsComposites())
	for i, want := range []bool{true, false} {
		d, err := th.Allow(ctx, "k", c)
		require.NoError(t, err)
		assert.Equal(t, want, d.Allowed, "call %d", i)
	}
	require.NoError(t, m.Flush(ctx))
	st := m.Stats()
	assert.Equal(t, uint64(2), st.Forward.Compared)
	assert.Zero(t, st.Forward.Mismatched)
	assert.Zero(t, st.Moving.Calls)
	for _, p := range []throttler.Policy{throttler.PerSecond(1).Named("s"), throttler.PerHour(5).Named("h")} {
		d, err := nw.Peek(ctx, "k", p, now)
		require.NoError(t, err)
		assert.Equal(t, int64(1), d.Used, "the new store counted the mirrored composite in %v once", p)
	}
}

// TestMovingForComposite: a composite key is moving for the longest
// horizon of its members, plus Settle, exactly.
func TestMovingForComposite(t *testing.T) {
	const settle = 5 * time.Second
	w := 10 * time.Second
	fw := throttler.Policy{Name: "fw", Limit: 5, Window: w}                                    // 20s
	log := throttler.Policy{Name: "log", Limit: 5, Window: w, Algorithm: throttler.SlidingLog} // 10s
	tb := throttler.Policy{Name: "tb", Limit: 2, Window: w}.WithBurst(6)                       // 30s
	hour := throttler.Policy{Name: "hour", Limit: 5, Window: time.Hour, Algorithm: throttler.SlidingLog}
	moved := keyIn(t, 0, 50)
	for _, tc := range []struct {
		p       throttler.Policy
		horizon time.Duration
	}{
		{throttler.All(log, fw), 2 * w},
		{throttler.All(fw, tb, log), 30 * time.Second},
		{throttler.All(hour, fw), time.Hour},
	} {
		t.Run(tc.p.String(), func(t *testing.T) {
			if got := horizon(tc.p); got != tc.horizon {
				t.Fatalf("horizon = %v, want %v", got, tc.horizon)
			}
			var clk monoClock
			r := percent(t, 0)
			m := clk.migration(t, mem(t), mem(t), r, &Options{Settle: settle})
			require.NoError(t, r.Set(50))
			end := tc.horizon + settle
			for _, row := range []struct {
				at   time.Duration
				want bool
			}{{0, true}, {end - time.Nanosecond, true}, {end, false}} {
				clk.set(row.at)
				assert.Equal(t, row.want, movingCall(t, m, moved, tc.p), "at %v", row.at)
			}
		})
	}
}

// used peeks each member of c on b at now: its Used.
func used(t *testing.T, b throttler.Backend, key string, c throttler.Policy, now time.Time) []int64 {
	t.Helper()
	var out []int64
	for _, p := range c.Members() {
		d, err := b.Peek(context.Background(), key, p, now)
		require.NoError(t, err)
		out = append(out, d.Used)
	}
	return out
}

// TestMovingCompositeTable: a composite of two fixed windows moving from
// old to new at fixed instants, while its binding member changes. Before
// the change both stores counted a call at 0 (s's window [0, 1s), h's
// [0, 10s)); old alone counted one at 500ms (the mirror dropped it). The
// change is seen by the first call after it, at 700ms: the key is moving
// until 700ms + 20s (h's horizon, the longest) + Settle 1s. Old's counts bind throughout, new is
// called at the start of each member's window in old, and a composite old
// denies spends nothing on either store.
func TestMovingCompositeTable(t *testing.T) {
	ctx := context.Background()
	s := throttler.Policy{Name: "s", Limit: 2, Window: time.Second}
	h := throttler.Policy{Name: "h", Limit: 5, Window: 10 * time.Second}
	c := throttler.All(s, h)
	var clk monoClock
	old, nw := mem(t), mem(t)
	r := percent(t, 0)
	m := clk.migration(t, old, nw, r, &Options{Settle: time.Second})
	for _, b := range []throttler.Backend{old, nw} {
		_, err := b.Take(ctx, "k", c, 1, t0)
		require.NoError(t, err)
	}
	_, err := old.Take(ctx, "k", c, 1, t0.Add(500*time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, r.Set(100))
	ms := time.Millisecond
	for _, row := range []struct {
		at        time.Duration
		allowed   bool
		binding   int // 0: s, 1: h
		remaining int64
		retry     time.Duration
		moving    bool
		old, new  []int64 // s's and h's Used in each store after the call
	}{
		// s is spent in old's window: denied, nothing counted, though new
		// (which missed a call) would admit.
		{700 * ms, false, 0, 0, 300 * ms, true, []int64{2, 2}, []int64{1, 1}},
		// s's next window in old; new's h is called at 0, in old's h window.
		{1000 * ms, true, 0, 1, 0, true, []int64{1, 3}, []int64{1, 2}},
		{1500 * ms, true, 0, 0, 0, true, []int64{2, 4}, []int64{2, 3}},
		// h is left with nothing: it binds now.
		{2000 * ms, true, 1, 0, 0, true, []int64{1, 5}, []int64{1, 4}},
		// s would admit, h denies until old's h window ends: nothing counted.
		{2500 * ms, false, 1, 0, 7500 * ms, true, []int64{1, 5}, []int64{1, 4}},
		// Both members' windows in old open at 10s: one composite Take on
		// new, at 10s, opens the same windows there.
		{10000 * ms, true, 0, 1, 0, true, []int64{1, 1}, []int64{1, 1}},
		{21699 * ms, true, 0, 1, 0, true, []int64{1, 1}, []int64{1, 1}},
		// The move is over: new serves alone, in the windows old opened
		// too (at 21.699s).
		{21700 * ms, true, 0, 0, 0, false, []int64{1, 1}, []int64{2, 2}},
		{22700 * ms, true, 0, 1, 0, false, []int64{0, 1}, []int64{1, 3}},
	} {
		clk.set(row.at)
		now := t0.Add(row.at)
		before := m.Stats().Moving.Calls
		d, err := m.Take(ctx, "k", c, 1, now)
		require.NoError(t, err, "at %v", row.at)
		moving := m.Stats().Moving.Calls > before
		assert.Equal(t, row.allowed, d.Allowed, "at %v: %+v", row.at, d)
		assert.Equal(t, row.binding, d.Binding(), "at %v: binding", row.at)
		assert.Equal(t, row.remaining, d.Remaining, "at %v: Remaining", row.at)
		assert.Equal(t, row.retry, d.RetryAfter, "at %v: RetryAfter", row.at)
		assert.Equal(t, row.moving, moving, "at %v: moving", row.at)
		require.NoError(t, m.Flush(ctx))
		assert.Equal(t, row.old, used(t, old, "k", c, now), "at %v: old", row.at)
		assert.Equal(t, row.new, used(t, nw, "k", c, now), "at %v: new", row.at)
	}
}

// TestMovingCompositeSpendsNothingWhenDenied: a moving key's composite that
// one store denies leaves every member of both stores as it was, by every
// path: old denies (new is not asked); old admits and new denies a member
// taken on its own (members at several instants), or the composite taken
// at once (members at one instant); both taken at once (no fixed window)
// with either store denying.
func TestMovingCompositeSpendsNothingWhenDenied(t *testing.T) {
	ctx := context.Background()
	s := throttler.Policy{Name: "s", Limit: 2, Window: time.Second}
	h := throttler.Policy{Name: "h", Limit: 3, Window: time.Hour}
	sw := throttler.Policy{Name: "sw", Limit: 3, Window: time.Minute, Algorithm: throttler.SlidingWindow}
	tb := throttler.Policy{Name: "tb", Limit: 3, Window: time.Minute}.WithBurst(3)
	log := throttler.Policy{Name: "log", Limit: 3, Window: time.Minute, Algorithm: throttler.SlidingLog}
	at := t0.Add(1500 * time.Millisecond) // the moving call's now
	type spend struct {
		old bool // on old, else on new
		p   throttler.Policy
		n   int64
		at  time.Duration
	}
	for _, tc := range []struct {
		name  string
		c     throttler.Policy
		setup []spend
		calls string // how new was asked: "members", "composite", or "" for not at all
	}{
		{"old denies: new is not asked", throttler.All(s, h),
			[]spend{{true, h, 3, 0}}, ""},
		// s's window in old opened at 1s, h's at 0: new takes s (admits),
		// then h, which denies; s is refunded on new, the composite on old.
		{"new denies a member taken on its own", throttler.All(s, h),
			[]spend{{true, h, 1, 0}, {true, s, 1, time.Second}, {false, h, 3, 0}}, "members"},
		// s's and sw's instants are now: one composite Take on new denies.
		{"new denies the composite taken at once", throttler.All(s, sw),
			[]spend{{false, sw, 3, 1500 * time.Millisecond}}, "composite"},
		{"both at once, new denies", throttler.All(tb, log),
			[]spend{{false, log, 3, 1000 * time.Millisecond}}, "composite"},
		{"both at once, old denies", throttler.All(tb, log),
			[]spend{{true, tb, 3, 1000 * time.Millisecond}}, "composite"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var clk monoClock
			old, nw := mem(t), mem(t)
			calls := &recorder{Backend: nw}
			r := percent(t, 0)
			m := clk.migration(t, old, calls, r, nil)
			for _, sp := range tc.setup {
				b := throttler.Backend(nw)
				if sp.old {
					b = old
				}
				d, err := b.Take(ctx, "k", sp.p, sp.n, t0.Add(sp.at))
				require.NoError(t, err)
				require.True(t, d.Allowed, "setup")
			}
			beforeOld, beforeNew := used(t, old, "k", tc.c, at), used(t, nw, "k", tc.c, at)
			require.NoError(t, r.Set(100))
			d, err := m.Take(ctx, "k", tc.c, 1, at)
			require.NoError(t, err)
			assert.False(t, d.Allowed, "%+v", d)
			assert.Equal(t, beforeOld, used(t, old, "k", tc.c, at), "old")
			assert.Equal(t, beforeNew, used(t, nw, "k", tc.c, at), "new")
			assert.Equal(t, tc.calls, calls.takes(), "new's Takes")
			st := m.Stats().Moving
			assert.Equal(t, uint64(1), st.Calls)
			assert.Zero(t, st.RefundFailed)
		})
	}
}

// recorder records whether its Takes were of composites ("composite") or
// of single policies ("members").
type recorder struct {
	throttler.Backend
	kinds []string
}

func (r *recorder) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	k := "members"
	if p.Composite() {
		k = "composite"
	}
	if len(r.kinds) == 0 || r.kinds[len(r.kinds)-1] != k {
		r.kinds = append(r.kinds, k)
	}
	return r.Backend.Take(ctx, key, p, cost, now)
}

func (r *recorder) takes() string { return fmt.Sprint(r.kinds)[1 : len(fmt.Sprint(r.kinds))-1] }

// TestMovingCompositeRace is TestMovingRace for a composite: no key is
// ever admitted more than its least limit while the percentage flips, and
// with the percentage hidden some key gets a fresh window.
func TestMovingCompositeRace(t *testing.T) {
	c := throttler.All(throttler.Policy{Name: "api", Limit: 5, Window: time.Hour},
		throttler.Policy{Name: "tb", Limit: 7, Window: time.Hour}.WithBurst(7))
	flipRace(t, 5, "a fresh window", func(m *Migration, key string, _ int) (bool, error) {
		d, err := m.Take(context.Background(), key, c, 1, t0)
		return d.Allowed, err
	})
}

// A Throttler over a Migration refunds a moving key's composite member by
// member, each to both stores, under its own receipt.
func TestThrottlerRefundsAMovingComposite(t *testing.T) {
	ctx := context.Background()
	s := throttler.Policy{Name: "s", Limit: 2, Window: time.Second}
	tb := throttler.Policy{Name: "tb", Limit: 3, Window: time.Minute}.WithBurst(3)
	c := throttler.All(s, tb)
	var clk monoClock
	old, nw := mem(t), mem(t)
	r := percent(t, 0)
	m := clk.migration(t, old, nw, r, nil)
	now := t0.Add(250 * time.Millisecond)
	th, err := throttler.New(m, &throttler.Options{Clock: func() time.Time { return now }})
	require.NoError(t, err)
	require.NoError(t, r.Set(100))
	d, err := th.Allow(ctx, "k", c)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	assert.Equal(t, []int64{1, 1}, used(t, old, "k", c, now))
	assert.Equal(t, []int64{1, 1}, used(t, nw, "k", c, now))
	_, err = th.Refund(ctx, "k", c, 1, d)
	require.NoError(t, err)
	assert.Equal(t, []int64{0, 0}, used(t, old, "k", c, now))
	assert.Equal(t, []int64{0, 0}, used(t, nw, "k", c, now))
	if st := m.Stats().Moving; st.Calls != 3 || st.Compensated != 0 {
		t.Errorf("moving stats %+v; want the Take and two member Refunds, nothing compensated", st)
	}
	_, err = m.Refund(ctx, "k", c, 1, d.ResetAt, now)
	assert.ErrorIs(t, err, throttler.ErrInvalidPolicy, "a Backend's Refund takes no composite")
	assert.False(t, errors.Is(err, throttler.ErrNotRefunded))
}

func (r *recorder) Traits() throttler.Traits { return throttler.TraitsOf(r.Backend) }

// TestMovingCompositePhase is TestFixedWindowPhase for a composite of two
// fixed windows whose binding member changes: new missed the call that
// opened both members' windows in old, so its windows start 4s later.
// Called at the start of each member's window in old, new comes to count
// in old's windows: the key never gets more than a member's limit in any
// of that member's windows in old (the ones it has been counted in), before
// the move ends at 66s or after, when new serves alone.
func TestMovingCompositePhase(t *testing.T) {
	ctx := context.Background()
	api := throttler.Policy{Name: "api", Limit: 3, Window: 10 * time.Second}
	half := throttler.Policy{Name: "half", Limit: 8, Window: 30 * time.Second}
	c := throttler.All(api, half)
	var clk monoClock
	old, nw := mem(t), mem(t)
	r := percent(t, 0)
	m := clk.migration(t, old, nw, r, &Options{Settle: time.Second}) // moving for 61s
	for _, at := range []time.Duration{0, time.Second, 4 * time.Second} {
		d, err := old.Take(ctx, "k", c, 1, t0.Add(at))
		require.NoError(t, err)
		require.True(t, d.Allowed, "setup")
	}
	d, err := nw.Take(ctx, "k", c, 1, t0.Add(4*time.Second))
	require.NoError(t, err)
	require.True(t, d.Allowed, "setup")
	require.NoError(t, r.Set(100))
	// Admissions per window of old: api's [0, 10s), [10s, 20s), …, half's
	// [0, 30s), [30s, 60s), [60s, 90s).
	perAPI, perHalf := map[int]int{0: 3}, map[int]int{0: 3}
	bound := map[int]int{} // the binding member of the denials, by index
	var last throttler.Decision
	moved := false
	for at := 5 * time.Second; at < 90*time.Second; at += 500 * time.Millisecond {
		clk.set(at - 5*time.Second) // the change is seen at 5s
		before := m.Stats().Moving.Calls
		d, err := m.Take(ctx, "k", c, 1, t0.Add(at))
		require.NoError(t, err)
		if m.Stats().Moving.Calls == before {
			moved = true
		} else {
			require.False(t, moved, "moving again at %v", at)
		}
		if d.Allowed {
			perAPI[int(at/api.Window)]++
			perHalf[int(at/half.Window)]++
			last = d
		} else {
			bound[d.Binding()]++
		}
	}
	require.True(t, moved, "the move never ended")
	for w, n := range perAPI {
		assert.LessOrEqual(t, n, 3, "api's window %d in old (%v)", w, perAPI)
	}
	for w, n := range perHalf {
		assert.LessOrEqual(t, n, 8, "half's window %d in old (%v)", w, perHalf)
	}
	// half's window [0, 30s) is spent by 3 + 2 + 3 (new, still counting
	// api in its own window [4s, 14s), keeps [10s, 20s) stricter, and half
	// in [4s, 34s), so [30s, 60s) too); from 60s new counts in old's
	// windows, and it serves alone from 66s on, where half binds after 3 +
	// 3 + 2.
	assert.Equal(t, map[int]int{0: 3, 1: 2, 2: 3, 3: 2, 6: 3, 7: 3, 8: 2}, perAPI)
	assert.Equal(t, map[int]int{0: 8, 1: 2, 2: 8}, perHalf)
	assert.Positive(t, bound[0], "api binds some denials")
	assert.Positive(t, bound[1], "half binds some denials")
	ms := decisions(last)
	require.Equal(t, 2, ms.n)
	assert.True(t, ms.v[1].ResetAt.Equal(t0.Add(90*time.Second)), "half's last admission counted in old's window [60s, 90s): %v", ms.v[1].ResetAt)
}

// failOn is a store whose Takes of the policies fail matches fail, as its
// store's failure.
type failOn struct {
	throttler.Backend
	fail func(throttler.Policy) bool
}

func (f failOn) Traits() throttler.Traits { return throttler.TraitsOf(f.Backend) }

func (f failOn) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	if f.fail(p) {
		return throttler.Decision{}, errors.New("connection refused")
	}
	return f.Backend.Take(ctx, key, p, cost, now)
}

// TestMovingCompositeFailures: a moving key's composite when a store fails.
// The serving store (new) failing is the call's error, and old keeps
// nothing of it; old failing leaves new's answer alone, counted in
// OneStore; in every case no store keeps units of a call that failed.
func TestMovingCompositeFailures(t *testing.T) {
	ctx := context.Background()
	s := throttler.Policy{Name: "s", Limit: 2, Window: time.Second}
	h := throttler.Policy{Name: "h", Limit: 3, Window: time.Hour}
	tb := throttler.Policy{Name: "tb", Limit: 3, Window: time.Minute}.WithBurst(3)
	log := throttler.Policy{Name: "log", Limit: 3, Window: time.Minute, Algorithm: throttler.SlidingLog}
	at := t0.Add(1500 * time.Millisecond)
	composites := func(p throttler.Policy) bool { return p.Composite() }
	member := func(name string) func(throttler.Policy) bool {
		return func(p throttler.Policy) bool { return p.Name == name }
	}
	never := func(throttler.Policy) bool { return false }
	for _, tc := range []struct {
		name              string
		c                 throttler.Policy
		oldFails, nwFails func(throttler.Policy) bool
		allowed           bool // without an error
		oldUsed, newUsed  []int64
		oneStore          uint64
	}{
		{"fixed: old fails, new alone", throttler.All(s, h), composites, never, true, []int64{1, 0}, []int64{1, 1}, 1},
		{"fixed: new fails the composite", throttler.All(s, h), never, composites, false, []int64{0, 0}, []int64{0, 0}, 0},
		{"fixed: new fails the second member", throttler.All(s, h), never, member("h"), false, []int64{1, 1}, []int64{1, 0}, 0},
		{"at once: old fails, new alone", throttler.All(tb, log), composites, never, true, []int64{0, 0}, []int64{1, 1}, 1},
		{"at once: new fails", throttler.All(tb, log), never, composites, false, []int64{0, 0}, []int64{0, 0}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old, nw := mem(t), mem(t)
			if tc.name == "fixed: new fails the second member" {
				// s's window in old opens at 1s, h's at 0: new takes them one by one.
				_, err := old.Take(ctx, "k", h, 1, t0)
				require.NoError(t, err)
				_, err = old.Take(ctx, "k", s, 1, t0.Add(time.Second))
				require.NoError(t, err)
				_, err = nw.Take(ctx, "k", s, 1, t0.Add(time.Second))
				require.NoError(t, err)
			}
			if tc.name == "fixed: old fails, new alone" {
				_, err := old.Take(ctx, "k", s, 1, t0.Add(time.Second))
				require.NoError(t, err)
			}
			var clk monoClock
			r := percent(t, 0)
			m := clk.migration(t, failOn{old, tc.oldFails}, failOn{nw, tc.nwFails}, r, nil)
			require.NoError(t, r.Set(100))
			d, err := m.Take(ctx, "k", tc.c, 1, at)
			if tc.allowed {
				require.NoError(t, err)
				assert.True(t, d.Allowed, "%+v", d)
			} else {
				require.Error(t, err)
				assert.Contains(t, err.Error(), "new backend: ")
			}
			assert.Equal(t, tc.oldUsed, used(t, old, "k", tc.c, at), "old")
			assert.Equal(t, tc.newUsed, used(t, nw, "k", tc.c, at), "new")
			st := m.Stats().Moving
			assert.Equal(t, tc.oneStore, st.OneStore)
			assert.Zero(t, st.RefundFailed)
		})
	}
}
