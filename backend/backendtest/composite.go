package backendtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/backend/backendtest/internal/model"
	"github.com/throttlekit/throttlekit/throttler"
)

// compositeCases are the cases of composites (throttler.All), run only on a
// backend whose Traits say Composites.
var compositeCases = []struct {
	name string
	f    func(t *testing.T, b throttler.Backend, key func(string) string)
}{
	{"CompositeTables", testCompositeTables},
	{"CompositeDeniedSpendsNothing", testCompositeDenied},
	{"CompositeMembersAsAlone", testCompositeAlone},
	{"CompositeInvalidInput", testCompositeInvalid},
	{"CompositeExactUnderConcurrency", testCompositeConcurrent},
	{"CompositeDifferentialTraces", testCompositeTraces},
}

// skipWithoutComposites skips t on a backend that takes no composites.
func skipWithoutComposites(t *testing.T, b throttler.Backend) {
	if !throttler.TraitsOf(b).Composites {
		t.Skipf("%T takes no composites (Traits.Composites)", b)
	}
}

// dec is what a test expects of a Decision, instants as offsets from T0.
type dec struct {
	allowed                bool
	limit, used, remaining int64
	resetAt, retry         time.Duration
}

func decOf(d throttler.Decision) dec {
	return dec{d.Allowed, d.Limit, d.Used, d.Remaining, d.ResetAt.Sub(T0), d.RetryAfter}
}

// compositeRow is one call at T0+at, on the composite (member 0) or on
// member k alone (member k+1), and the Decisions it must return: the
// composite's and each member's, or the member's alone.
type compositeRow struct {
	at      time.Duration
	member  int
	op      throttler.Op
	cost    int64
	want    dec
	members []dec
	why     string
}

func runCompositeRows(t *testing.T, b throttler.Backend, key string, c throttler.Policy, rows []compositeRow) {
	t.Helper()
	for i, r := range rows {
		p := c
		if r.member > 0 {
			p = memberAt(c, r.member-1)
		}
		d, err := backend.Do(context.Background(), b, r.op, key, p, r.cost, T0.Add(time.Hour), T0.Add(r.at))
		msg := fmt.Sprintf("row %d: %v %d at +%v (%s)", i, r.op, r.cost, r.at, r.why)
		require.NoError(t, err, msg)
		assert.Equal(t, r.want, decOf(d), "%s: the Decision", msg)
		var got []dec
		for _, m := range d.Members() {
			got = append(got, decOf(m))
		}
		assert.Equal(t, r.members, got, "%s: the members' Decisions", msg)
	}
}

// testCompositeTables: composites at fixed instants, hand-computed.
func testCompositeTables(t *testing.T, b throttler.Backend, key func(string) string) {
	skipWithoutComposites(t, b)
	const s, m, h = time.Second, time.Minute, time.Hour
	t.Run("login: 1 a second and 100 an hour", func(t *testing.T) {
		login := throttler.All(throttler.PerSecond(1).Named("login-s"), throttler.PerHour(100).Named("login-h"))
		runCompositeRows(t, b, key("login"), login, []compositeRow{
			{at: 0, op: take, cost: 1, why: "both admit; the second's 0 left binds",
				want:    dec{true, 1, 1, 0, s, 0},
				members: []dec{{true, 1, 1, 0, s, 0}, {true, 100, 1, 99, h, 0}}},
			{at: 500 * ms, op: take, cost: 1, why: "the second denies: nothing counted, its RetryAfter binds",
				want:    dec{false, 1, 1, 0, s, 500 * ms},
				members: []dec{{false, 1, 1, 0, s, 500 * ms}, {true, 100, 1, 99, h, 0}}},
			{at: 600 * ms, member: 2, op: peek, why: "the hour counted the admitted one only",
				want: dec{true, 100, 1, 99, h, 0}},
			{at: s, op: take, cost: 1, why: "back after RetryAfter: admitted",
				want:    dec{true, 1, 1, 0, 2 * s, 0},
				members: []dec{{true, 1, 1, 0, 2 * s, 0}, {true, 100, 2, 98, h, 0}}},
			{at: s, op: peek, why: "a Peek of a composite: one more unit, by every member",
				want:    dec{false, 1, 1, 0, 2 * s, s},
				members: []dec{{false, 1, 1, 0, 2 * s, s}, {true, 100, 2, 98, h, 0}}},
		})
	})
	t.Run("the minute denies a cost the second admits", func(t *testing.T) {
		c := throttler.All(throttler.PerSecond(2).Named("t-s"), throttler.PerMinute(3).Named("t-m"))
		runCompositeRows(t, b, key("cost"), c, []compositeRow{
			{at: 0, op: take, cost: 2,
				want:    dec{true, 2, 2, 0, s, 0},
				members: []dec{{true, 2, 2, 0, s, 0}, {true, 3, 2, 1, m, 0}}},
			{at: s, op: take, cost: 2, why: "the minute has 1 left: denied, and the second opens no window",
				want:    dec{false, 3, 2, 1, m, m - s},
				members: []dec{{true, 2, 0, 2, 2 * s, 0}, {false, 3, 2, 1, m, m - s}}},
			{at: s, member: 1, op: peek, why: "no window in the second",
				want: dec{true, 2, 0, 2, 2 * s, 0}},
			{at: s, op: take, cost: 1, why: "both admit one; the minute's 0 left binds",
				want:    dec{true, 3, 3, 0, m, 0},
				members: []dec{{true, 2, 1, 1, 2 * s, 0}, {true, 3, 3, 0, m, 0}}},
			{at: m, op: take, cost: 2, why: "a new window of each",
				want:    dec{true, 2, 2, 0, m + s, 0},
				members: []dec{{true, 2, 2, 0, m + s, 0}, {true, 3, 2, 1, 2 * m, 0}}},
		})
	})
	t.Run("ties go to the latest ResetAt", func(t *testing.T) {
		c := throttler.All(throttler.PerSecond(1).Named("tie-s"), throttler.PerMinute(1).Named("tie-m"))
		runCompositeRows(t, b, key("tie"), c, []compositeRow{
			{at: 0, op: take, cost: 1, why: "both 0 left: the minute's later reset binds",
				want:    dec{true, 1, 1, 0, m, 0},
				members: []dec{{true, 1, 1, 0, s, 0}, {true, 1, 1, 0, m, 0}}},
			{at: 500 * ms, op: take, cost: 1, why: "both deny: the longest RetryAfter binds",
				want:    dec{false, 1, 1, 0, m, m - 500*ms},
				members: []dec{{false, 1, 1, 0, s, 500 * ms}, {false, 1, 1, 0, m, m - 500*ms}}},
		})
	})
	t.Run("a token bucket and a fixed window", func(t *testing.T) {
		// 10 tokens a second into a bucket of 5 (one token is 1000
		// scaled units, 10 refill per ms: a token takes 100 ms), and 6 a
		// minute.
		tb := throttler.PerSecond(10).WithBurst(5).Named("mix-tb")
		c := throttler.All(tb, throttler.PerMinute(6).Named("mix-fw"))
		runCompositeRows(t, b, key("mix"), c, []compositeRow{
			{at: 0, op: take, cost: 5, why: "the bucket is empty, full again in 500 ms",
				want:    dec{true, 5, 5, 0, 500 * ms, 0},
				members: []dec{{true, 5, 5, 0, 500 * ms, 0}, {true, 6, 5, 1, m, 0}}},
			{at: 100 * ms, op: take, cost: 1, why: "a token came back; both end at 0 left: the minute's reset binds",
				want:    dec{true, 6, 6, 0, m, 0},
				members: []dec{{true, 5, 5, 0, 600 * ms, 0}, {true, 6, 6, 0, m, 0}}},
			{at: 300 * ms, op: take, cost: 1, why: "the minute denies: the bucket's 2 tokens stay",
				want:    dec{false, 6, 6, 0, m, m - 300*ms},
				members: []dec{{true, 5, 3, 2, 600 * ms, 0}, {false, 6, 6, 0, m, m - 300*ms}}},
			{at: 300 * ms, member: 1, op: peek, why: "the denied composite took no token",
				want: dec{true, 5, 3, 2, 600 * ms, 0}},
		})
	})
}

// testCompositeDenied: a denied composite changes no member's state, on
// every algorithm, and a client that returns after its RetryAfter is
// admitted when nobody else spent.
func testCompositeDenied(t *testing.T, b throttler.Backend, key func(string) string) {
	skipWithoutComposites(t, b)
	ctx := context.Background()
	open := []throttler.Policy{
		throttler.PerMinute(4).Named("dn-fw"),
		throttler.PerMinute(4).WithBurst(4).Named("dn-tb"),
		throttler.PerMinute(4).WithAlgorithm(throttler.SlidingLog).Named("dn-sl"),
		throttler.PerMinute(4).WithAlgorithm(throttler.SlidingWindow).Named("dn-sw"),
	}
	for _, spent := range open {
		t.Run(spent.Algorithm.String()+" denies", func(t *testing.T) {
			k := key("k")
			// The spent member is exhausted alone; the others, inside the
			// composite, have never counted anything.
			d, err := b.Take(ctx, k, spent, 4, T0)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			members := []throttler.Policy{spent}
			for _, p := range open {
				if p != spent {
					members = append(members, throttler.PerHour(10).WithAlgorithm(p.Algorithm).Named(p.Name+"-h"))
				}
			}
			c := throttler.All(members...)
			before := peekAll(t, b, k, members, T0.Add(time.Second))
			d, err = b.Take(ctx, k, c, 2, T0.Add(time.Second))
			require.NoError(t, err)
			require.False(t, d.Allowed)
			assert.Equal(t, before, peekAll(t, b, k, members, T0.Add(time.Second)), "a denied composite changed a member")
			for i := range 3 {
				at := T0.Add(time.Second + time.Duration(i)*time.Millisecond)
				again, err := b.Take(ctx, k, c, 2, at)
				require.NoError(t, err)
				require.False(t, again.Allowed, "denied again, before RetryAfter")
			}
			assert.Equal(t, before, peekAll(t, b, k, members, T0.Add(time.Second)), "denied composites changed a member")
			back := T0.Add(time.Second).Add(d.RetryAfter)
			if d.RetryAfter > time.Millisecond {
				early, err := b.Take(ctx, k, c, 2, back.Add(-time.Millisecond))
				require.NoError(t, err)
				assert.False(t, early.Allowed, "admitted before RetryAfter %v", d.RetryAfter)
			}
			late, err := b.Take(ctx, k, c, 2, back)
			require.NoError(t, err)
			assert.True(t, late.Allowed, "not admitted after RetryAfter %v", d.RetryAfter)
		})
	}
}

// peekAll returns each of ms's Decisions of key at now.
func peekAll(t *testing.T, b throttler.Backend, key string, ms []throttler.Policy, now time.Time) []throttler.Decision {
	t.Helper()
	var out []throttler.Decision
	for _, p := range ms {
		d, err := b.Peek(context.Background(), key, p, now)
		require.NoError(t, err)
		d.ResetAt = time.UnixMilli(d.ResetAt.UnixMilli())
		out = append(out, d)
	}
	return out
}

// testCompositeAlone: a member's state is the same whether it is taken alone
// or inside a composite, both ways round, and a Refund of a member alone
// gives back what a composite took.
func testCompositeAlone(t *testing.T, b throttler.Backend, key func(string) string) {
	skipWithoutComposites(t, b)
	ctx := context.Background()
	k := key("k")
	a := throttler.PerMinute(10).WithAlgorithm(throttler.SlidingWindow).Named("al-sw")
	z := throttler.PerHour(10).WithBurst(10).Named("al-tb")
	c := throttler.All(a, z)
	_, err := b.Take(ctx, k, a, 3, T0)
	require.NoError(t, err)
	d, err := b.Take(ctx, k, c, 2, T0)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	var got []int64
	for _, m := range d.Members() {
		got = append(got, m.Used)
	}
	assert.Equal(t, []int64{5, 2}, got, "the composite saw the member's own count")
	alone, err := b.Peek(ctx, k, z, T0)
	require.NoError(t, err)
	assert.Equal(t, int64(2), alone.Used, "the member alone sees the composite's count")
	var taken []throttler.Decision
	for _, m := range d.Members() {
		taken = append(taken, m)
	}
	r, err := b.Refund(ctx, k, z, 2, taken[1].ResetAt, T0)
	require.NoError(t, err)
	assert.Equal(t, int64(0), r.Used, "a member's refund under its own receipt")
}

// testCompositeInvalid: a composite's bad input is an input error, and a
// Refund never takes a composite.
func testCompositeInvalid(t *testing.T, b throttler.Backend, key func(string) string) {
	skipWithoutComposites(t, b)
	ctx := context.Background()
	a, z := throttler.PerSecond(2).Named("iv-a"), throttler.PerMinute(5).Named("iv-b")
	c := throttler.All(a, z)
	for _, tt := range []struct {
		name string
		call func() error
		want error
	}{
		{"a cost above the least capacity", func() error { _, err := b.Take(ctx, key("k"), c, 3, T0); return err }, throttler.ErrInvalidCost},
		{"an empty key", func() error { _, err := b.Take(ctx, "", c, 1, T0); return err }, throttler.ErrInvalidKey},
		{"one identity twice", func() error {
			_, err := b.Take(ctx, key("k"), throttler.All(a, a.WithAlgorithm(throttler.FixedWindow)), 1, T0)
			return err
		}, throttler.ErrInvalidPolicy},
		{"a nested composite", func() error {
			_, err := b.Peek(ctx, key("k"), throttler.All(c, throttler.PerHour(9)), T0)
			return err
		}, throttler.ErrInvalidPolicy},
		{"an invalid member", func() error {
			_, err := b.Take(ctx, key("k"), throttler.All(a, throttler.PerHour(0)), 1, T0)
			return err
		}, throttler.ErrInvalidPolicy},
		{"a refund of a composite", func() error { _, err := b.Refund(ctx, key("k"), c, 1, T0.Add(time.Second), T0); return err }, throttler.ErrInvalidPolicy},
	} {
		err := tt.call()
		assert.ErrorIs(t, err, tt.want, tt.name)
	}
	d, err := b.Peek(ctx, key("k"), a, T0)
	require.NoError(t, err)
	assert.Zero(t, d.Used, "bad input counted nothing")
}

// testCompositeConcurrent: 64 goroutines take composites, and single
// members, at one instant; no member ever counts past its limit, and each
// member's count is exactly the units admitted by what includes it, so a
// denied composite spent nothing anywhere.
func testCompositeConcurrent(t *testing.T, b throttler.Backend, key func(string) string) {
	skipWithoutComposites(t, b)
	for _, members := range [][]throttler.Policy{
		{throttler.PerMinute(50).Named("cc-m"), throttler.PerHour(80).Named("cc-h")},
		{
			throttler.PerHour(10).WithBurst(60).Named("cc-tb"),
			throttler.PerHour(90).WithAlgorithm(throttler.SlidingLog).Named("cc-sl"),
			throttler.PerHour(70).WithAlgorithm(throttler.SlidingWindow).Named("cc-sw"),
		},
	} {
		t.Run(members[0].Algorithm.String(), func(t *testing.T) {
			k, c := key("hot"), throttler.All(members...)
			alone := members[len(members)-1] // also taken alone
			var viaAll, viaAlone, errs atomic.Int64
			var wg sync.WaitGroup
			for g := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 8 {
						cost := int64(1 + (g+i)%3)
						p, n := c, &viaAll
						if (g+i)%4 == 0 {
							p, n = alone, &viaAlone
						}
						d, err := b.Take(context.Background(), k, p, cost, T0)
						if err != nil {
							errs.Add(1)
							continue
						}
						if d.Allowed {
							n.Add(cost)
						}
					}
				}()
			}
			wg.Wait()
			require.Zero(t, errs.Load())
			for i, p := range members {
				d, err := b.Peek(context.Background(), k, p, T0)
				require.NoError(t, err)
				want := viaAll.Load()
				if i == len(members)-1 {
					want += viaAlone.Load()
				}
				assert.Equal(t, want, d.Used, "member %v counts exactly what was admitted", p)
				assert.LessOrEqual(t, d.Used, p.Capacity(), "member %v over its limit", p)
			}
			assert.Positive(t, viaAll.Load())
		})
	}
}

// testCompositeTraces runs random calls of composites and of their members
// alone on a few keys, the clock jumping forward and back, and requires
// every Decision, the members' too, to equal the reference model's. As in
// testDifferentialTraces, a member's state that ended by the latest now may
// have been dropped: a difference is accepted only if the model, dropping
// some of those members' states, gives the backend's answer.
func testCompositeTraces(t *testing.T, b throttler.Backend, key func(string) string) {
	skipWithoutComposites(t, b)
	steps := 1200
	if testing.Short() {
		steps = 300
	}
	fw := throttler.Policy{Name: "cd-fw", Limit: 4, Window: 90 * ms}
	tb := throttler.Policy{Limit: 5, Window: 100 * ms, Algorithm: throttler.TokenBucket, Burst: 8}
	sl := throttler.Policy{Name: "cd-sl", Limit: 6, Window: 80 * ms, Algorithm: throttler.SlidingLog}
	sw := throttler.Policy{Limit: 11, Window: 29 * ms, Algorithm: throttler.SlidingWindow}
	tb2 := throttler.Policy{Name: "cd-tb", Limit: 7, Window: 13 * ms, Algorithm: throttler.TokenBucket, Burst: 2}
	singles := []throttler.Policy{fw, tb, sl, sw, tb2}
	policies := append([]throttler.Policy{
		throttler.All(fw, tb), throttler.All(sl, sw, tb2), throttler.All(fw, sl, sw, tb), throttler.All(tb2, fw),
	}, singles...)
	keys := []string{key("a"), key("b")}
	for seed := uint64(1); seed <= 2; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		m := model.NewModel()
		rs := model.Receipts{}
		now := T0.UnixMilli() + int64(seed)*1_000_000
		latest := now
		for i := range steps {
			k, p := keys[rng.IntN(len(keys))], policies[rng.IntN(len(policies))]
			var op throttler.Op
			var cost int64
			now, op, cost = model.RandomCall(rng, now, p)
			if p.Composite() && op == throttler.OpRefund {
				op = throttler.OpPeek // refunds go to members alone
			}
			latest = max(latest, now)
			var r int64
			if !p.Composite() {
				r = rs.Pick(rng, k, p, now)
			}
			got, err := backend.Do(context.Background(), b, op, k, p, cost, time.UnixMilli(r), time.UnixMilli(now))
			require.NoError(t, err)
			msg := fmt.Sprintf("seed %d step %d: %v %d of %q under %v at %d (receipt %d)", seed, i, op, cost, k, p, now, r)
			var want throttler.Decision
			var commit func()
			if p.Composite() {
				want, commit = compositeAnswer(m, op, k, p, cost, now, latest, got)
			} else {
				want, commit = m.Try(op, k, p, cost, r, now, false)
				if !sameDecision(got, want) {
					if end, ok := m.End(k, p); ok && end <= latest {
						want, commit = m.Try(op, k, p, cost, r, now, true)
					}
				}
			}
			require.True(t, sameDecision(want, got), "%s:\n got %s\nwant %s", msg, showDecision(got), showDecision(want))
			commit()
			if op == throttler.OpTake && got.Allowed {
				if !p.Composite() {
					rs.Add(k, p, got.ResetAt.UnixMilli())
				}
				for j, d := range got.Members() {
					rs.Add(k, memberAt(p, j), d.ResetAt.UnixMilli())
				}
			}
		}
	}
}

// compositeAnswer is the model's answer to a composite's call, from the
// members' stored states, or from no state for some of the members whose
// state ended by latest when that is the backend's answer got.
func compositeAnswer(m *model.Model, op throttler.Op, key string, p throttler.Policy, cost, now, latest int64, got throttler.Decision) (throttler.Decision, func()) {
	var ended []int
	drops := make([]bool, 0, throttler.MaxMembers)
	for i, mp := range p.Members() {
		if end, ok := m.End(key, mp); ok && end <= latest {
			ended = append(ended, i)
		}
		drops = append(drops, false)
	}
	want, commit := m.TryMembers(op, key, p, cost, now, drops)
	for set := 1; set < 1<<len(ended) && !sameDecision(want, got); set++ {
		for j, i := range ended {
			drops[i] = set&(1<<j) != 0
		}
		want, commit = m.TryMembers(op, key, p, cost, now, drops)
	}
	return want, commit
}

// memberAt is p's member i.
func memberAt(p throttler.Policy, i int) throttler.Policy {
	for j, m := range p.Members() {
		if j == i {
			return m
		}
	}
	return throttler.Policy{}
}

// sameDecision reports whether a and b say the same, their members'
// Decisions included, comparing instants (not their locations): Decisions
// of composites compare == only when one is a copy of the other.
func sameDecision(a, b throttler.Decision) bool {
	if decOf(a) != decOf(b) || a.Degraded != b.Degraded || !a.ResetAt.Equal(b.ResetAt) {
		return false
	}
	var am, bm []throttler.Decision
	for _, d := range a.Members() {
		am = append(am, d)
	}
	for _, d := range b.Members() {
		bm = append(bm, d)
	}
	if len(am) != len(bm) {
		return false
	}
	for i := range am {
		if !sameDecision(am[i], bm[i]) {
			return false
		}
	}
	return true
}

func showDecision(d throttler.Decision) string {
	s := fmt.Sprintf("%+v", decOf(d))
	for i, m := range d.Members() {
		s += fmt.Sprintf("\n  member %d %+v", i, decOf(m))
	}
	return s
}
