package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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

// A live Memcached → Redis ramp whose client processes stall mid-call:
// four real processes (this test binary, re-executed), each its own
// Migration, Throttler, clients and clock (offsets ±50 ms), 16 closed-loop
// goroutines each on 48 shared keys, follow a rollout file through
// 0 → 50 → 100 → 0 % while the test stops one of them with SIGSTOP for up
// to 2 s, over and over, always one across each change of the file, and
// the machine's CPU is as busy as the caller makes it (`yes > /dev/null`
// beside it in docs/migration.md's figures). Every admission is checked as
// TestMigrationLoad checks it; the bound asserted is the documented one: no
// unit over and no fresh window on any key without a late call
// (migration.Options.LateAfter), as long as every process saw each change
// within Settle − LateAfter of the first, less the clocks' spread, which
// the processes measure.

const (
	stallStage      = 4 * time.Second // per percentage
	stallSettle     = 3 * time.Second // covers a stop of 2 s (a process sees a change that much later), the file's poll and the clocks
	stallLateAfter  = 700 * time.Millisecond
	stallGoroutines = 16
	stallMaxStop    = 2 * time.Second
	stallPoll       = 10 * time.Millisecond // the rollout file's Interval
)

// stallPercents is the ramp: one stage per percentage, the mirror on.
var stallPercents = []int{0, 50, 100, 0}

// stallChildEnv names the variables a client process reads.
const (
	stallEnvChild   = "THROTTLEKIT_STALL_CHILD" // the process's index
	stallEnvMC      = "THROTTLEKIT_STALL_MC"
	stallEnvRedis   = "THROTTLEKIT_STALL_REDIS"
	stallEnvRollout = "THROTTLEKIT_STALL_ROLLOUT"
	stallEnvStart   = "THROTTLEKIT_STALL_START" // the shared clock's origin, Unix ms
	stallEnvPolicy  = "THROTTLEKIT_STALL_POLICY"
)

// stallChildReport is what a client process writes on its stdout.
type stallChildReport struct {
	Calls []stallCall
	// Seen is, per percentage the process's rollout read, the shared
	// clock's ms when a goroutine polling it every millisecond first saw it.
	Seen     []stallSeen
	Late     []stallLate
	Moving   migration.Stats
	MaxStall int64 // the longest gap, ms, between two polls of the watcher: how long the process was stopped or starved
	Errors   map[string]int
}

type stallCall struct{ K, T, C, R, F, S, E, U int64 } // key, instant, cost, ResetAt (0: denied), flight, stage, 1 if it failed, Used

type stallSeen struct{ Pct, Ms int64 }

type stallLate struct {
	Key  string
	Late time.Duration
}

// stallPolicies are the limits of the soak.
var stallPolicies = map[string]throttler.Policy{
	"fixed window": loadFixed.Named("stall-fw"),
	"token bucket": throttler.Policy{Name: "stall-tb", Limit: 4, Window: time.Second}.WithBurst(8),
}

// TestMigrationStall: see above. Bounded: two ramps of 16 s each, plus the
// processes' start.
func TestMigrationStall(t *testing.T) {
	if os.Getenv(stallEnvChild) != "" {
		stallChild(t)
		return
	}
	if os.Getenv("THROTTLEKIT_STALL") == "" {
		t.Skip("a soak of ~60 s that stops processes: set THROTTLEKIT_STALL=1 (docs/migration.md, \"Late calls\")")
	}
	mc := memcachedStart(t)
	rc := redisStart(t)
	for _, name := range []string{"fixed window", "token bucket"} {
		t.Run(name, func(t *testing.T) { stallRun(t, name, mc.addr, rc.Addr) })
	}
}

func stallRun(t *testing.T, name, mcAddr, redisAddr string) {
	p := stallPolicies[name]
	rollout := filepath.Join(t.TempDir(), "rollout.json")
	writeRollout := func(pct int) {
		tmp := rollout + ".tmp"
		if err := os.WriteFile(tmp, fmt.Appendf(nil, `{"percent": %d, "mirror": true}`, pct), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, rollout); err != nil {
			t.Fatal(err)
		}
	}
	writeRollout(stallPercents[0])
	// The processes start counting at the shared clock's 0, 3 s from now:
	// time to start and dial.
	start := time.Now().Add(3 * time.Second).UnixMilli()
	ms := func() int64 { return time.Now().UnixMilli() - start }
	procs := make([]*exec.Cmd, len(loadProcessOffsets))
	outs := make([]*bytes.Buffer, len(procs))
	for i := range procs {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestMigrationStall$", "-test.count=1")
		cmd.Env = append(os.Environ(),
			stallEnvChild+"="+strconv.Itoa(i), stallEnvMC+"="+mcAddr, stallEnvRedis+"="+redisAddr,
			stallEnvRollout+"="+rollout, stallEnvStart+"="+strconv.FormatInt(start, 10), stallEnvPolicy+"="+name)
		outs[i] = new(bytes.Buffer)
		cmd.Stdout, cmd.Stderr = outs[i], os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs[i] = cmd
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGCONT)
			_ = cmd.Process.Kill()
		})
	}
	// The stops: one process across each change (from 300 ms before it,
	// for 2 s), and in between random ones of 0.2 to 2 s, one at a time.
	end := int64(len(stallPercents)) * stallStage.Milliseconds()
	rng := rand.New(rand.NewPCG(7, uint64(len(name))))
	var stops atomic.Int64
	var stopWG sync.WaitGroup
	stopWG.Go(func() {
		for ms() < 0 {
			time.Sleep(time.Millisecond)
		}
		stop := func(i int, d time.Duration) {
			if procs[i].Process.Signal(syscall.SIGSTOP) == nil {
				stops.Add(1)
			}
			time.Sleep(d)
			_ = procs[i].Process.Signal(syscall.SIGCONT)
		}
		for s := 1; ms() < end-int64(stallMaxStop/time.Millisecond); {
			next := int64(s)*stallStage.Milliseconds() - 300
			switch {
			case s < len(stallPercents) && ms() >= next:
				stop((s-1)%len(procs), stallMaxStop)
				s++
			case s < len(stallPercents) && next-ms() < stallMaxStop.Milliseconds()+200:
				time.Sleep(10 * time.Millisecond)
			default:
				stop(rng.IntN(len(procs)), 200*time.Millisecond+time.Duration(rng.Int64N(int64(stallMaxStop-200*time.Millisecond))))
				time.Sleep(time.Duration(rng.Int64N(int64(300 * time.Millisecond))))
			}
		}
	})
	for s := 1; s < len(stallPercents); s++ {
		for ms() < int64(s)*stallStage.Milliseconds() {
			time.Sleep(time.Millisecond)
		}
		writeRollout(stallPercents[s])
	}
	stopWG.Wait()
	var reports []stallChildReport
	for i, cmd := range procs {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("process %d: %v", i, err)
		}
		var r stallChildReport
		if err := json.Unmarshal(lastLine(outs[i].Bytes()), &r); err != nil {
			t.Fatalf("process %d's report: %v", i, err)
		}
		reports = append(reports, r)
		if len(r.Errors) > 0 {
			t.Logf("process %d's errors: %v", i, r.Errors)
		}
	}
	if dump := os.Getenv("THROTTLEKIT_STALL_DUMP"); dump != "" {
		b, _ := json.Marshal(reports)
		_ = os.WriteFile(dump+"."+p.Name, b, 0o600)
	}
	stallCheck(t, p, reports, stops.Load())
}

// lastLine is b's last non-empty line: the report (go test prints PASS
// after it).
func lastLine(b []byte) []byte {
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		if bytes.HasPrefix(lines[i], []byte("{")) {
			return lines[i]
		}
	}
	return nil
}

// stallCheck asserts the bound on the processes' reports.
func stallCheck(t *testing.T, p throttler.Policy, reports []stallChildReport, stops int64) {
	t.Helper()
	var res loadResult
	lateKeys := map[int]int{}
	var late, lateCounted uint64
	var maxStall int64
	for pi, r := range reports {
		for _, c := range r.Calls {
			res.calls = append(res.calls, loadCall{key: int(c.K), t: c.T, cost: c.C, allowed: c.R != 0, resetAt: c.R, flight: c.F, stage: int(c.S), proc: pi, err: c.E != 0, used: c.U})
			res.errors += int(c.E)
		}
		res.stats = append(res.stats, r.Moving)
		for _, l := range r.Late {
			k, err := strconv.Atoi(l.Key[len("load-"):])
			if err != nil {
				t.Fatal(err)
			}
			lateKeys[k]++
		}
		late += uint64(len(r.Late))
		lateCounted += r.Moving.Moving.Late
		maxStall = max(maxStall, r.MaxStall)
	}
	rep := loadCheck(p, res)
	// When each process saw each change, and how far apart.
	spread := int64(slices.Max(loadProcessOffsets)-slices.Min(loadProcessOffsets)) / int64(time.Millisecond)
	budget := (stallSettle - stallLateAfter).Milliseconds() - spread
	var seeSpread []int64
	for s := 1; s < len(stallPercents); s++ {
		var first, last int64 = -1, -1
		for _, r := range reports {
			for _, x := range r.Seen {
				if x.Pct == int64(stallPercents[s]) && x.Ms >= int64(s)*stallStage.Milliseconds()-50 {
					if first < 0 || x.Ms < first {
						first = x.Ms
					}
					if x.Ms > last {
						last = x.Ms
					}
					break
				}
			}
		}
		seeSpread = append(seeSpread, last-first)
	}
	t.Logf("%v, ramp %v, %d stops of up to %v (the longest stall a process measured %d ms): %v; late calls %d on %d keys; changes seen %v ms apart (budget %d ms)",
		p, stallPercents, stops, stallMaxStop, maxStall, rep, late, len(lateKeys), seeSpread, budget)
	if late != lateCounted {
		t.Errorf("OnLate saw %d late calls, Stats().Moving.Late counts %d", late, lateCounted)
	}
	for s, d := range seeSpread {
		if d > budget {
			t.Errorf("change %d: the processes saw it %d ms apart, beyond Settle − LateAfter − the clocks' spread (%d ms): the bound does not apply", s+1, d, budget)
		}
	}
	// The bound: over and fresh windows only on keys with a late call.
	perKey := make([][]loadCall, loadKeys)
	for _, c := range res.calls {
		if c.allowed {
			perKey[c.key] = append(perKey[c.key], c)
		}
	}
	for k, adm := range perKey {
		sort.Slice(adm, func(i, j int) bool { return adm[i].t < adm[j].t })
		var over int64
		var fresh int
		var where string
		switch p.Algorithm {
		case throttler.FixedWindow:
			_, over, fresh, where = loadFixedBound(p, spread, adm)
		case throttler.TokenBucket:
			x := loadBucketBound(p, spread, adm)
			over, where = max(x.over(), 0), fmt.Sprintf("%d units in [+%dms, +%dms], at most %d", x.units, x.from, x.to, x.most)
		}
		if (over > 0 || fresh > 0) && lateKeys[k] == 0 {
			t.Errorf("%s, without a late call: %d units over, %d fresh windows: %s; %s", loadKey(k), over, fresh, where, restarted(adm))
		}
	}
	// The run pressed where it should: processes were stopped mid-call
	// (flights beyond the longest stop's half), mirrored calls dropped, keys
	// moved and were served by both stores, clients were denied.
	if stops < int64(len(stallPercents)-1) || rep.maxFlight < stallMaxStop.Milliseconds()/2 || rep.drops == 0 || rep.moving.Calls == 0 || rep.denied == 0 {
		t.Errorf("the run did not exercise the problem: %d stops, %v", stops, rep)
	}
	if rep.errors*20 > rep.calls { // calls that outlive the Throttler's Timeout under this load fail closed
		t.Errorf("%d of %d calls failed", rep.errors, rep.calls)
	}
}

// restarted names the windows in which two admissions of a key were
// answered with the same Used (adm sorted by instant): a store whose count
// of the window started again, not a placement of the moving keys. A
// compensating Refund can do the same on a moving key.
func restarted(adm []loadCall) string {
	seen := map[[2]int64]int64{}
	var out []string
	for _, a := range adm {
		id := [2]int64{a.resetAt, a.used}
		if t, dup := seen[id]; dup {
			out = append(out, fmt.Sprintf("window +%d counted Used %d at +%d and again at +%d (flight %d ms)", a.resetAt, a.used, t, a.t, a.flight))
		}
		seen[id] = a.t
	}
	if len(out) == 0 {
		return "no window's count restarted"
	}
	return "a window's count restarted: " + strings.Join(out, ", ")
}

// stallChild is one client process: it runs the ramp's calls until the
// shared clock reaches the end, and writes its report.
func stallChild(t *testing.T) {
	i, err := strconv.Atoi(os.Getenv(stallEnvChild))
	if err != nil || i < 0 || i >= len(loadProcessOffsets) {
		t.Fatalf("%s=%q", stallEnvChild, os.Getenv(stallEnvChild))
	}
	start, err := strconv.ParseInt(os.Getenv(stallEnvStart), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := stallPolicies[os.Getenv(stallEnvPolicy)]
	if !ok {
		t.Fatalf("%s=%q", stallEnvPolicy, os.Getenv(stallEnvPolicy))
	}
	off := loadProcessOffsets[i]
	ms := func() int64 { return time.Now().UnixMilli() - start }
	old, err := memcached.New(memcachedClient(t, 5*time.Second, os.Getenv(stallEnvMC)), nil)
	if err != nil {
		t.Fatal(err)
	}
	rcl := goredis.NewClient(&goredis.Options{
		Addr: os.Getenv(stallEnvRedis), ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 32,
		DialTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second,
	})
	t.Cleanup(func() { _ = rcl.Close() })
	nu, err := redis.New(rcl, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := flags.NewFile(os.Getenv(stallEnvRollout), &flags.FileOptions{Interval: stallPoll})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	small := &shadow.Options{Workers: 1, QueueSize: 2, Timeout: 50 * time.Millisecond, DrainTimeout: 100 * time.Millisecond,
		ReorderSpan: 150 * time.Millisecond, ReorderUnits: p.Capacity()}
	var rep stallChildReport
	var mu sync.Mutex
	m := migrationNew(t, old, nu, r, &migration.Options{Forward: small, Reverse: small, Settle: stallSettle, LateAfter: stallLateAfter,
		OnLate: func(key string, _ throttler.Policy, late time.Duration) {
			mu.Lock()
			rep.Late = append(rep.Late, stallLate{key, late})
			mu.Unlock()
		}})
	th, err := throttler.New(loadStamped{m}, &throttler.Options{
		Clock:      func() time.Time { return migrationT0.Add(time.Duration(ms())*time.Millisecond + off) },
		Timeout:    5 * time.Second, // beyond a stop: a stalled call is late, not failed
		FailClosed: true,
		// A stop makes every call in flight time out at once: not an
		// outage to switch a store off for.
		BreakerThreshold: 1000,
	})
	if err != nil {
		t.Fatal(err)
	}
	for ms() < 0 {
		time.Sleep(time.Millisecond)
	}
	stage := stallStage.Milliseconds()
	end := int64(len(stallPercents)) * stage
	var wg sync.WaitGroup
	wg.Go(func() { // the watcher
		pct, last := -1, ms()
		for now := ms(); now < end; now = ms() {
			rep.MaxStall = max(rep.MaxStall, now-last)
			last = now
			if x := r.Percent(); x != pct {
				pct = x
				rep.Seen = append(rep.Seen, stallSeen{int64(x), now})
			}
			time.Sleep(time.Millisecond)
		}
	})
	for g := range stallGoroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), uint64(g)))
			var calls []stallCall
			for {
				s0 := ms()
				if s0 >= end {
					break
				}
				k := rng.IntN(loadKeys)
				c := int64(1)
				if p.Algorithm == throttler.TokenBucket {
					c = 1 + rng.Int64N(2)
				}
				slot := new(atomic.Int64)
				ctx := context.WithValue(context.Background(), loadStampKey{}, slot)
				d, err := th.AllowN(ctx, loadKey(k), p, c)
				call := stallCall{K: int64(k), T: slot.Load(), C: c, F: ms() - s0, S: s0 / stage}
				switch {
				case err != nil:
					call.E = 1
					mu.Lock()
					if rep.Errors == nil {
						rep.Errors = map[string]int{}
					}
					if len(rep.Errors) < 5 {
						rep.Errors[err.Error()]++
					}
					mu.Unlock()
				case d.Allowed:
					call.R, call.U = d.ResetAt.Sub(migrationT0).Milliseconds(), d.Used
				}
				calls = append(calls, call)
			}
			mu.Lock()
			rep.Calls = append(rep.Calls, calls...)
			mu.Unlock()
		})
	}
	wg.Wait()
	rep.Moving = m.Stats()
	rep.Moving.Forward.LastMismatches, rep.Moving.Reverse.LastMismatches = nil, nil
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("\n%s\n", b)
}
