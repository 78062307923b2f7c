package throttler_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/throttler"
)

// switchable enforces every key while on: a rollout moved by the test.
type switchable struct{ on atomic.Bool }

func (s *switchable) Enforced(string) bool { return s.on.Load() }

// twinStep is one call made twice at the same instant: under a dry-run
// policy on key "dry-<k>" and under its enforced twin on "enf-<k>".
type twinStep struct {
	at  time.Duration // after t0
	op  throttler.Op
	k   int
	n   int64
	ref int // for a Refund: the index of the Take whose units go back
}

// runTwins makes every step under dry and under enforced and checks that
// the two count alike, call for call: the same state in every Decision,
// the dry run admitted where its twin is denied, and said so.
func runTwins(t *testing.T, dry, enforced throttler.Policy, steps []twinStep) {
	t.Helper()
	now := t0
	th := newThrottler(t, newMemory(t), &throttler.Options{Clock: func() time.Time { return now }})
	ctx := context.Background()
	type pair struct{ dry, enf throttler.Decision }
	taken := map[int]pair{}
	for i, s := range steps {
		now = t0.Add(s.at)
		dk, ek := fmt.Sprintf("dry-%d", s.k), fmt.Sprintf("enf-%d", s.k)
		var dd, ed throttler.Decision
		var derr, eerr error
		switch s.op {
		case throttler.OpTake:
			dd, derr = th.AllowN(ctx, dk, dry, s.n)
			ed, eerr = th.AllowN(ctx, ek, enforced, s.n)
			taken[i] = pair{dd, ed}
		case throttler.OpPeek:
			dd, derr = th.Peek(ctx, dk, dry)
			ed, eerr = th.Peek(ctx, ek, enforced)
		case throttler.OpRefund:
			dd, derr = th.Refund(ctx, dk, dry, s.n, taken[s.ref].dry)
			ed, eerr = th.Refund(ctx, ek, enforced, s.n, taken[s.ref].enf)
		}
		msg := fmt.Sprintf("step %d %+v", i, s)
		require.Equal(t, errors.Is(eerr, throttler.ErrNotRefunded), errors.Is(derr, throttler.ErrNotRefunded), msg)
		if eerr != nil {
			require.ErrorIs(t, eerr, throttler.ErrNotRefunded, msg)
			continue
		}
		require.NoError(t, derr, msg)
		assert.True(t, dd.Allowed, msg)
		assert.Equal(t, !ed.Allowed, dd.WouldDeny, msg)
		assert.False(t, ed.WouldDeny, msg)
		assert.Zero(t, dd.RetryAfter, msg)
		// The state is the same: only the answer differs.
		ed.Allowed, ed.RetryAfter, ed.WouldDeny = dd.Allowed, dd.RetryAfter, dd.WouldDeny
		require.Equal(t, ed, dd, msg)
	}
}

func policiesOfEveryAlgorithm() []throttler.Policy {
	return []throttler.Policy{
		throttler.PerMinute(3).Named("api"),
		throttler.PerMinute(3).Named("api").WithBurst(5),
		throttler.PerMinute(3).Named("api").WithAlgorithm(throttler.SlidingLog),
		throttler.PerMinute(3).Named("api").WithAlgorithm(throttler.SlidingWindow),
		throttler.PerMinute(3), // unnamed: the identity is the definition
	}
}

func TestDryRunCountsAsItsEnforcedTwin(t *testing.T) {
	s := time.Second
	take := func(at time.Duration, k int, n int64) twinStep {
		return twinStep{at: at, op: throttler.OpTake, k: k, n: n}
	}
	steps := []twinStep{
		take(0, 0, 1), take(0, 0, 2),
		take(s, 0, 1), // over the limit: the enforced twin denies, counting nothing
		{at: s, op: throttler.OpPeek, k: 0},
		take(2*s, 0, 3),
		{at: 3 * s, op: throttler.OpRefund, k: 0, n: 1, ref: 0}, // a counted take
		{at: 3 * s, op: throttler.OpRefund, k: 0, n: 1, ref: 2}, // a would-be denial: nothing
		take(3*s, 0, 1),
		take(3*s, 1, 3), take(4*s, 1, 1),
		take(30*s, 0, 2), take(45*s, 0, 2),
		take(61*s, 0, 1), take(61*s, 0, 3), take(62*s, 1, 2),
		take(2*s, 0, 1), // the clock went back
		{at: 130 * s, op: throttler.OpPeek, k: 1},
		take(130*s, 1, 3), take(130*s, 1, 1),
	}
	for _, p := range policiesOfEveryAlgorithm() {
		t.Run(p.String(), func(t *testing.T) { runTwins(t, p.DryRun(), p, steps) })
	}
}

func TestDryRunCountsAsItsEnforcedTwinRandomTrace(t *testing.T) {
	rng := rand.New(rand.NewPCG(27, 1))
	for _, p := range policiesOfEveryAlgorithm() {
		var steps []twinStep
		var at time.Duration
		var takes []int
		for i := range 400 {
			at += time.Duration(rng.IntN(4000)-400) * time.Millisecond // sometimes back
			s := twinStep{at: at, k: rng.IntN(3), n: 1 + rng.Int64N(3)}
			switch r := rng.IntN(10); {
			case r < 6 || len(takes) == 0:
				s.op = throttler.OpTake
				takes = append(takes, i)
			case r < 8:
				s.op = throttler.OpPeek
			default:
				s.op = throttler.OpRefund
				s.ref = takes[rng.IntN(len(takes))]
				s.k = steps[s.ref].k
			}
			steps = append(steps, s)
		}
		t.Run(p.String(), func(t *testing.T) { runTwins(t, p.DryRun(), p, steps) })
	}
}

// A named policy has one state per key whoever enforces it: a key that
// becomes enforced keeps its window, and a key back in dry run too.
func TestEnforcementChangeKeepsTheWindow(t *testing.T) {
	now := t0
	th := newThrottler(t, newMemory(t), &throttler.Options{Clock: func() time.Time { return now }})
	ctx := context.Background()
	sw := &switchable{}
	p := throttler.PerMinute(2).Named("api").EnforcedBy(sw)
	for _, want := range []bool{true, true, false} {
		d, err := th.Allow(ctx, "k", p)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.Equal(t, !want, d.WouldDeny)
	}
	sw.on.Store(true)
	d, err := th.Allow(ctx, "k", p)
	require.NoError(t, err)
	assert.False(t, d.Allowed, "enforcement on: the dry-run window is kept")
	assert.Positive(t, d.RetryAfter)
	// The same policy without an Enforcer is the same limit.
	d, err = th.Allow(ctx, "k", throttler.PerMinute(2).Named("api"))
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	sw.on.Store(false)
	d, err = th.Allow(ctx, "k", p)
	require.NoError(t, err)
	assert.True(t, d.Allowed && d.WouldDeny, "rolled back: admitted at once")
}

// A dry-run policy of another identity never changes what an enforced one
// counts on the same key.
func TestDryRunBesideAnEnforcedPolicy(t *testing.T) {
	now := t0
	th := newThrottler(t, newMemory(t), &throttler.Options{Clock: func() time.Time { return now }})
	ctx := context.Background()
	enforced := []throttler.Policy{throttler.PerMinute(3).Named("api"), throttler.PerMinute(3)}
	dry := []throttler.Policy{
		throttler.PerMinute(1).Named("api-tight").DryRun(),
		throttler.PerMinute(1).DryRun(),
		throttler.PerSecond(3).DryRun(),
	}
	for i := range 5 {
		for _, p := range dry {
			d, err := th.Allow(ctx, "k", p)
			require.NoError(t, err)
			require.True(t, d.Allowed)
		}
		for _, p := range enforced {
			d, err := th.Allow(ctx, "k", p)
			require.NoError(t, err)
			assert.Equal(t, i < 3, d.Allowed, "%v, call %d", p, i)
			assert.Equal(t, min(int64(i+1), 3), d.Used, "%v, call %d", p, i)
		}
	}
}

// nilEnforcer is an Enforcer that cannot be used as a nil pointer;
// mapEnforcer one whose values == would panic on, which a Policy holds
// all the same (behind a pointer), so it stays comparable.
type nilEnforcer struct{}

func (*nilEnforcer) Enforced(string) bool { return true }

type mapEnforcer map[string]bool

func (m mapEnforcer) Enforced(k string) bool { return m[k] }

func TestEnforceValidation(t *testing.T) {
	th := newThrottler(t, newMemory(t), nil)
	ctx := context.Background()
	for name, e := range map[string]throttler.Enforcer{
		"nil":         nil,
		"nil pointer": (*nilEnforcer)(nil),
		"nil map":     mapEnforcer(nil),
	} {
		t.Run(name, func(t *testing.T) {
			p := throttler.PerMinute(1).Named("api").EnforcedBy(e)
			require.ErrorIs(t, p.Validate(), throttler.ErrInvalidPolicy)
			for range 2 { // a denial too: Enforced is never reached
				_, err := th.Allow(ctx, "k", p)
				require.ErrorIs(t, err, throttler.ErrInvalidPolicy)
			}
			_, err := th.Wait(ctx, "k", p)
			require.ErrorIs(t, err, throttler.ErrInvalidPolicy)
			_, err = th.Refund(ctx, "k", p, 1, throttler.Decision{Allowed: true, ResetAt: t0.Add(time.Hour)})
			require.ErrorIs(t, err, throttler.ErrInvalidPolicy)
		})
	}
	// A map Enforcer: the Policy is comparable and usable as a map key
	// (Wait's queues), and enforces the keys in it.
	p := throttler.PerMinute(1).Named("api").EnforcedBy(mapEnforcer{"k": true})
	require.NoError(t, p.Validate())
	require.Equal(t, 1, map[throttler.Policy]int{p: 1}[p])
	for range 2 {
		_, err := th.Wait(ctx, "other", p) // dry run: never waits
		require.NoError(t, err)
	}
	d, err := th.Allow(ctx, "k", p)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	d, err = th.Allow(ctx, "k", p)
	require.NoError(t, err)
	require.False(t, d.Allowed, "the map enforces k")
	require.NoError(t, throttler.PerMinute(1).DryRun().Validate())
	require.Equal(t, throttler.PerMinute(1).DryRun(), throttler.PerMinute(1).DryRun())
}

// A key in dry run is never refused, not even by a Throttler that fails
// closed while its store is down; Observe still sees the failure.
func TestDryRunFailClosed(t *testing.T) {
	stub := &stubBackend{next: newMemory(t), err: errDown}
	var seen []throttler.Observation
	th := newThrottler(t, stub, &throttler.Options{Clock: func() time.Time { return t0 },
		FailClosed: true, Observe: func(o throttler.Observation) { seen = append(seen, o) }})
	ctx := context.Background()
	p := throttler.PerMinute(1).Named("api")
	_, err := th.Allow(ctx, "k", p)
	require.ErrorIs(t, err, throttler.ErrUnavailable)
	d, err := th.Allow(ctx, "k", p.DryRun())
	require.NoError(t, err)
	assert.True(t, d.Allowed && d.WouldDeny && d.Degraded)
	require.Len(t, seen, 2)
	assert.ErrorIs(t, seen[1].Err, throttler.ErrUnavailable)
	assert.Equal(t, throttler.SourceFailureMode, seen[1].Source)
	assert.True(t, seen[1].Decision.WouldDeny)
	assert.Equal(t, p.DryRun(), seen[1].Policy, "the observation names the policy as called")
}

// A would-be denial counted nothing, so nothing is refunded, and the store
// is not asked.
func TestDryRunRefundOfAWouldBeDenial(t *testing.T) {
	stub := &stubBackend{next: newMemory(t)}
	th := newThrottler(t, stub, &throttler.Options{Clock: func() time.Time { return t0 }})
	ctx := context.Background()
	p := throttler.PerMinute(1).Named("api").DryRun()
	_, err := th.Allow(ctx, "k", p)
	require.NoError(t, err)
	d, err := th.Allow(ctx, "k", p)
	require.NoError(t, err)
	require.True(t, d.WouldDeny)
	calls := stub.count()
	_, err = th.Refund(ctx, "k", p, 1, d)
	require.ErrorIs(t, err, throttler.ErrNotRefunded)
	assert.Equal(t, calls, stub.count())
	peek, err := th.Peek(ctx, "k", p)
	require.NoError(t, err)
	assert.Equal(t, int64(1), peek.Used)
}

// Wait never waits for a would-be denial: a window of an hour, and a
// deadline of a second, which a wait would report at once.
func TestDryRunWaitDoesNotWait(t *testing.T) {
	th := newThrottler(t, newMemory(t), &throttler.Options{Clock: func() time.Time { return t0 }})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	p := throttler.PerHour(1).Named("api").DryRun()
	for i := range 3 {
		d, err := th.WaitN(ctx, "k", p, 1)
		require.NoError(t, err)
		assert.True(t, d.Allowed)
		assert.Equal(t, i > 0, d.WouldDeny)
	}
	_, err := th.Wait(ctx, "k", throttler.PerHour(1).Named("api"))
	require.ErrorIs(t, err, throttler.ErrWouldExceedDeadline, "the enforced policy shares the count")
}

// Enforcement allocates nothing on a memory-backend Allow, admitted or
// denied, in dry run or by a rollout (reflect.Value.Comparable would, on a
// struct).
func TestEnforcementAllocatesNothing(t *testing.T) {
	ctx := context.Background()
	th := newThrottler(t, newMemory(t), nil)
	sw := &switchable{}
	for _, p := range []throttler.Policy{throttler.PerHour(1).Named("api"), throttler.PerHour(1 << 40).Named("open")} {
		rollout := p.EnforcedBy(sw)
		for _, q := range []throttler.Policy{p.DryRun(), rollout} {
			if _, err := th.Allow(ctx, "k", q); err != nil {
				t.Fatal(err)
			}
			if n := testing.AllocsPerRun(100, func() { _, _ = th.Allow(ctx, "k", q) }); n != 0 {
				t.Errorf("%v with %T: %v allocations per Allow", q, q.Enforcer(), n)
			}
		}
	}
}

// Under concurrency, with enforcement switched on and off meanwhile,
// exactly Limit calls are counted: each call is an admission that counted,
// a refusal, or a would-be denial, and never two of them.
func TestEnforcementConcurrent(t *testing.T) {
	th := newThrottler(t, newMemory(t), &throttler.Options{Clock: func() time.Time { return t0 }})
	sw := &switchable{}
	p := throttler.PerMinute(50).Named("api").EnforcedBy(sw)
	var counted, refused, would atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				if g == 0 && i%10 == 0 {
					sw.on.Store(!sw.on.Load())
				}
				d, err := th.Allow(context.Background(), "k", p)
				switch {
				case err != nil:
					t.Error(err)
					return
				case d.WouldDeny:
					would.Add(1)
				case d.Allowed:
					counted.Add(1)
				default:
					refused.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, int64(50), counted.Load())
	assert.Equal(t, int64(750), refused.Load()+would.Load())
	d, err := th.Peek(context.Background(), "k", throttler.PerMinute(50).Named("api"))
	require.NoError(t, err)
	assert.Equal(t, int64(50), d.Used)
}

// A policy with an Enforcer is routed and its store named as any other:
// one Route answer, the call made to the backend it names.
func TestEnforceRoutes(t *testing.T) {
	to := &counting{}
	var last throttler.Observation
	th := newThrottler(t, routing{store: "shard 2", to: to}, &throttler.Options{Clock: func() time.Time { return t0 },
		Observe: func(o throttler.Observation) { last = o }})
	for _, p := range []throttler.Policy{throttler.PerMinute(5).DryRun(), throttler.PerMinute(5)} {
		d, err := th.Allow(context.Background(), "k", p)
		require.NoError(t, err, "%v", p)
		assert.True(t, d.Allowed)
		assert.Equal(t, "shard 2", last.Store)
	}
	assert.Equal(t, 2, to.takes)
}

// A composite runs in dry run as a whole: its Take counts in every member
// or in none, as enforced; a would-be denial counted nothing, so it refunds
// nothing. A member may not carry an Enforcer of its own.
func TestCompositeDryRun(t *testing.T) {
	th := newThrottler(t, newMemory(t), &throttler.Options{Clock: func() time.Time { return t0 }})
	ctx := context.Background()
	perSecond, perHour := throttler.PerSecond(1).Named("s"), throttler.PerHour(5).Named("h")
	all := throttler.All(perSecond, perHour)
	dry := all.DryRun()
	require.NoError(t, dry.Validate())
	var twins [2][]throttler.Decision
	for i, p := range []throttler.Policy{all, dry} {
		key := fmt.Sprint("k", i)
		for range 3 {
			d, err := th.Allow(ctx, key, p)
			require.NoError(t, err)
			twins[i] = append(twins[i], d)
		}
		h, err := th.Peek(ctx, key, perHour)
		require.NoError(t, err)
		assert.Equal(t, int64(1), h.Used, "%v: a denied composite counts in no member", p)
	}
	for c := range 3 {
		e, d := twins[0][c], twins[1][c]
		assert.True(t, d.Allowed, "call %d", c)
		assert.Equal(t, !e.Allowed, d.WouldDeny, "call %d", c)
		assert.Equal(t, e.Used, d.Used, "call %d", c)
		assert.Equal(t, e.Remaining, d.Remaining, "call %d", c)
	}
	_, err := th.Refund(ctx, "k1", dry, 1, twins[1][2])
	require.ErrorIs(t, err, throttler.ErrNotRefunded)

	// A composite whose members have their own enforcement may not have
	// one of its own: which would decide is not obvious.
	byMember := throttler.All(perSecond, perHour.DryRun())
	require.NoError(t, byMember.Validate())
	assert.Nil(t, byMember.Enforcer())
	for _, p := range []throttler.Policy{byMember.DryRun(), byMember.EnforcedBy(mapEnforcer{})} {
		require.ErrorIs(t, p.Validate(), throttler.ErrInvalidPolicy)
		_, err = th.Allow(ctx, "k", p)
		require.ErrorIs(t, err, throttler.ErrInvalidPolicy)
	}
	_, err = th.Allow(ctx, "k", throttler.All(perSecond, perHour.EnforcedBy(nil)))
	require.ErrorIs(t, err, throttler.ErrInvalidPolicy)
}

// memberStep is a call at t0+at on a composite of an enforced per-second
// member and a per-hour member in dry run, and what it answers: the
// composite's Allowed, WouldDeny, Remaining and binding member, and each
// member's Used and WouldDeny after it.
type memberStep struct {
	at                 time.Duration
	op                 throttler.Op
	allowed, wouldDeny bool
	remaining          int64
	binding            int
	used               [2]int64
	memberWouldDeny    [2]bool
}

// A member of a composite in dry run counts as it would enforced and never
// stops the others: the enforced member counts exactly what it counts alone
// (a twin on another key, call for call), the dry-run one nothing when it
// would deny, and the headers' numbers (Remaining, the binding member) are
// the enforced member's. Hand-computed at fixed instants.
func TestCompositeMemberDryRun(t *testing.T) {
	now := t0
	th := newThrottler(t, newMemory(t), &throttler.Options{Clock: func() time.Time { return now }})
	ctx := context.Background()
	perSecond, perHour := throttler.PerSecond(2).Named("s"), throttler.PerHour(3).Named("h")
	p := throttler.All(perSecond, perHour.DryRun())
	const take, peek = throttler.OpTake, throttler.OpPeek
	steps := []memberStep{
		{at: 0, op: take, allowed: true, remaining: 1, binding: 0, used: [2]int64{1, 1}},
		{at: 0, op: take, allowed: true, remaining: 0, binding: 0, used: [2]int64{2, 2}},
		// The enforced member denies: nothing is counted anywhere.
		{at: 0, op: take, allowed: false, remaining: 0, binding: 0, used: [2]int64{2, 2}},
		{at: time.Second, op: take, allowed: true, remaining: 1, binding: 0, used: [2]int64{1, 3}},
		// The dry-run member would deny: the enforced one counts alone.
		{at: time.Second, op: take, allowed: true, wouldDeny: true, remaining: 0, binding: 0,
			used: [2]int64{2, 3}, memberWouldDeny: [2]bool{false, true}},
		{at: 2 * time.Second, op: peek, allowed: true, wouldDeny: true, remaining: 2, binding: 0,
			used: [2]int64{0, 3}, memberWouldDeny: [2]bool{false, true}},
		{at: 2 * time.Second, op: take, allowed: true, wouldDeny: true, remaining: 1, binding: 0,
			used: [2]int64{1, 3}, memberWouldDeny: [2]bool{false, true}},
	}
	var last throttler.Decision
	for i, st := range steps {
		now = t0.Add(st.at)
		var d throttler.Decision
		var err error
		if st.op == take {
			d, err = th.Allow(ctx, "k", p)
		} else {
			d, err = th.Peek(ctx, "k", p)
		}
		require.NoError(t, err, "step %d", i)
		assert.Equal(t, st.allowed, d.Allowed, "step %d: Allowed", i)
		assert.Equal(t, st.wouldDeny, d.WouldDeny, "step %d: WouldDeny", i)
		assert.Equal(t, st.remaining, d.Remaining, "step %d: Remaining", i)
		assert.Equal(t, st.binding, d.Binding(), "step %d: Binding", i)
		assert.Equal(t, st.allowed, d.RetryAfter == 0, "step %d: RetryAfter %v", i, d.RetryAfter)
		for j, m := range d.Members() {
			if st.op == peek || d.Allowed {
				assert.Equal(t, st.used[j], m.Used, "step %d: member %d Used", i, j)
			}
			assert.Equal(t, st.memberWouldDeny[j], m.WouldDeny, "step %d: member %d WouldDeny", i, j)
		}
		for j, m := range []throttler.Policy{perSecond, perHour} {
			md, err := th.Peek(ctx, "k", m)
			require.NoError(t, err)
			assert.Equal(t, st.used[j], md.Used, "step %d: member %d counted", i, j)
		}
		// The enforced member's twin, alone on another key, at the same instant.
		var twin throttler.Decision
		if st.op == peek {
			twin, err = th.Peek(ctx, "twin", perSecond)
		} else {
			twin, err = th.Allow(ctx, "twin", perSecond)
		}
		require.NoError(t, err)
		assert.Equal(t, twin.Allowed, d.Allowed, "step %d: the enforced member answers as alone", i)
		for j, m := range d.Members() {
			if j == 0 && (st.op == peek || d.Allowed) {
				assert.Equal(t, twin.Used, m.Used, "step %d", i)
			}
		}
		last = d
	}

	// A refund gives back what was counted: the enforced member's unit; the
	// member that would have denied counted nothing.
	r, err := th.Refund(ctx, "k", p, 1, last)
	require.NoError(t, err)
	assert.True(t, r.Allowed)
	assert.Equal(t, int64(2), r.Remaining)
	h, err := th.Peek(ctx, "k", perHour)
	require.NoError(t, err)
	assert.Equal(t, int64(3), h.Used)
}

// A member enforced for some keys (EnforcedBy) is enforced there and in dry
// run elsewhere; with every member in dry run for a key the composite
// answers as a dry-run composite, from all its members.
func TestCompositeMemberEnforcedBy(t *testing.T) {
	th := newThrottler(t, newMemory(t), &throttler.Options{Clock: func() time.Time { return t0 }})
	ctx := context.Background()
	a, b := throttler.PerMinute(1).Named("a"), throttler.PerMinute(5).Named("b")
	p := throttler.All(a.EnforcedBy(mapEnforcer{"enforced": true}), b)
	all := throttler.All(a.DryRun(), b.DryRun())
	for _, c := range []struct {
		key       string
		p         throttler.Policy
		allowed   []bool
		remaining []int64
	}{
		{"enforced", p, []bool{true, false, false}, []int64{0, 0, 0}},
		{"dry", p, []bool{true, true, true}, []int64{4, 3, 2}},
		{"all-dry", all, []bool{true, true, true}, []int64{0, 0, 0}},
	} {
		for i := range c.allowed {
			d, err := th.Allow(ctx, c.key, c.p)
			require.NoError(t, err)
			assert.Equal(t, c.allowed[i], d.Allowed, "%s call %d", c.key, i)
			assert.Equal(t, c.remaining[i], d.Remaining, "%s call %d", c.key, i)
			assert.Equal(t, i > 0 && c.allowed[i], d.WouldDeny, "%s call %d", c.key, i)
		}
	}
}

// Under 64 goroutines a dry-run member never lets the enforced one over its
// limit, never counts past its own, and a would-be denial takes the rest
// all or nothing.
func TestCompositeMemberDryRunExact(t *testing.T) {
	th := newThrottler(t, newMemory(t), &throttler.Options{Clock: func() time.Time { return t0 }})
	enforced, dry := throttler.PerMinute(50).Named("e"), throttler.PerMinute(10).Named("d")
	third := throttler.PerMinute(40).Named("t")
	p := throttler.All(enforced, dry.DryRun(), third)
	var admitted, wouldDeny atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 4 {
				d, err := th.Allow(context.Background(), "k", p)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
				if d.WouldDeny {
					wouldDeny.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	used := func(m throttler.Policy) int64 {
		d, err := th.Peek(context.Background(), "k", m)
		require.NoError(t, err)
		return d.Used
	}
	assert.Equal(t, int64(40), admitted.Load(), "the tightest enforced member binds")
	assert.Equal(t, int64(30), wouldDeny.Load())
	assert.Equal(t, int64(40), used(enforced))
	assert.Equal(t, int64(40), used(third))
	assert.Equal(t, int64(10), used(dry))
}
