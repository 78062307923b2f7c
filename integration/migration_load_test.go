package integration

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/backend/memcached"
	"github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/migration"
	"github.com/throttlekit/throttlekit/shadow"
	"github.com/throttlekit/throttlekit/throttler"
)

// A live migration under load, where a ramp must never hand out fresh
// windows: real Memcached is the old store and real Redis the new
// one; four processes (each its own Migration and Throttler over its own
// clients, its own rollout and its own clock) run 24 closed-loop
// goroutines each against a few dozen shared keys, while the rollout goes
// 0% → 50% → 100% → 0% with no Flush at any switch. Each process sees
// every change a little later than the one before (as processes polling a
// flag do), and its clock is the shared one plus its own offset of up to
// ±50 ms. The shadows' queues hold two calls, so mirrored calls drop: the
// new store is never fully warm, which is what the moving keys must make
// up for. Every admission is recorded with the instant its process gave
// the stores, and every key's admissions are checked against its
// algorithm's bound, widened by how far two calls' instants can be out of
// order (below).

// loadProcessOffsets are the processes' clock offsets: ±50 ms apart at
// most from the shared clock, 100 ms between two processes.
var loadProcessOffsets = []time.Duration{-50 * time.Millisecond, -17 * time.Millisecond, 17 * time.Millisecond, 50 * time.Millisecond}

// loadProcessLag is when each process sees a change of the rollout, after
// the stage starts.
var loadProcessLag = []int64{0, 13, 29, 47} // ms

const (
	loadGoroutines = 24 // per process
	loadKeys       = 48
	// loadSettle covers the processes' lag (47 ms; more when the goroutine
	// that changes their rollouts waits for a CPU, which the run measures),
	// their clocks' offsets (100 ms apart) and loadLateAfter, beyond which
	// a call is reported late (migration.Options.LateAfter).
	loadSettle    = 1500 * time.Millisecond
	loadLateAfter = 500 * time.Millisecond
	// loadTimeout is the Throttler's Timeout (and the clients'): the only
	// failure a call of a run with healthy stores may have is having no
	// answer for that long (loadEarlyFailures).
	loadTimeout = 2 * time.Second
)

// loadStage is each stage's length in ms: 4 s in `make test`; a longer
// soak sets THROTTLEKIT_SOAK_STAGE (a Go duration, e.g. 30s), as
// docs/migration.md records ("Soak").
func loadStage(t *testing.T) int64 {
	v := os.Getenv("THROTTLEKIT_SOAK_STAGE")
	if v == "" {
		return 4000
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < time.Second {
		t.Fatalf("THROTTLEKIT_SOAK_STAGE=%q: want a Go duration of at least 1s", v)
	}
	return d.Milliseconds()
}

// loadFixed is the fixed window of the runs: its Window is ten times the
// usual flight of a call on a loaded machine under -race, so that the
// disorder it allows does not hide a fresh window.
var loadFixed = throttler.Policy{Limit: 5, Window: time.Second}

// loadPercents is the ramp: one stage per percentage, the mirror on.
var loadPercents = []int{0, 50, 100, 0}

// loadClock is the shared clock: whole milliseconds since the run started,
// read off the monotonic clock, so that it steps by 1 ms and runs exactly
// as fast as the clock the moving keys' horizons are measured on (a window
// clock slower than that one shortens them: docs/migration.md, "Moving
// keys"). Nothing sleeps to move it; a clock advanced by a goroutine lags
// whenever that goroutine waits for a CPU, by hundreds of milliseconds on a
// loaded machine.
type loadClock struct{ start time.Time }

func (c *loadClock) ms() int64 { return time.Since(c.start).Milliseconds() }

func (c *loadClock) at(off time.Duration) time.Time {
	return migrationT0.Add(time.Duration(c.ms())*time.Millisecond + off)
}

// loadStampKey carries, in a call's context, where to record the instant
// the Throttler gave the stores for it.
type loadStampKey struct{}

// loadStamped is a Migration that records each Take's now.
type loadStamped struct{ *migration.Migration }

func (s loadStamped) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	if slot, ok := ctx.Value(loadStampKey{}).(*atomic.Int64); ok {
		slot.Store(now.Sub(migrationT0).Milliseconds())
	}
	return s.Migration.Take(ctx, key, p, cost, now)
}

// loadHidden hides a Percent's percentage: a Migration over it cannot tell
// which keys a change moves, so none is ever moving.
type loadHidden struct{ r *flags.Percent }

func (h loadHidden) UseNew(k string) bool { return h.r.UseNew(k) }
func (h loadHidden) Mirroring() bool      { return h.r.Mirroring() }

// loadProcess is one application process.
type loadProcess struct {
	off     time.Duration
	rollout *flags.Percent
	m       *migration.Migration
	th      *throttler.Throttler
}

// loadCall is one Take as its goroutine saw it.
type loadCall struct {
	key     int
	t       int64 // the now the stores were given, ms since migrationT0
	cost    int64
	allowed bool
	resetAt int64 // ms since migrationT0
	flight  int64 // shared-clock ms from the call to its answer
	stage   int
	proc    int
	err     bool
	used    int64 // the admitting decision's Used (TestMigrationStall's)
	// errKind is what failed the call (loadErrKind), "" if nothing did.
	errKind string
}

// loadResult is what a run recorded.
type loadResult struct {
	calls  []loadCall
	stats  []migration.Stats
	moved  []int // per stage, keys routed elsewhere than in the stage before
	errors int
	// errKinds counts the failed calls by loadErrKind.
	errKinds map[string]int
	// lateKeys counts each key's late calls (migration.Options.OnLate), all
	// processes; seeSpread is, per change, how far apart (ms) the first and
	// the last process's rollouts were set.
	lateKeys  map[int]int
	seeSpread []int64
	// stopped is how long (ms, shared clock) loadStop stopped the process.
	stopped int64
}

// loadStop stops this whole process for d: a child shell sends it SIGSTOP,
// then SIGCONT. Every goroutine stalls at once, calls in flight included,
// as in a process throttled by its CPU quota or paused: with d above the
// Throttler's Timeout, every call in flight times out together. It returns
// how far the shared clock moved meanwhile.
func loadStop(t *testing.T, clk *loadClock, d time.Duration) int64 {
	t.Helper()
	from, pid := clk.ms(), os.Getpid()
	cmd := exec.Command("sh", "-c", fmt.Sprintf("kill -STOP %d; sleep %.3f; kill -CONT %d", pid, d.Seconds(), pid))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("stopping the process: %v: %s", err, out)
	}
	return clk.ms() - from
}

// loadRun runs the ramp with the stages of percents for p, on new stacks
// over the servers at mcAddr and redisAddr. With hide set, the processes'
// rollouts hide their percentage (no moving keys). A stop above 0 stops
// this process for that long 1 s into the second stage (loadStop).
func loadRun(t *testing.T, mcAddr, redisAddr string, p throttler.Policy, percents []int, hide bool, stop time.Duration, cost func(*rand.Rand) int64) loadResult {
	t.Helper()
	loadStageMs := loadStage(t)
	clk := loadClock{start: time.Now()}
	// The reorder bounds are docs/migration.md's: the clocks' spread
	// (100 ms) plus the other processes' extra lag, and the units one key
	// can be admitted within it; differences beyond them (a window the
	// dropped calls left unopened) are mismatches.
	small := &shadow.Options{Workers: 1, QueueSize: 2, Timeout: 50 * time.Millisecond, DrainTimeout: 100 * time.Millisecond,
		ReorderSpan: 150 * time.Millisecond, ReorderUnits: p.Capacity()}
	procs := make([]*loadProcess, len(loadProcessOffsets))
	var lateMu sync.Mutex
	lateKeys := map[int]int{}
	for i, off := range loadProcessOffsets {
		old, err := memcached.New(memcachedClient(t, 2*time.Second, mcAddr), nil)
		if err != nil {
			t.Fatal(err)
		}
		rcl := goredis.NewClient(&goredis.Options{
			Addr: redisAddr, ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 64,
			DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
		})
		t.Cleanup(func() { _ = rcl.Close() })
		nu, err := redis.New(rcl, nil)
		if err != nil {
			t.Fatal(err)
		}
		r, err := flags.NewPercent(percents[0])
		if err != nil {
			t.Fatal(err)
		}
		r.SetMirror(true)
		var rollout flags.Rollout = r
		if hide {
			rollout = loadHidden{r}
		}
		m := migrationNew(t, old, nu, rollout, &migration.Options{Forward: small, Reverse: small, Settle: loadSettle, LateAfter: loadLateAfter,
			OnLate: func(key string, _ throttler.Policy, _ time.Duration) {
				k, err := strconv.Atoi(strings.TrimPrefix(key, "load-"))
				if err != nil {
					t.Error(err)
				}
				lateMu.Lock()
				lateKeys[k]++
				lateMu.Unlock()
			}})
		th, err := throttler.New(loadStamped{m}, &throttler.Options{
			Clock:      func() time.Time { return clk.at(off) },
			Timeout:    loadTimeout,
			FailClosed: true, // a failed call admits nothing
		})
		if err != nil {
			t.Fatal(err)
		}
		procs[i] = &loadProcess{off: off, rollout: r, m: m, th: th}
	}

	res := loadResult{moved: make([]int, len(percents))}
	for s := 1; s < len(percents); s++ {
		for k := range loadKeys {
			b := flags.Bucket(flags.DefaultGroupID, loadKey(k))
			if (b <= percents[s]) != (b <= percents[s-1]) {
				res.moved[s]++
			}
		}
	}
	end := int64(len(percents)) * loadStageMs
	var done atomic.Bool
	var mu sync.Mutex
	var wg sync.WaitGroup
	for pi, pr := range procs {
		for g := range loadGoroutines {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(pi), uint64(g)))
				var calls []loadCall
				for !done.Load() {
					k, c := rng.IntN(loadKeys), cost(rng)
					slot := new(atomic.Int64)
					ctx := context.WithValue(context.Background(), loadStampKey{}, slot)
					s0 := clk.ms()
					d, err := pr.th.AllowN(ctx, loadKey(k), p, c)
					s1 := clk.ms()
					calls = append(calls, loadCall{key: k, t: slot.Load(), cost: c, allowed: err == nil && d.Allowed,
						resetAt: d.ResetAt.Sub(migrationT0).Milliseconds(), flight: s1 - s0, stage: int(s0 / loadStageMs), proc: pi, err: err != nil,
						errKind: loadErrKind(err)})
				}
				mu.Lock()
				res.calls = append(res.calls, calls...)
				mu.Unlock()
			})
		}
	}
	// Each process's rollout changes at its own lag after a stage starts,
	// or later when this goroutine waits for a CPU: when is recorded.
	for s := 1; s < len(percents); s++ {
		var first, last int64
		for i, lag := range loadProcessLag {
			for clk.ms() < int64(s)*loadStageMs+lag {
				time.Sleep(100 * time.Microsecond)
			}
			if err := procs[i].rollout.Set(percents[s]); err != nil {
				t.Error(err)
			}
			last = clk.ms()
			if i == 0 {
				first = last
			}
		}
		res.seeSpread = append(res.seeSpread, last-first)
		if s == 1 && stop > 0 {
			for clk.ms() < loadStageMs+1000 {
				time.Sleep(time.Millisecond)
			}
			res.stopped = loadStop(t, &clk, stop)
		}
	}
	for clk.ms() < end {
		time.Sleep(time.Millisecond)
	}
	done.Store(true)
	wg.Wait()
	for _, pr := range procs {
		res.stats = append(res.stats, pr.m.Stats())
	}
	lateMu.Lock()
	res.lateKeys = lateKeys
	lateMu.Unlock()
	res.errKinds = map[string]int{}
	for _, c := range res.calls {
		if c.err {
			res.errors++
			res.errKinds[c.errKind]++
		}
	}
	return res
}

// loadEarlyFailures counts by kind the calls that failed with a flight
// shorter than timeout, the Throttler's Timeout. The stores are healthy, so
// the one failure a call may have is the Timeout expiring on it, which it
// can only when its own flight (read around it, on the shared clock) is at
// least the Timeout: how many do depends on how long the machine starves
// the run, not on the product. A call that fails sooner (a breaker that
// opened, a store's error) is a failure of the product.
func loadEarlyFailures(calls []loadCall, timeout time.Duration) map[string]int {
	early := map[string]int{}
	for _, c := range calls {
		if c.err && c.flight < timeout.Milliseconds() {
			early[c.errKind]++
		}
	}
	return early
}

// loadErrKind names what failed a call, so that a run with failures says
// which kind: a breaker that skipped the store, the Throttler's Timeout,
// or the store's own error (its message, without the wrapping).
func loadErrKind(err error) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "breaker opened"):
		return "breaker open"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		msg = msg[i+2:]
	}
	return msg
}

func loadKey(k int) string { return fmt.Sprintf("load-%02d", k) }

// loadReport is what a run's checks found.
type loadReport struct {
	calls, admitted, denied, errors int
	windows                         int   // Window-long spans of admissions checked
	overUnits                       int64 // units admitted beyond the bound, all keys
	overKeys                        []string
	fresh                           int   // windows opened less than a Window after the key's previous one
	spread, maxFlight               int64 // ms: the processes' clock spread, the longest flight of an admitted call
	medianFlight                    int64 // ms
	// The migrations' counts of moving keys' calls (Stats.Moving), summed.
	moving                          struct{ Calls, Compensated, RefundFailed, OneStore, Changes, Late uint64 }
	drops                           uint64
	compared, mismatched, reordered uint64 // shadow pairs, both directions
	kinds                           map[string]uint64
}

// loadCheck checks every key's admissions against p's bound: for a fixed
// window by the windows the stores said they counted in (loadFixedBound);
// for a token bucket by their instants, widened by how far out of order two
// calls' instants can reach a store (loadBucketBound).
func loadCheck(p throttler.Policy, res loadResult) loadReport {
	rep := loadReport{calls: len(res.calls), errors: res.errors, kinds: map[string]uint64{}}
	spread := int64(slices.Max(loadProcessOffsets)-slices.Min(loadProcessOffsets)) / int64(time.Millisecond)
	perKey := make([][]loadCall, loadKeys)
	var flights []int64
	for _, c := range res.calls {
		if c.allowed {
			rep.admitted++
			flights = append(flights, c.flight)
			perKey[c.key] = append(perKey[c.key], c)
		} else {
			rep.denied++
		}
	}
	if len(flights) > 0 {
		slices.Sort(flights)
		rep.medianFlight, rep.maxFlight = flights[len(flights)/2], flights[len(flights)-1]
	}
	rep.spread = spread
	w := p.Window.Milliseconds()
	for k, adm := range perKey {
		sort.Slice(adm, func(i, j int) bool { return adm[i].t < adm[j].t })
		switch p.Algorithm {
		case throttler.FixedWindow:
			windows, over, fresh, where := loadFixedBound(p, spread, adm)
			rep.windows += windows
			rep.fresh += fresh
			if over > 0 || fresh > 0 {
				rep.overUnits += over
				rep.overKeys = append(rep.overKeys, fmt.Sprintf("%s: %d over, %d fresh windows: %s", loadKey(k), over, fresh, where))
			}
		case throttler.TokenBucket:
			if len(adm) > 0 {
				rep.windows += int((adm[len(adm)-1].t-adm[0].t)/w) + 1
			}
			if x := loadBucketBound(p, spread, adm); x.over() > 0 {
				rep.overUnits += x.over()
				rep.overKeys = append(rep.overKeys, fmt.Sprintf("%s: %d units in [+%dms, +%dms], at most %d",
					loadKey(k), x.units, x.from, x.to, x.most))
			}
		}
	}
	for _, st := range res.stats {
		rep.moving.Calls += st.Moving.Calls
		rep.moving.Compensated += st.Moving.Compensated
		rep.moving.RefundFailed += st.Moving.RefundFailed
		rep.moving.OneStore += st.Moving.OneStore
		rep.moving.Changes += st.Moving.Changes
		rep.moving.Late += st.Moving.Late
		for _, s := range []shadow.Stats{st.Forward, st.Reverse} {
			rep.drops += s.ByKind[shadow.Dropped]
			rep.compared += s.Compared
			rep.mismatched += s.Mismatched
			rep.reordered += s.ByKind[shadow.Reordered]
			for kind, n := range s.ByKind {
				rep.kinds[kind.String()] += n
			}
		}
	}
	return rep
}

// loadFixedBound checks one key's admissions against the fixed window's
// bound, Limit per window, as one exact store would have counted them.
// Such a store opens a window at an admitted call's instant S, counts in it
// the calls that reach it while it is the last window and have an instant
// before S + Window, and opens the next at an instant S + Window or later.
// A call reaches the store after the one that opened its window, so its
// instant is at most spread + its flight before S: the opener's process
// may be spread ahead, and was stamped at most the call's flight after it.
//
// The windows are taken from the decisions: each admitted one names, by
// its ResetAt, a window a store opened (the old or the new one; a moving
// key's calls are counted in both, so while its stores count in windows
// that start at different instants, both kinds appear). Of windows that
// overlap, one store would have opened only some: every choice of windows
// at least a Window apart is tried (loadSequences), and the key is over the
// bound only if every choice leaves admissions out. For one choice, each
// admission goes to a window that could have counted it, those that can go
// to fewer windows first, each to the earliest with room; one that finds
// no room is over. A window left out holds a fresh window's admissions if
// some of them are over in the best choice. It returns the windows of the
// best choice, its units over, the fresh windows, and where its first
// excess was.
func loadFixedBound(p throttler.Policy, spread int64, adm []loadCall) (windows int, over int64, fresh int, where string) {
	w := p.Window.Milliseconds()
	var starts []int64
	for _, a := range adm {
		starts = append(starts, a.resetAt-w)
	}
	slices.Sort(starts)
	starts = slices.Compact(starts)
	over = -1
	for _, seq := range loadSequences(starts, w) {
		o, f, wh := loadAssign(p, spread, adm, seq)
		if over < 0 || o < over {
			windows, over, fresh, where = len(seq), o, f, wh
		}
		if over == 0 {
			break
		}
	}
	return windows, max(over, 0), fresh, where
}

// loadSequences returns the choices of window starts at least w apart
// among starts (sorted): a run of starts each less than w after the one
// before is a group, and a choice takes from each group one start, or the
// starts a greedy pass keeps from its first or from its last. Beyond 4096
// choices only the greedy one from the first starts is returned.
func loadSequences(starts []int64, w int64) [][]int64 {
	var groups [][]int64
	for i, s := range starts {
		if i == 0 || s-starts[i-1] >= w {
			groups = append(groups, nil)
		}
		groups[len(groups)-1] = append(groups[len(groups)-1], s)
	}
	greedy := func(g []int64) []int64 {
		var out []int64
		for _, s := range g {
			if len(out) == 0 || s >= out[len(out)-1]+w {
				out = append(out, s)
			}
		}
		return out
	}
	options := make([][][]int64, len(groups))
	n := 1
	for i, g := range groups {
		options[i] = [][]int64{greedy(g)}
		if len(g) > 1 {
			rev := slices.Clone(g)
			slices.Reverse(rev)
			fromLast := greedy(rev)
			slices.Reverse(fromLast)
			options[i] = append(options[i], fromLast)
			for _, s := range g {
				options[i] = append(options[i], []int64{s})
			}
		}
		if n *= len(options[i]); n > 4096 {
			return [][]int64{greedy(starts)}
		}
	}
	seqs := [][]int64{nil}
	for _, opts := range options {
		var next [][]int64
		for _, seq := range seqs {
			for _, o := range opts {
				next = append(next, append(slices.Clone(seq), o...))
			}
		}
		seqs = next
	}
	return seqs
}

// loadAssign places adm in the windows starting at seq (see
// loadFixedBound) and returns the units that fit nowhere, the windows left
// out of seq that hold some of them, and where the first was.
func loadAssign(p throttler.Policy, spread int64, adm []loadCall, seq []int64) (over int64, fresh int, where string) {
	w := p.Window.Milliseconds()
	// eligible returns the windows of seq that could have counted a, as
	// indexes [lo, hi).
	eligible := func(a loadCall) (lo, hi int) {
		lo = sort.Search(len(seq), func(i int) bool { return seq[i]+w > a.t })
		hi = sort.Search(len(seq), func(i int) bool { return seq[i]-spread-a.flight > a.t })
		return lo, hi
	}
	order := make([]int, len(adm))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(i, j int) bool {
		li, hi := eligible(adm[order[i]])
		lj, hj := eligible(adm[order[j]])
		if hi != hj {
			return hi < hj
		}
		return li < lj
	})
	used := make([]int64, len(seq))
	freshOver := map[int64]bool{}
	for _, i := range order {
		a := adm[i]
		lo, hi := eligible(a)
		placed := false
		for k := lo; k < hi; k++ {
			if used[k]+a.cost <= p.Limit {
				used[k] += a.cost
				placed = true
				break
			}
		}
		if placed {
			continue
		}
		over += a.cost
		if _, kept := slices.BinarySearch(seq, a.resetAt-w); !kept {
			freshOver[a.resetAt] = true
		}
		if where == "" {
			var trail []string
			for _, b := range adm {
				if b.t >= a.t-2*w && b.t <= a.t+w {
					trail = append(trail, fmt.Sprintf("+%d p%d (flight %d, window +%d)", b.t, b.proc, b.flight, b.resetAt))
				}
			}
			where = fmt.Sprintf("+%dms (p%d, flight %dms) fits in no window; around it: %s", a.t, a.proc, a.flight, strings.Join(trail, ", "))
		}
	}
	return over, len(freshOver), where
}

// loadBucketBound is rampBucketBound with the instants' disorder: over the
// admissions with instants in [a, b], at most C + floor((b − a + spread +
// f)·Limit / w) units, f being the longest flight among them. The bucket
// refills by the latest instant it has seen, and when the last of them
// reached the store, no call it had seen was stamped more than f after
// that one on the shared clock, nor by a process more than spread ahead.
// With no spread and no flights it is rampBucketBound.
func loadBucketBound(p throttler.Policy, spread int64, adm []loadCall) rampExcess {
	w, c := p.Window.Milliseconds(), p.Capacity()
	x := rampExcess{most: c}
	for i := range adm {
		var units, f int64
		for j := i; j < len(adm); j++ {
			units += adm[j].cost
			f = max(f, adm[j].flight)
			x.worst(adm[i].t, adm[j].t, units, c+(adm[j].t-adm[i].t+spread+f)*p.Limit/w)
		}
	}
	return x
}

func (r loadReport) String() string {
	kinds := make([]string, 0, len(r.kinds))
	for k, n := range r.kinds {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(kinds)
	return fmt.Sprintf("%d calls (%d admitted, %d denied, %d failed); %d windows checked, %d units over the bound on %d keys, "+
		"%d fresh windows (disorder allowed: clocks %d ms + a call's flight, median %d ms, at most %d ms); moving keys' calls %d (%d compensated, %d refunds failed, "+
		"%d answered by one store, %d late), changes seen %d; shadows: %d dropped, %d compared, %d mismatched, %d reordered, kinds {%s}",
		r.calls, r.admitted, r.denied, r.errors, r.windows, r.overUnits, len(r.overKeys), r.fresh, r.spread, r.medianFlight, r.maxFlight,
		r.moving.Calls, r.moving.Compensated, r.moving.RefundFailed, r.moving.OneStore, r.moving.Late, r.moving.Changes, r.drops, r.compared, r.mismatched, r.reordered, strings.Join(kinds, ", "))
}

// TestMigrationLoad: the ramp under load hands out no fresh window and
// admits no unit over any key's bound, for a fixed window and a token
// bucket, while mirrored calls drop, and no call fails but by its Timeout,
// also when the token bucket's process is stopped past the Timeout; and the
// same ramp with the moving keys turned off (the rollout hiding its
// percentage) is caught over the bound, which proves the check can fail.
func TestMigrationLoad(t *testing.T) {
	mc := memcachedStart(t)
	rc := redisStart(t)
	one := func(*rand.Rand) int64 { return 1 }
	cases := []struct {
		name string
		p    throttler.Policy
		stop time.Duration // loadStop's, 0 for none
		cost func(*rand.Rand) int64
	}{
		// Limit 5 in windows of 1 s: a stage is 4 windows, each key asked
		// for dozens of units a window. A move lasts 2 windows + Settle.
		{"fixed window", loadFixed.Named("load-fw"), 0, one},
		// 4 tokens a second into a bucket of 8 (empty to full in 2 s, the
		// move's horizon), asked for 1 or 2; the process is stopped longer
		// than the Timeout once, between two changes, so that every call
		// in flight times out at once and no breaker may open for it.
		{"token bucket", throttler.Policy{Name: "load-tb", Limit: 4, Window: time.Second}.WithBurst(8), loadTimeout + 500*time.Millisecond,
			func(r *rand.Rand) int64 { return 1 + r.Int64N(2) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := loadRun(t, mc.addr, rc.Addr, tc.p, loadPercents, false, tc.stop, tc.cost)
			rep := loadCheck(tc.p, res)
			t.Logf("%v, ramp %v (keys moved per stage %v, rollouts set %v ms apart, process stopped %d ms): %v; failed calls by kind %v",
				tc.p, loadPercents, res.moved, res.seeSpread, res.stopped, rep, res.errKinds)
			if res.stopped < tc.stop.Milliseconds() {
				t.Errorf("the process was stopped %d ms, want at least %v", res.stopped, tc.stop)
			}
			loadAssertBound(t, res, rep)
			// The run pressed where it should: mirrored calls dropped, keys
			// moved both ways and were served by both stores, and clients
			// were denied.
			if rep.drops == 0 || rep.moving.Calls == 0 || rep.denied == 0 || res.moved[1] == 0 || res.moved[3] == 0 {
				t.Errorf("the run did not exercise the problem: %v", rep)
			}
			if early := loadEarlyFailures(res.calls, loadTimeout); len(early) > 0 {
				t.Errorf("calls failed in less than the Timeout (%v), by kind: %v; all failed calls: %v", loadTimeout, early, res.errKinds)
			}
		})
	}
	t.Run("fixed window without moving keys", func(t *testing.T) {
		p := loadFixed.Named("load-fw-off")
		res := loadRun(t, mc.addr, rc.Addr, p, loadPercents[:2], true, 0, one)
		rep := loadCheck(p, res)
		t.Logf("%v, ramp %v, moving keys off: %v", p, loadPercents[:2], rep)
		if rep.overUnits == 0 || rep.fresh == 0 || rep.moving.Calls != 0 {
			t.Errorf("without moving keys the ramp was not caught: %v", rep)
		}
	})
}

// loadAssertBound asserts the migration's documented bound: no unit over
// and no fresh window on a key without a late call, as long as every
// process saw each change within Settle − LateAfter of the first, less the
// clocks' spread.
func loadAssertBound(t *testing.T, res loadResult, rep loadReport) {
	t.Helper()
	budget := (loadSettle - loadLateAfter).Milliseconds() - rep.spread
	for s, d := range res.seeSpread {
		if d > budget {
			t.Errorf("change %d: the rollouts were set %d ms apart, beyond Settle − LateAfter − the clocks' spread (%d ms): the bound does not apply", s+1, d, budget)
		}
	}
	var late uint64
	for _, n := range res.lateKeys {
		late += uint64(n)
	}
	if late != rep.moving.Late {
		t.Errorf("OnLate saw %d late calls, Stats().Moving.Late counts %d", late, rep.moving.Late)
	}
	for _, line := range rep.overKeys {
		k, err := strconv.Atoi(strings.TrimPrefix(line[:strings.Index(line, ":")], "load-"))
		if err != nil {
			t.Fatal(err)
		}
		if res.lateKeys[k] == 0 {
			t.Errorf("without a late call: %s", line)
		}
	}
}

// TestLoadBounds: the load test's bounds on hand-computed admissions,
// without servers. The token bucket's is rampBucketBound when nothing is
// out of order, and widens by the disorder; the fixed window's finds a
// window that overlaps the one before and is full, unless a call's flight
// lets it belong to the next window.
func TestLoadBounds(t *testing.T) {
	type adm = []loadCall
	// at makes admissions from (t, cost, flight, resetAt) quadruples.
	at := func(q ...int64) adm {
		var out adm
		for i := 0; i+3 < len(q); i += 4 {
			out = append(out, loadCall{t: q[i], cost: q[i+1], flight: q[i+2], resetAt: q[i+3], allowed: true})
		}
		return out
	}
	failed := []loadCall{{err: true, errKind: "timeout", flight: 2000}, {err: true, errKind: "breaker open", flight: 3},
		{err: true, errKind: "timeout", flight: 1999}, {allowed: true, flight: 40}}
	if got, want := loadEarlyFailures(failed, 2*time.Second), map[string]int{"breaker open": 1, "timeout": 1}; !maps.Equal(got, want) {
		t.Errorf("loadEarlyFailures: %v, want %v", got, want)
	}
	bucket := throttler.Policy{Name: "b", Limit: 4, Window: time.Second}.WithBurst(8)
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		var a adm
		var r []rampAdmission
		for t := int64(0); t < 3000; t += 1 + rng.Int64N(200) {
			c := 1 + rng.Int64N(2)
			a = append(a, loadCall{t: t, cost: c})
			r = append(r, rampAdmission{t: t, cost: c})
		}
		if got, want := loadBucketBound(bucket, 0, a), rampBucketBound(bucket, r); got != want {
			t.Fatalf("without disorder %+v, rampBucketBound %+v", got, want)
		}
	}
	fixed := throttler.Policy{Name: "f", Limit: 5, Window: time.Second}
	for _, tc := range []struct {
		name     string
		p        throttler.Policy
		spread   int64
		adm      adm
		over     int64
		fresh    int
		windows  int
		isBucket bool
	}{
		{"bucket: the burst and a token earned", bucket, 0, at(0, 8, 0, 0, 250, 1, 0, 0), 0, 0, 0, true},
		{"bucket: a token 100 ms early", bucket, 0, at(0, 8, 0, 0, 150, 1, 0, 0), 1, 0, 0, true},
		{"bucket: early by the clocks' spread", bucket, 100, at(0, 8, 0, 0, 150, 1, 0, 0), 0, 0, 0, true},
		// 8 + floor((300 + 100 + 50)·4/1000) = 9 of 16.
		{"bucket: a fresh bucket", bucket, 100, at(0, 8, 0, 0, 300, 8, 50, 0), 7, 0, 0, true},
		{"fixed: one full window", fixed, 100, at(0, 1, 0, 1000, 10, 4, 0, 1000), 0, 0, 1, false},
		{"fixed: the next window", fixed, 100, at(0, 5, 0, 1000, 1000, 5, 0, 2000), 0, 0, 2, false},
		{"fixed: a fresh window", fixed, 100, at(0, 5, 0, 1000, 500, 5, 0, 1500), 5, 1, 1, false},
		// Stamped at 850, it reached the store after the call of 1000
		// opened the next window: possible with a flight of 200 ms
		// (850 ≥ 1000 − 100 − 200), not with one of 10.
		{"fixed: a late call counted in the next window", fixed, 100,
			at(0, 5, 0, 1000, 850, 1, 200, 2000, 1000, 4, 0, 2000), 0, 0, 2, false},
		{"fixed: the same call on time", fixed, 100,
			at(0, 5, 0, 1000, 850, 1, 10, 2000, 1000, 4, 0, 2000), 1, 0, 2, false},
		{"fixed: two stores' windows 40 ms apart, one window's worth", fixed, 100,
			at(0, 3, 0, 1000, 40, 2, 0, 1040), 0, 0, 1, false},
		{"fixed: two stores' windows 40 ms apart, more", fixed, 100,
			at(0, 3, 0, 1000, 40, 3, 0, 1040), 3, 1, 1, false},
	} {
		var over int64
		var fresh, windows int
		if tc.isBucket {
			over = max(loadBucketBound(tc.p, tc.spread, tc.adm).over(), 0)
		} else {
			windows, over, fresh, _ = loadFixedBound(tc.p, tc.spread, tc.adm)
		}
		if over != tc.over || fresh != tc.fresh || windows != tc.windows {
			t.Errorf("%s: over %d, fresh %d, windows %d; want %d, %d, %d", tc.name, over, fresh, windows, tc.over, tc.fresh, tc.windows)
		}
	}
}
