package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/migration"
	"github.com/throttlekit/throttlekit/shadow"
	"github.com/throttlekit/throttlekit/throttler"
)

// A ramp of leases: real Memcached is the old store and real
// Redis the new one; four processes (each its own Migration and Throttler
// over its own clients and its own rollout, seeing each change a few ms
// after the one before, loadProcessLag) run 32 goroutines each, acquiring
// leases on a few keys, holding each for 20 to 100 ms and releasing it, while
// the rollout goes 0% → 50% → 100% → 0%. The clock is the real one: a
// lease's TTL and a moving key's horizon (TTL + Settle) run in real time.

const (
	leaseRampGoroutines = 32 // per process
	leaseRampKeys       = 4
	// leaseRampStage is a stage's length: a moving key's horizon (TTL +
	// Settle) and then its new route alone.
	leaseRampStage  = 6 * time.Second
	leaseRampSettle = 500 * time.Millisecond
)

// leaseRampPercents is the ramp: one stage per percentage, the mirror on.
var leaseRampPercents = []int{0, 50, 100, 0}

// leaseRampPolicy: 8 leases per key for 32 x 4 goroutines on 4 keys; the
// TTL is far beyond a hold and a call, so that a lease expires before its
// Release only if the machine stalls for seconds (counted apart: with
// other work on the 2 cores, a TTL of 2 s saw 1 in 70).
var leaseRampPolicy = throttler.ConcurrencyPolicy{Name: "ramp", Limit: 8, TTL: 5 * time.Second}

// leaseRampResult is what a run saw.
type leaseRampResult struct {
	admitted, denied, acquireErrors  atomic.Int64
	over                             atomic.Int64 // admitted Acquires that made more than Limit run
	released, lost, expired, relErrs atomic.Int64
	peak                             [leaseRampKeys]atomic.Int64
	stats                            []migration.Stats

	mu       sync.Mutex
	failures []string // the first few violations, for the report
}

func (r *leaseRampResult) fail(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.failures) < 10 {
		r.failures = append(r.failures, fmt.Sprintf(format, args...))
	}
}

// leaseRampKeysFor returns keys of this run, half of them routed to the
// new store at 50% and half not, so that each change of the ramp moves
// some of them and leaves others.
func leaseRampKeysFor(run string) []string {
	var low, high []string
	for i := 0; len(low) < leaseRampKeys/2 || len(high) < leaseRampKeys/2; i++ {
		k := fmt.Sprintf("ramp-%s-%d", run, i)
		if flags.Bucket(flags.DefaultGroupID, k) <= 50 {
			if len(low) < leaseRampKeys/2 {
				low = append(low, k)
			}
		} else if len(high) < leaseRampKeys/2 {
			high = append(high, k)
		}
	}
	return append(low, high...)
}

// leaseRampProcess is one application process of a ramp.
type leaseRampProcess struct {
	rollout *flags.Percent
	m       *migration.Migration
	th      *throttler.Throttler
}

// leaseRampProcesses builds the ramp's processes over the servers at mcAddr
// and redisAddr, their rollouts at percent. With bare set, the rollouts
// neither mirror nor show their percentage (no moving keys): a key that
// moves finds none of its leases on its new store.
func leaseRampProcesses(t *testing.T, mcAddr, redisAddr string, percent int, bare bool, so *shadow.Options) []leaseRampProcess {
	t.Helper()
	procs := make([]leaseRampProcess, len(loadProcessLag))
	for i := range procs {
		old := memcachedNew(t, memcachedClient(t, 2*time.Second, mcAddr), nil)
		nu := redisNew(t, redisClient(t, redisAddr), nil)
		r, err := flags.NewPercent(percent)
		if err != nil {
			t.Fatal(err)
		}
		r.SetMirror(!bare)
		var rollout flags.Rollout = r
		if bare {
			rollout = loadHidden{r}
		}
		m := migrationNew(t, old, nu, rollout, &migration.Options{Forward: so, Reverse: so, Settle: leaseRampSettle})
		th, err := throttler.New(m, &throttler.Options{
			// Other work shares the 2 cores: a call may wait seconds for
			// one, which is neither a store's failure nor what this test
			// is about.
			Timeout:          10 * time.Second,
			BreakerThreshold: 1 << 30,
			FailClosed:       true, // a failed Acquire grants nothing
		})
		if err != nil {
			t.Fatal(err)
		}
		if !th.SupportsLeases() {
			t.Fatal("the Throttler over the Migration holds no leases")
		}
		procs[i] = leaseRampProcess{rollout: r, m: m, th: th}
	}
	return procs
}

// leaseRampRun runs the ramp, stage long per percentage, on new stacks
// over the servers at mcAddr and redisAddr, checking at every admitted
// Acquire that the leases the test holds on its key are at most Limit,
// and at every Release that the store that granted the lease still held
// it.
func leaseRampRun(t *testing.T, mcAddr, redisAddr string, keys []string, p throttler.ConcurrencyPolicy, percents []int, stage time.Duration, so *shadow.Options) *leaseRampResult {
	t.Helper()
	procs := leaseRampProcesses(t, mcAddr, redisAddr, percents[0], false, so)

	res := new(leaseRampResult)
	var held [leaseRampKeys]atomic.Int64 // the leases the test holds, per key
	ctx := context.Background()
	start := time.Now()
	end := start.Add(time.Duration(len(percents)) * stage)
	var wg sync.WaitGroup
	for pi, pr := range procs {
		for g := range leaseRampGoroutines {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(pi), uint64(g)))
				for time.Now().Before(end) {
					k := rng.IntN(len(keys))
					before := time.Now()
					l, d, err := pr.th.Acquire(ctx, keys[k], p)
					switch {
					case err != nil || d.Degraded:
						res.acquireErrors.Add(1)
						continue
					case !d.Allowed:
						res.denied.Add(1)
						time.Sleep(time.Duration(5+rng.IntN(10)) * time.Millisecond) // a client backing off
						continue
					}
					res.admitted.Add(1)
					n := held[k].Add(1)
					for m := res.peak[k].Load(); n > m && !res.peak[k].CompareAndSwap(m, n); m = res.peak[k].Load() {
					}
					if n > p.Limit || d.Used > p.Limit {
						res.over.Add(1)
						res.fail("%s: %d leases held by the test, the store says %d: more than Limit %d (at +%v)",
							keys[k], n, d.Used, p.Limit, time.Since(start).Round(time.Millisecond))
					}
					// The request's work: long enough that leases are held
					// across each change.
					time.Sleep(time.Duration(20+rng.IntN(80)) * time.Millisecond)
					held[k].Add(-1)
					ok, _, err := l.Release(ctx)
					// The lease expires TTL after the instant its Acquire
					// read, which is after before: a Release that returned
					// before then reached its store while it held it.
					live := time.Now().Before(before.Truncate(time.Millisecond).Add(p.TTL))
					switch {
					case err != nil:
						res.relErrs.Add(1)
						res.fail("%s: Release: %v (at +%v)", keys[k], err, time.Since(start).Round(time.Millisecond))
					case ok:
						res.released.Add(1)
					case live:
						res.lost.Add(1)
						res.fail("%s: a lease lost: its Release found no store holding it (at +%v)",
							keys[k], time.Since(start).Round(time.Millisecond))
					default:
						res.expired.Add(1)
					}
				}
			})
		}
	}
	// Each process's rollout changes at its own lag after a stage starts.
	for s := 1; s < len(percents); s++ {
		for i, lag := range loadProcessLag {
			time.Sleep(time.Until(start.Add(time.Duration(s)*stage + time.Duration(lag)*time.Millisecond)))
			if err := procs[i].rollout.Set(percents[s]); err != nil {
				t.Error(err)
			}
		}
	}
	wg.Wait()
	for _, pr := range procs {
		if err := pr.m.Flush(ctx); err != nil {
			t.Errorf("Flush: %v", err)
		}
		res.stats = append(res.stats, pr.m.Stats())
	}
	return res
}

// String summarises a run: its counts, each key's peak, the moving keys,
// the routers' lease counts and the shadows' comparisons.
func (r *leaseRampResult) String() string {
	var moving, routed = migration.Stats{}.Moving, flags.Stats{}.Leases
	var drops uint64
	kinds := map[string]uint64{}
	for _, st := range r.stats {
		moving.Calls += st.Moving.Calls
		moving.Compensated += st.Moving.Compensated
		moving.RefundFailed += st.Moving.RefundFailed
		moving.OneStore += st.Moving.OneStore
		l := st.Routed.Leases
		routed.OldAcquires += l.OldAcquires
		routed.NewAcquires += l.NewAcquires
		routed.OldReleases += l.OldReleases
		routed.NewReleases += l.NewReleases
		routed.Unknown += l.Unknown
		routed.Untracked += l.Untracked
		routed.Held += l.Held
		for _, s := range []shadow.Stats{st.Forward, st.Reverse} {
			drops += s.ByKind[shadow.Dropped]
			for kind, n := range s.ByKind {
				kinds[kind.String()] += n
			}
		}
	}
	var peaks []int64
	for k := range r.peak {
		peaks = append(peaks, r.peak[k].Load())
	}
	return fmt.Sprintf("%d admitted (%d over Limit), %d denied, %d failed; %d released, %d lost, %d expired before their Release, %d Release errors; "+
		"peaks per key %v; moving keys' calls %d (%d compensated, %d refunds failed, %d one store); routers: %+v; shadows: %d dropped, kinds %v",
		r.admitted.Load(), r.over.Load(), r.denied.Load(), r.acquireErrors.Load(), r.released.Load(), r.lost.Load(), r.expired.Load(), r.relErrs.Load(),
		peaks, moving.Calls, moving.Compensated, moving.RefundFailed, moving.OneStore, routed, drops, kinds)
}

// routed sums the routers' lease counts and the moving keys' calls.
func (r *leaseRampResult) routed() (flags.Stats, uint64) {
	var routed flags.Stats
	var moving uint64
	for _, st := range r.stats {
		l := st.Routed.Leases
		routed.Leases.OldAcquires += l.OldAcquires
		routed.Leases.NewAcquires += l.NewAcquires
		routed.Leases.Held += l.Held
		moving += st.Moving.Calls
	}
	return routed, moving
}

// TestLeaseRamp: the ramp loses no lease (every Release reaches a store
// that holds its lease), never lets more than Limit leases of a key run,
// and leaves both stores holding none. A bare router (neither moving keys
// nor mirroring) given Limit leases held across the change lets more than
// Limit run, and the Migration given the same does not: the check can
// fail, and fails only without the Migration.
func TestLeaseRamp(t *testing.T) {
	mc := memcachedStart(t)
	rc := redisStart(t)
	p := leaseRampPolicy
	run := fmt.Sprint(time.Now().UnixNano())

	t.Run("ramp", func(t *testing.T) {
		keys := leaseRampKeysFor(run)
		// Mirrored calls get the time a loaded machine needs: a mirrored
		// Release that times out leaves its copy held on the other store
		// until its TTL (stricter, never looser), which the check at the
		// end allows only for such failures.
		res := leaseRampRun(t, mc.addr, rc.Addr, keys, p, leaseRampPercents, leaseRampStage, &shadow.Options{Timeout: 5 * time.Second})
		t.Logf("%v, ramp %v, stages of %v, keys %v: %v", p, leaseRampPercents, leaseRampStage, keys, res)
		for _, f := range res.failures {
			t.Error(f)
		}
		if res.over.Load() != 0 || res.lost.Load() != 0 || res.relErrs.Load() != 0 {
			t.Errorf("%d Acquires over Limit, %d leases lost, %d Releases failed", res.over.Load(), res.lost.Load(), res.relErrs.Load())
		}
		// The run pressed where it should: keys were denied and came near
		// the limit, moving keys went to both stores, and the routers sent
		// leases to each store.
		routed, moving := res.routed()
		if res.denied.Load() == 0 || moving == 0 || routed.Leases.OldAcquires == 0 || routed.Leases.NewAcquires == 0 {
			t.Errorf("the ramp did not exercise the problem")
		}
		for k, key := range keys {
			if res.peak[k].Load() <= p.Limit/2 {
				t.Errorf("%s: at most %d leases held at once: the check at every acquire had no teeth", key, res.peak[k].Load())
			}
		}
		if f := res.acquireErrors.Load(); f*100 > res.admitted.Load()+res.denied.Load() {
			t.Errorf("%d Acquires failed", f)
		}
		if routed.Leases.Held != 0 {
			t.Errorf("the routers still remember %d leases", routed.Leases.Held)
		}

		// Both stores hold no lease of any key (a Release of a lease no one
		// holds reports what is held), but for the copies whose mirrored
		// Release failed on that store.
		ctx := context.Background()
		now := time.Now()
		old := memcachedNew(t, memcachedClient(t, 2*time.Second, mc.addr), nil)
		nu := redisNew(t, redisClient(t, rc.Addr), nil)
		for _, st := range []struct {
			name string
			b    throttler.LeaseBackend
			// the shadow that mirrors to it
			mirrored func(migration.Stats) shadow.Stats
		}{
			{"Memcached", old, func(s migration.Stats) shadow.Stats { return s.Reverse }},
			{"Redis", nu, func(s migration.Stats) shadow.Stats { return s.Forward }},
		} {
			var failed uint64
			for _, s := range res.stats {
				failed += st.mirrored(s).ByKind[shadow.CandidateError] + st.mirrored(s).ByKind[shadow.Dropped]
			}
			var left int64
			for _, key := range keys {
				held, d, err := st.b.Release(ctx, key, p, throttler.LeaseID(rand.Uint64()|1), now)
				if err != nil || held {
					t.Errorf("%s: %v, %v", st.name, held, err)
				}
				left += d.Used
			}
			if left != 0 {
				t.Logf("%s holds %d leases at the end, %d mirrored calls to it failed or dropped", st.name, left, failed)
			}
			if uint64(left) > failed {
				t.Errorf("%s holds %d leases at the end, and only %d mirrored calls to it failed", st.name, left, failed)
			}
		}
	})

	// The negative control, in the interleaving the check must catch:
	// leases held across the change. A random ramp meets it only when a
	// lease of a moving key is held while the change reaches a process,
	// which a starved machine may never schedule; so it is arranged.
	t.Run("bare router", func(t *testing.T) {
		keys := leaseRampKeysFor(run + "-bare")
		bare := leaseRampHeldAcrossChange(t, mc.addr, rc.Addr, keys[0], p, true)
		t.Logf("%v, neither moving keys nor mirroring: %d of %d Acquires after the change admitted beside %d held",
			p, bare, len(loadProcessLag), p.Limit)
		if bare == 0 {
			t.Errorf("the bare router's ramp was not caught over Limit")
		}
		migrated := leaseRampHeldAcrossChange(t, mc.addr, rc.Addr, keys[1], p, false)
		if migrated != 0 {
			t.Errorf("the Migration admitted %d Acquires beside %d leases held across the change", migrated, p.Limit)
		}
	})
}

// leaseRampHeldAcrossChange holds p.Limit leases of key, a key routed to
// the new store at 50%, acquired through the ramp's processes in turn at
// 0%; turns every process's rollout to 50%; then acquires key once more
// through each process. It returns how many of those were admitted: each
// one a lease beyond Limit running. Every lease is released at the end.
func leaseRampHeldAcrossChange(t *testing.T, mcAddr, redisAddr, key string, p throttler.ConcurrencyPolicy, bare bool) int {
	t.Helper()
	if flags.Bucket(flags.DefaultGroupID, key) > 50 {
		t.Fatalf("%s does not move at 50%%", key)
	}
	ctx := context.Background()
	procs := leaseRampProcesses(t, mcAddr, redisAddr, 0, bare, nil)
	var leases []throttler.Lease
	defer func() {
		for _, l := range leases {
			if ok, _, err := l.Release(ctx); err != nil || !ok {
				t.Errorf("%s: Release: %v, %v; want held", key, ok, err)
			}
		}
	}()
	acquire := func(pr leaseRampProcess) bool {
		l, d, err := pr.th.Acquire(ctx, key, p)
		if err != nil || d.Degraded {
			t.Fatalf("%s: Acquire: %+v, %v", key, d, err)
		}
		if d.Allowed {
			leases = append(leases, l)
		}
		return d.Allowed
	}
	for i := range p.Limit {
		if !acquire(procs[int(i)%len(procs)]) {
			t.Fatalf("%s: lease %d of %d denied before the change", key, i+1, p.Limit)
		}
	}
	for _, pr := range procs {
		if err := pr.rollout.Set(50); err != nil {
			t.Fatal(err)
		}
	}
	admitted := 0
	for _, pr := range procs {
		if acquire(pr) {
			admitted++
		}
	}
	return admitted
}
