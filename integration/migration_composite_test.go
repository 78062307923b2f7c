package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/migration"
	"github.com/throttlekit/throttlekit/shadow"
	"github.com/throttlekit/throttlekit/throttler"
)

// A live Memcached → Redis migration of a composite (throttler.All of a
// fixed window and a token bucket), 0% → 10% → 50% → 100% → back to 50%
// with the mirror on and a Flush at every switch, as
// TestMigrationRampAlgorithms runs it for single policies. Clients on 16
// goroutines call through Throttlers over one Migration; each client's
// calls are made in order by one goroutine, as one client's requests are,
// so that the mirror replays every key's calls in the order they were
// answered (the shadow keeps a key's calls on one worker, in order) and
// both stores see the same sequence.
//
// What docs/migration.md promises then ("Moving keys" → Composites, and
// the ramp's "nobody gets a fresh window"), checked exactly:
//
//   - No fresh window: each key's admissions, over the whole ramp, keep
//     each member's own rule. Replayed, each member alone, on one exact
//     store (memory) with only the admitted calls, every one is admitted;
//     mcCheck says where a key went over (the fixed window's Limit per
//     window, windows opening at admitted calls; rampBucketBound) and that
//     some key reached each bound exactly.
//   - A denied composite spends nothing: at the end of every stage, every
//     key's every member, in both stores, is in exactly the state that
//     replay leaves (a member's state is the same taken alone or in a
//     composite). With each key's calls in one order there is no Memcached
//     race, so its bound (an under-admission while a lost race is undone,
//     docs/backends-memcached.md) is 0 here and every undo is done when
//     the call returns; a moving key's compensation refunds at the Take's
//     own instants, in the Take's windows, so it gives back exactly what it
//     took. Nothing is left to tolerate.
//   - The shadows explain every pair: with both stores holding the same
//     state, neither sees a mismatch (no reorder bounds are set, so any
//     member's difference would be one), a drop or an error, and every call
//     is compared or made on both stores. Every key Redis serves here is
//     moving (the members' horizons, 2 and 2.5 minutes, plus Settle, are
//     longer than the run), so its calls go to both stores and the reverse
//     shadow compares none.
//
// The schedule is on a fake clock: in each stage each client makes
// mcRounds Takes mcStep ms apart, asking for 1 or 2 units, about twice
// what either member allows: the fixed window binds at first, the bucket
// once its burst is spent, so each member denies composites the other
// would have admitted (the calls where a member that spent on a denial
// would show). Windows are minutes: the stores expire state after real
// time, which runs faster than this clock between a client's calls (see
// rampRun).

// mcStage is one stage of a ramp: the mirror stays on.
type mcStage struct {
	name    string
	percent int
}

// mcStages is the ramp.
var mcStages = []mcStage{
	{"shadow 0%", 0},
	{"ramp 10%", 10},
	{"ramp 50%", 50},
	{"100%", 100},
	{"rollback 50%", 50},
}

const (
	mcClients    = 96
	mcGoroutines = 16
	mcRounds     = 6
	mcStep       = 15000 // ms
	mcJitter     = 14000 // ms, < mcStep: a client's instants only move forward
)

// mcInstant is client c's instant in stage s, round r, in ms since
// migrationT0.
func mcInstant(s, r, c int) int64 { return int64((s*mcRounds+r)*mcStep + (c*151)%mcJitter) }

// mcStageEnd is an instant after every call of stage s.
func mcStageEnd(s int) int64 { return int64((s + 1) * mcRounds * mcStep) }

func mcCost(r, c int) int64 { return 1 + int64((r+c)%2) }

func mcKey(c int) string { return fmt.Sprintf("mc-client-%03d", c) }

func mcAt(ms int64) time.Time { return migrationT0.Add(time.Duration(ms) * time.Millisecond) }

// mcComposite is the composite under test, its members named after name:
// 3 a minute in a fixed window, beside a bucket of 5 refilling 2 a minute.
func mcComposite(name string) (c, fw, tb throttler.Policy) {
	fw = throttler.Policy{Name: name + "-min", Limit: 3, Window: time.Minute}
	tb = throttler.Policy{Name: name + "-tb", Limit: 2, Window: time.Minute}.WithBurst(5)
	return throttler.All(fw, tb), fw, tb
}

// mcWindowBound is the fixed window's rule replayed over one key's
// admissions in time order: a window opens at the first admission at or
// after the end of the last one (a denied composite opens none), and holds
// at most Limit units. A store that lost the key's window opens another
// inside it, whose units show here.
func mcWindowBound(p throttler.Policy, adm []rampAdmission) rampExcess {
	w := p.Window.Milliseconds()
	x := rampExcess{most: p.Limit}
	var start, units int64
	for i, a := range adm {
		if i == 0 || a.t >= start+w {
			start, units = a.t, 0
		}
		units += a.cost
		x.worst(start, a.t, units, p.Limit)
	}
	return x
}

// mcResult is what a ramp recorded.
type mcResult struct {
	admitted [][]rampAdmission // per client, in time order
	denied   int
	onlyBy   [2]int // composites denied by member i alone: the other would have admitted
	// beyond[i]: admissions that member i, taken alone on one exact store
	// with only the admitted calls, denies.
	beyond [2]int
	onNew  [][]bool
	moved  []int // per stage: clients served by another store than in the stage before
	// per stage: clients whose stores' states differ from the replay of
	// their admissions, and a few of the differences.
	forked   []int
	forkedAt []string
	stats    migration.Stats // at the end
}

// mcEach runs f for clients [0, n) on mcGoroutines goroutines, each with
// its own Throttler over m whose clock reads the goroutine's instant
// (set by f before each call); one client's calls are made in order by one
// goroutine.
func mcEach(t *testing.T, m *migration.Migration, n int, f func(th *throttler.Throttler, at *atomic.Int64, c int)) {
	t.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range mcGoroutines {
		at := new(atomic.Int64)
		th, err := throttler.New(m, &throttler.Options{
			Clock:      func() time.Time { return mcAt(at.Load()) },
			Timeout:    10 * time.Second,
			FailClosed: true, // a failed call admits nothing
		})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for c := int(next.Add(1) - 1); c < n; c = int(next.Add(1) - 1) {
				f(th, at, c)
			}
		})
	}
	wg.Wait()
}

// mcRun runs the ramp for the composite named name on m over old and nu,
// r being m's rollout. With warm false the shadow stage runs with the
// mirror off (Redis never sees the first stage's calls); with warm set,
// every stage's shadows must have compared every call without a mismatch,
// drop or error.
func mcRun(t *testing.T, m *migration.Migration, r *flags.Percent, old, nu throttler.Backend, name string, warm bool) mcResult {
	t.Helper()
	ctx := context.Background()
	c, fw, tb := mcComposite(name)
	members := []throttler.Policy{fw, tb}
	// ref holds each member's state as the admitted calls alone leave it.
	ref, err := memory.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ref.Close() })
	res := mcResult{admitted: make([][]rampAdmission, mcClients), moved: make([]int, len(mcStages)),
		forked: make([]int, len(mcStages))}
	before := m.Stats()
	for s, st := range mcStages {
		onStage := enterStage(t, r, st.percent, warm || s > 0, mcClients, mcKey, &res.onNew, res.moved)
		var mu sync.Mutex
		mcEach(t, m, mcClients, func(th *throttler.Throttler, at *atomic.Int64, cl int) {
			var adm []rampAdmission
			var denied int
			var onlyBy [2]int
			for round := range mcRounds {
				now, cost := mcInstant(s, round, cl), mcCost(round, cl)
				at.Store(now)
				d, err := th.AllowN(ctx, mcKey(cl), c, cost)
				if err != nil {
					t.Errorf("%s: client %d: %v", st.name, cl, err)
					return
				}
				if d.Allowed {
					adm = append(adm, rampAdmission{now, cost, s})
					continue
				}
				denied++
				var denying []int
				for i, md := range d.Members() {
					if !md.Allowed {
						denying = append(denying, i)
					}
				}
				if len(denying) == 1 {
					onlyBy[denying[0]]++
				}
			}
			mu.Lock()
			res.admitted[cl] = append(res.admitted[cl], adm...)
			res.denied += denied
			res.onlyBy[0] += onlyBy[0]
			res.onlyBy[1] += onlyBy[1]
			mu.Unlock()
		})
		// The stage boundary: every mirrored call has landed before the
		// rollout moves, and before the stores are read.
		migrationFlush(t, m)
		now := m.Stats()
		if warm {
			migrationClean(t, st.name, "forward", now.Forward)
			migrationClean(t, st.name, "reverse", now.Reverse)
			compared := now.Forward.Compared + now.Reverse.Compared + now.Moving.Calls -
				before.Forward.Compared - before.Reverse.Compared - before.Moving.Calls
			if want := uint64(mcRounds * mcClients); compared != want {
				t.Errorf("%s: %d calls compared or made on both stores, want every one of %d", st.name, compared, want)
			}
		}
		if got, want := now.Routed.New-before.Routed.New, uint64(mcRounds*onStage); got != want {
			t.Errorf("%s: %d calls routed to Redis, want %d", st.name, got, want)
		}
		// Replay the stage's admissions on ref, each member alone, then
		// read every member of every key in ref and in both stores.
		end := mcAt(mcStageEnd(s))
		for cl := range mcClients {
			for _, a := range res.admitted[cl] {
				if a.stage != s {
					continue
				}
				for i, p := range members {
					d, err := ref.Take(ctx, mcKey(cl), p, a.cost, mcAt(a.t))
					if err != nil {
						t.Fatalf("replay: %v", err)
					}
					if !d.Allowed {
						// Admitted beyond p's own rule: mcCheck says where.
						res.beyond[i]++
					}
				}
			}
			for _, p := range members {
				want, err := ref.Peek(ctx, mcKey(cl), p, end)
				if err != nil {
					t.Fatal(err)
				}
				forked := false
				for _, b := range []struct {
					name string
					b    throttler.Backend
				}{{"Memcached", old}, {"Redis", nu}} {
					got, err := b.b.Peek(ctx, mcKey(cl), p, end)
					if err != nil {
						t.Fatalf("%s: peek %s: %v", st.name, b.name, err)
					}
					if got.Used != want.Used || got.Remaining != want.Remaining || !got.ResetAt.Equal(want.ResetAt) {
						forked = true
						if len(res.forkedAt) < 8 {
							res.forkedAt = append(res.forkedAt, fmt.Sprintf(
								"%s: %s %s in %s: used %d, remaining %d, reset +%dms; its admissions leave used %d, remaining %d, reset +%dms",
								st.name, mcKey(cl), p.Name, b.name, got.Used, got.Remaining, got.ResetAt.Sub(migrationT0).Milliseconds(),
								want.Used, want.Remaining, want.ResetAt.Sub(migrationT0).Milliseconds()))
						}
					}
				}
				if forked {
					res.forked[s]++
					break
				}
			}
		}
		t.Logf("%-12s %3d%%: %2d clients on Redis, %2d moved; forward compared %4d, reverse compared %4d, "+
			"mismatches %d, moving keys' calls %d; %d clients' stores not as their admissions leave them",
			st.name, st.percent, onStage, res.moved[s], now.Forward.Compared, now.Reverse.Compared,
			now.Forward.Mismatched+now.Reverse.Mismatched, now.Moving.Calls, res.forked[s])
		before = now
	}
	res.stats = before
	return res
}

// mcCheck checks every client's admissions against each member's bound.
// It returns one line per client over a bound, and each member's least
// slack over the clients (0: some interval was at its bound exactly).
func mcCheck(fw, tb throttler.Policy, res mcResult) (over map[int]string, slack [2]int64) {
	over = map[int]string{}
	slack = [2]int64{fw.Capacity(), tb.Capacity()}
	for cl, adm := range res.admitted {
		for i, x := range []rampExcess{mcWindowBound(fw, adm), rampBucketBound(tb, adm)} {
			slack[i] = min(slack[i], -x.over())
			if x.over() <= 0 {
				continue
			}
			var trail []string
			for _, a := range adm {
				if a.t >= x.from && a.t <= x.to {
					trail = append(trail, fmt.Sprintf("+%dms:%d (%s)", a.t, a.cost, mcStages[a.stage].name))
				}
			}
			over[cl] += fmt.Sprintf("%s %s: %d units admitted in [+%dms, +%dms], at most %d: %s; ",
				mcKey(cl), []string{"fixed window", "bucket"}[i], x.units, x.from, x.to, x.most, strings.Join(trail, " "))
		}
	}
	return over, slack
}

// TestMigrationComposite: the ramp of composites keeps every member's
// bound on every key, leaves both stores in exactly the state the
// admissions leave, and both shadows agree on every composite. Then the
// same ramp without the shadow stage's warm-up and without moving keys:
// the keys moved to an empty Redis get fresh windows and buckets, and the
// checks must catch them. Then the hot keys (see mcHot), through the same
// ramp and with Redis serving from the start.
func TestMigrationComposite(t *testing.T) {
	old, nu, _, _ := migrationStores(t)
	o := &shadow.Options{Workers: 16, QueueSize: 4096, Timeout: 5 * time.Second}
	run := func(t *testing.T, name string, warm bool) mcResult {
		r := migrationPercent(t)
		var rollout flags.Rollout = r
		if !warm {
			rollout = loadHidden{r} // no moving keys: see TestMigrationRampAlgorithms
		}
		m := migrationNew(t, old, nu, rollout, &migration.Options{Forward: o, Reverse: o})
		if !m.Traits().Composites {
			t.Fatal("the Migration takes no composites over Memcached and Redis")
		}
		return mcRun(t, m, r, old, nu, name, warm)
	}
	t.Run("hot keys", func(t *testing.T) { mcHot(t, old, nu, "mc-hot", mcStages) })
	// Redis serving every key from the start (no change of percentage, so
	// no moving key): the reverse shadow mirrors every composite to
	// Memcached, whose races are then the candidate's.
	t.Run("hot keys served by Redis", func(t *testing.T) {
		mcHot(t, old, nu, "mc-hot-redis", []mcStage{{"100%", 100}, {"100%, next minute", 100}})
	})
	t.Run("ramp", func(t *testing.T) {
		res := run(t, "mc", true)
		_, fw, tb := mcComposite("mc")
		over, slack := mcCheck(fw, tb, res)
		for _, line := range over {
			t.Error(line)
		}
		for _, line := range res.forkedAt {
			t.Error(line)
		}
		if res.beyond != [2]int{} {
			t.Errorf("admissions beyond each member's own rule, replayed on one exact store: %v", res.beyond)
		}
		var units int64
		for _, adm := range res.admitted {
			for _, a := range adm {
				units += a.cost
			}
		}
		mv := res.stats.Moving
		t.Logf("%d units admitted, %d composites denied (by the window alone %d, by the bucket alone %d); "+
			"least slack: window %d, bucket %d; moving keys: %d calls, %d compensated, %d refunds failed, %d one store, %d leveled",
			units, res.denied, res.onlyBy[0], res.onlyBy[1], slack[0], slack[1],
			mv.Calls, mv.Compensated, mv.RefundFailed, mv.OneStore, mv.Leveled)
		if mv.OneStore != 0 || mv.RefundFailed != 0 {
			t.Errorf("a store failed under the moving keys: %+v", mv)
		}
		// The test could fail: keys moved both ways and were served by
		// both stores, each member alone denied composites the other would
		// have admitted, and each member's bound was reached exactly.
		if res.moved[1] == 0 || res.moved[2] == 0 || res.moved[3] == 0 || res.moved[4] == 0 || mv.Calls == 0 ||
			res.onlyBy[0] == 0 || res.onlyBy[1] == 0 || slack != [2]int64{} {
			t.Errorf("the ramp did not press on the bounds: moved %v, moving calls %d, denied by one member alone %v, least slack %v",
				res.moved, mv.Calls, res.onlyBy, slack)
		}
	})
	t.Run("without the warm-up, the checks catch it", func(t *testing.T) {
		res := run(t, "mc-cold", false)
		_, fw, tb := mcComposite("mc-cold")
		over, _ := mcCheck(fw, tb, res)
		missed := 0
		for cl, moved := range res.onNew[1] {
			if _, ok := over[cl]; moved && !ok {
				missed++
			}
		}
		t.Logf("%d clients over a bound, %d of them among the %d moved to an empty Redis at 10%%; "+
			"admissions beyond each member's rule %v; clients whose stores are not as their admissions leave them, per stage: %v",
			len(over), res.moved[1]-missed, res.moved[1], res.beyond, res.forked)
		// Redis never saw the first stage: every key is in another state
		// there, and every key moved to it at 10% was admitted over a bound.
		if missed > 0 || res.moved[1] == 0 || res.beyond == [2]int{} || res.forked[1] != mcClients {
			t.Errorf("the keys moved to an empty Redis were not caught: %d of %d within their bounds, %d of %d in states unlike their admissions",
				missed, res.moved[1], res.forked[1], mcClients)
		}
		for cl, moved := range res.onNew[1] {
			if moved {
				t.Logf("caught, for example: %s", over[cl])
				break
			}
		}
	})
}

// TestMigrationCompositeBounds: the fixed window's bound on hand-computed
// admissions, without servers (the bucket's is rampBucketBound, which
// TestRampBounds checks). 3 a minute.
func TestMigrationCompositeBounds(t *testing.T) {
	fw := throttler.Policy{Name: "f", Limit: 3, Window: time.Minute}
	at := func(pairs ...int64) []rampAdmission {
		var out []rampAdmission
		for i := 0; i+1 < len(pairs); i += 2 {
			out = append(out, rampAdmission{t: pairs[i], cost: pairs[i+1]})
		}
		return out
	}
	for _, tc := range []struct {
		name string
		adm  []rampAdmission
		over int64
	}{
		{"nothing", nil, -3},
		{"the limit", at(0, 1, 30000, 2), 0},
		{"the next window opens at its first admission", at(0, 3, 60000, 3), 0},
		{"1 ms early", at(0, 3, 59999, 1), 1},
		{"a window opened late ends late", at(0, 1, 70000, 2, 120000, 1, 129999, 1), 1},
		{"a fresh window inside the last", at(0, 3, 20000, 2, 40000, 3), 5},
	} {
		if got := mcWindowBound(fw, tc.adm).over(); got != tc.over {
			t.Errorf("%s: over by %d, want %d", tc.name, got, tc.over)
		}
	}
}

// The hot keys: 16 goroutines on each of 4 keys at once, where Memcached's
// composite is not atomic (a member taken, then undone when the next one
// lost a race: meanwhile others may be denied, never admitted past a limit)
// and the two stores count a key's concurrent calls in other orders. The
// login pair, 4 a minute and 26 an hour, both fixed windows (no bucket to
// level), cost 1, every call of a round at one instant: what an exact store
// admits in a round does not depend on the order of its calls. Four of the
// goroutines take the hour alone, racing the composites' takes of it: at
// the second stage's start the hour has 6 left and the minute 4, so a
// composite takes the minute first and may lose the hour to them (its
// minute then undone). Each key is asked 16 units a round, mcHotRounds
// rounds a stage, one stage a minute; the hour is spent in the second stage
// and every later one must keep it shut across the moves.
//
// Checked exactly, with no tolerance: every admission is admitted again by
// one exact store (memory) replaying the admitted calls, each member
// alone; and at the end of every stage each store's count of each member
// is what that store admitted, from the shadows' pairs (a pair's control
// and candidate answers say which store counted the call) and the moving
// keys' calls (admitted: counted on both), so a lost race left undone, or
// a denied composite that spent, shows. Both shadows classify the pairs
// the order of calls explains as reordered, as docs/migration.md
// ("Reordered pairs") sets the bounds for calls at one instant (a span of
// a ms; the whole Limit, since windows fill within it): no mismatch.
const (
	mcMaxStages = 8 // of a hot keys' ramp
	mcHotKeys   = 4
	mcHotRounds = 4
	mcHotStep   = 15000 // ms: a stage is a minute
)

// mcHotKeyNames are keys whose routes move at each step of mcStages: one
// at 10%, one at 50%, two at 100% (which the rollback moves back).
func mcHotKeyNames(t *testing.T) []string {
	t.Helper()
	want := []func(b int) bool{
		func(b int) bool { return b <= 10 },
		func(b int) bool { return b > 10 && b <= 50 },
		func(b int) bool { return b > 50 },
		func(b int) bool { return b > 50 },
	}
	var keys []string
	for i := 0; len(keys) < mcHotKeys && i < 10000; i++ {
		k := fmt.Sprintf("mc-hot-%04d", i)
		if want[len(keys)](flags.Bucket(flags.DefaultGroupID, k)) {
			keys = append(keys, k)
		}
	}
	if len(keys) < mcHotKeys {
		t.Fatalf("found only keys %v", keys)
	}
	return keys
}

// mcCounted is what one store counted (or the Throttler admitted), per
// key: units in the hour, per stage, and in the minute per stage (the
// composites' only).
type mcCounted struct {
	hour   map[string]int64
	stage  map[string][]int64
	minute map[string][]int64
}

func newMCCounted() *mcCounted {
	return &mcCounted{hour: map[string]int64{}, stage: map[string][]int64{}, minute: map[string][]int64{}}
}

// add counts units of key in stage, by a composite or by the hour alone.
func (c *mcCounted) add(key string, stage int, units, composite int64) {
	if c.minute[key] == nil {
		c.minute[key], c.stage[key] = make([]int64, mcMaxStages), make([]int64, mcMaxStages)
	}
	c.hour[key] += units
	c.stage[key][stage] += units
	c.minute[key][stage] += composite
}

// mcHot runs the hot keys' ramp through stages on a Migration over old
// and nu whose rollout starts at the first stage's percentage, and checks
// it (see the constants above). Its policies are named after name.
func mcHot(t *testing.T, old, nu throttler.Backend, name string, stages []mcStage) {
	ctx := context.Background()
	minute := throttler.Policy{Name: name + "-min", Limit: 4, Window: time.Minute}
	hour := throttler.Policy{Name: name + "-hour", Limit: 26, Window: time.Hour}
	c := throttler.All(minute, hour)
	keys := mcHotKeyNames(t)
	stageMs := int64(mcHotRounds * mcHotStep)
	// What each store counted: [0] Memcached, [1] Redis. A shadow's pair
	// says what its control and its candidate admitted; a moving key's
	// call, made on both stores, counts in both when it is admitted.
	var mu sync.Mutex
	counted := [2]*mcCounted{newMCCounted(), newMCCounted()}
	viaControl := newMCCounted() // admitted by a shadow's control
	publish := func(control, candidate int) func(shadow.Result) {
		return func(r shadow.Result) {
			if r.Op != throttler.OpTake || r.ControlErr != nil || r.CandidateErr != nil {
				return // drops and errors fail the test below
			}
			s := int(r.Now.Sub(migrationT0).Milliseconds() / stageMs)
			mu.Lock()
			defer mu.Unlock()
			var composite int64
			if r.Policy.Composite() {
				composite = r.Cost
			}
			if r.Control.Allowed {
				counted[control].add(r.Key, s, r.Cost, composite)
				viaControl.add(r.Key, s, r.Cost, composite)
			}
			if r.Candidate.Allowed {
				counted[candidate].add(r.Key, s, r.Cost, composite)
			}
		}
	}
	// The stores count one round's concurrent calls in other orders: at
	// one instant, so no span is needed but a ms, and each member's window
	// fills within it, so up to the whole Limit (docs/migration.md,
	// "Reordered pairs").
	fwd := &shadow.Options{Workers: 16, QueueSize: 4096, Timeout: 5 * time.Second,
		ReorderSpan: time.Millisecond, ReorderUnits: hour.Limit, Publish: publish(0, 1)}
	rev := *fwd
	rev.Publish = publish(1, 0)
	r, err := flags.NewPercent(stages[0].percent)
	if err != nil {
		t.Fatal(err)
	}
	r.SetMirror(true)
	m := migrationNew(t, old, nu, r, &migration.Options{Forward: fwd, Reverse: &rev})
	var at atomic.Int64
	th, err := throttler.New(m, &throttler.Options{
		Clock:      func() time.Time { return mcAt(at.Load()) },
		Timeout:    10 * time.Second,
		FailClosed: true,
	})
	if len(stages) > mcMaxStages {
		t.Fatalf("%d stages, at most %d", len(stages), mcMaxStages)
	}
	if err != nil {
		t.Fatal(err)
	}
	// admitted holds each key's admissions: instant (ms since migrationT0)
	// and whether a composite made it (else the hour alone).
	type admission struct {
		t         int64
		composite bool
	}
	admitted := map[string][]admission{}
	total := newMCCounted() // the Throttler's admissions
	var denied, deniedByHour int
	for s, st := range stages {
		if err := r.Set(st.percent); err != nil {
			t.Fatal(err)
		}
		for round := range mcHotRounds {
			now := int64(s)*stageMs + int64(round*mcHotStep)
			at.Store(now)
			var wg sync.WaitGroup
			for g := range mcGoroutines {
				wg.Go(func() {
					// Two goroutines take the hour alone, racing the
					// composites' takes of it.
					p, composite := c, int64(1)
					if g%4 == 0 {
						p, composite = hour, 0
					}
					for i := range keys {
						key := keys[(g+i)%len(keys)]
						d, err := th.Allow(ctx, key, p)
						if err != nil {
							t.Errorf("%s: %s: %v", st.name, key, err)
							return
						}
						mu.Lock()
						if d.Allowed {
							admitted[key] = append(admitted[key], admission{now, composite > 0})
							total.add(key, s, 1, composite)
						} else if composite > 0 {
							denied++
							for i, md := range d.Members() {
								if i == 1 && !md.Allowed {
									deniedByHour++
								}
							}
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
		}
		migrationFlush(t, m)
		stats := m.Stats()
		for _, sh := range []struct {
			name string
			s    shadow.Stats
		}{{"forward", stats.Forward}, {"reverse", stats.Reverse}} {
			if sh.s.Mismatched != 0 || sh.s.ByKind[shadow.Dropped] != 0 ||
				sh.s.ByKind[shadow.CandidateError] != 0 || sh.s.ByKind[shadow.ControlError] != 0 {
				t.Errorf("%s: %s shadow: compared %d, mismatched %d, kinds %v, last %v",
					st.name, sh.name, sh.s.Compared, sh.s.Mismatched, sh.s.ByKind, sh.s.LastMismatches)
			}
		}
		// Each store counts what it admitted and nothing it denied: read
		// within the stage's minute window and the run's hour.
		mu.Lock()
		for _, key := range keys {
			moving := total.stage[key][s] - viaControl.stage[key][s]
			movingComposite := total.minute[key][s] - viaControl.minute[key][s]
			for i := range counted {
				counted[i].add(key, s, moving, movingComposite)
			}
		}
		for _, key := range keys {
			for i, b := range []throttler.Backend{old, nu} {
				for _, p := range []throttler.Policy{minute, hour} {
					d, err := b.Peek(ctx, key, p, mcAt(int64(s+1)*stageMs-1))
					if err != nil {
						t.Fatal(err)
					}
					want := counted[i].hour[key]
					if p == minute {
						want = counted[i].minute[key][s]
					}
					if d.Used != want {
						t.Errorf("%s: %s %s in %s: used %d, counted %d (the Throttler admitted %d this stage, %d in all)",
							st.name, key, p.Name, []string{"Memcached", "Redis"}[i], d.Used, want,
							total.minute[key][s], total.hour[key])
					}
				}
			}
		}
		mu.Unlock()
		t.Logf("%-12s %3d%%: admitted %v in all; Memcached counts %v, Redis %v; forward compared %d (reordered %d), "+
			"reverse compared %d (reordered %d), moving keys' calls %d, compensated %d",
			st.name, st.percent, total.hour, counted[0].hour, counted[1].hour,
			stats.Forward.Compared, stats.Forward.ByKind[shadow.Reordered],
			stats.Reverse.Compared, stats.Reverse.ByKind[shadow.Reordered], stats.Moving.Calls, stats.Moving.Compensated)
	}
	// No member admitted past its own rule: replayed on one exact store.
	ref, err := memory.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ref.Close() })
	full := 0
	for _, key := range keys {
		for _, a := range admitted[key] {
			ps := []throttler.Policy{hour}
			if a.composite {
				ps = append(ps, minute)
			}
			for _, p := range ps {
				d, err := ref.Take(ctx, key, p, 1, mcAt(a.t))
				if err != nil {
					t.Fatal(err)
				}
				if !d.Allowed {
					t.Errorf("%s: admitted at +%dms (%s) beyond %s", key, a.t, stages[a.t/stageMs].name, p.Name)
				}
			}
		}
		if total.hour[key] == hour.Limit {
			full++
		}
	}
	st := m.Stats().Moving
	t.Logf("%d composites denied, %d by the hour; %d of %d keys admitted the hour's whole limit; moving keys: %d calls, "+
		"%d compensated, %d refunds failed, %d one store", denied, deniedByHour, full, len(keys), st.Calls, st.Compensated,
		st.RefundFailed, st.OneStore)
	if st.OneStore != 0 || st.RefundFailed != 0 {
		t.Errorf("a store failed under the moving keys: %+v", st)
	}
	var compared, reordered uint64
	for _, sh := range []shadow.Stats{m.Stats().Forward, m.Stats().Reverse} {
		compared += sh.Compared
		reordered += sh.ByKind[shadow.Reordered]
	}
	// Moving keys only where the percentage changed; pairs compared in
	// the shadows of the stores that served.
	moved := stages[len(stages)-1].percent != stages[0].percent
	if full == 0 || deniedByHour == 0 || compared == 0 || moved != (st.Calls > 0) {
		t.Errorf("the hot keys did not press on the bounds: %d keys at the hour's limit, %d denied by the hour, "+
			"%d pairs compared (%d reordered), %d moving keys' calls", full, deniedByHour, compared, reordered, st.Calls)
	}
}
