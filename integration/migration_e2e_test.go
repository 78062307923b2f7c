package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/backend/memcached"
	"github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/migration"
	"github.com/throttlekit/throttlekit/shadow"
	"github.com/throttlekit/throttlekit/throttler"
)

// The migration GitHub ran, end to end: real Memcached is the old store,
// real Redis the new one, a population of clients with fixed limits runs on
// a shared fake clock while the rollout moves.

// migrationT0 is where these tests' windows open, ms-aligned so that both
// stores keep it exactly, and far from today so that no expiry computed from
// the application's clock could pass for a server's.
var migrationT0 = time.Date(2031, 6, 1, 9, 0, 0, 0, time.UTC)

const migrationClients = 1000

// migrationStores starts a Memcached (with memcachedArgs) and a Redis and
// returns a backend on each, with the Memcached server for tests that
// squeeze it and the Redis container for tests that stop it. The clients'
// timeouts are generous: on a shared 2-core machine a container can stall
// for seconds, and these tests are about the shadow, not about that.
func migrationStores(t *testing.T, memcachedArgs ...string) (*memcached.Backend, *redis.Backend, *memcachedServer, *redisContainer) {
	t.Helper()
	mc := memcachedStart(t, memcachedArgs...)
	rc := redisStart(t)
	old, err := memcached.New(memcachedClient(t, 10*time.Second, mc.addr), nil)
	if err != nil {
		t.Fatal(err)
	}
	rcl := goredis.NewClient(&goredis.Options{
		Addr:                  rc.Addr,
		ContextTimeoutEnabled: true, // the shadow's deadline bounds each mirrored call
		DialTimeout:           10 * time.Second,
		ReadTimeout:           10 * time.Second,
		WriteTimeout:          10 * time.Second,
		MaxRetries:            -1, // a retried script could count twice
	})
	t.Cleanup(func() { _ = rcl.Close() })
	// The tests' instants move far slower than real time, and Redis counts
	// a key's expiry (its reset-at − now + the margin) in real time: the
	// default second's margin let the buckets of a stage expire before the
	// next stage read them.
	nu, err := redis.New(rcl, &redis.Options{ExpiryMargin: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return old, nu, mc, rc
}

// migrationEach runs f for clients [0, n) on par goroutines; one client's
// calls are made in order by one goroutine, as one client's requests are.
func migrationEach(par, n int, f func(c int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := int(next.Add(1) - 1); c < n; c = int(next.Add(1) - 1) {
				f(c)
			}
		}()
	}
	wg.Wait()
}

// migrationNew is migration.New for arguments the test knows are valid,
// closed when the test ends.
func migrationNew(t *testing.T, old, nu throttler.Backend, r flags.Rollout, o *migration.Options) *migration.Migration {
	t.Helper()
	m, err := migration.New(old, nu, r, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// migrationPercent is a static rollout at 0% with mirroring on: the shadow
// stage.
func migrationPercent(t *testing.T) *flags.Percent {
	t.Helper()
	r, err := flags.NewPercent(0)
	if err != nil {
		t.Fatal(err)
	}
	r.SetMirror(true)
	return r
}

func migrationKey(c int) string { return fmt.Sprintf("client-%04d", c) }

func migrationFlush(t *testing.T, f interface{ Flush(context.Context) error }) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
}

// migrationClean fails unless s compared something and saw no mismatch,
// drop or error.
func migrationClean(t *testing.T, stage, name string, s shadow.Stats) {
	t.Helper()
	if s.Mismatched != 0 || s.ByKind[shadow.Dropped] != 0 ||
		s.ByKind[shadow.CandidateError] != 0 || s.ByKind[shadow.ControlError] != 0 {
		t.Errorf("%s: %s shadow: compared %d, mismatched %d, kinds %v, last %v",
			stage, name, s.Compared, s.Mismatched, s.ByKind, s.LastMismatches)
	}
}

// TestMigrationEndToEnd: shadow at 0%, ramp to 10% and 50%, roll back to 0%,
// then 100%, all inside one window; then a second window at 100%, and
// mirroring off to finish. No client is ever admitted more than its limit
// in a window across any switch, and both shadows agree on every call.
func TestMigrationEndToEnd(t *testing.T) {
	old, nu, _, _ := migrationStores(t)
	ctx := context.Background()
	p := throttler.Policy{Name: "api", Limit: 7, Window: time.Minute}
	// The rollout is a file an operator edits, as in production.
	path := filepath.Join(t.TempDir(), "rollout.json")
	setRollout := func(percent int, mirror bool) {
		t.Helper()
		tmp := path + ".tmp"
		body := fmt.Sprintf(`{"percent": %d, "mirror": %v}`, percent, mirror)
		if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	setRollout(0, true)
	rollout, err := flags.NewFile(path, &flags.FileOptions{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rollout.Close() })
	shadowOpts := &shadow.Options{Workers: 16, QueueSize: 4096, Timeout: 5 * time.Second}
	m := migrationNew(t, old, nu, rollout, &migration.Options{Forward: shadowOpts, Reverse: shadowOpts})

	// admitted[w][c]: units admitted to client c in window w.
	admitted := [2][]int64{make([]int64, migrationClients), make([]int64, migrationClients)}
	stages := []struct {
		name    string
		percent int
		mirror  bool
		window  int
	}{
		{"shadow 0%", 0, true, 0},
		{"ramp 10%", 10, true, 0},
		{"ramp 50%", 50, true, 0},
		{"rollback 0%", 0, true, 0},
		{"100%", 100, true, 0},
		{"100%, next window", 100, true, 1},
		{"finish: 100%, mirror off", 100, false, 1},
	}
	var before migration.Stats
	for i, st := range stages {
		setRollout(st.percent, st.mirror)
		// The file is checked every Interval; load the edit now, so that
		// the stage starts on it.
		if err := rollout.Reload(); err != nil {
			t.Fatal(err)
		}
		if got, mirror := rollout.Percent(), rollout.Mirroring(); got != st.percent || mirror != st.mirror {
			t.Fatalf("%s: rollout file reads percent %d, mirror %v", st.name, got, mirror)
		}
		// The shared clock: every stage a few seconds later; the second
		// window starts a whole Window after the first one opened.
		now := migrationT0.Add(time.Duration(i) * 5 * time.Second).Add(time.Duration(st.window) * p.Window)
		onNew := 0
		for c := range migrationClients {
			if rollout.UseNew(migrationKey(c)) {
				onNew++
			}
		}
		migrationEach(32, migrationClients, func(c int) {
			for range 2 {
				d, err := m.Take(ctx, migrationKey(c), p, 1, now)
				if err != nil {
					t.Errorf("%s: client %d: %v", st.name, c, err)
					return
				}
				if d.Allowed {
					admitted[st.window][c]++
				}
			}
		})
		// The stage boundary: every mirrored call has landed before the
		// rollout moves again (see "Switching" in docs/migration.md).
		migrationFlush(t, m)
		s := m.Stats()
		migrationClean(t, st.name, "forward", s.Forward)
		migrationClean(t, st.name, "reverse", s.Reverse)
		routedNew := s.Routed.New - before.Routed.New
		if want := uint64(2 * onNew); routedNew != want {
			t.Errorf("%s: %d calls routed to Redis, want %d", st.name, routedNew, want)
		}
		// A moving key's calls are made on both stores instead of mirrored.
		compared := s.Forward.Compared + s.Reverse.Compared + s.Moving.Calls -
			before.Forward.Compared - before.Reverse.Compared - before.Moving.Calls
		if want := uint64(2 * migrationClients); st.mirror && compared != want {
			t.Errorf("%s: %d calls compared or made on both stores, want every one of %d", st.name, compared, want)
		}
		if !st.mirror && s.Forward.Results+s.Reverse.Results != before.Forward.Results+before.Reverse.Results {
			t.Errorf("%s: mirroring is off, yet calls were mirrored", st.name)
		}
		t.Logf("%-26s %3d%%: %4d clients on Redis; forward compared %6d, reverse compared %6d, mismatches %d",
			st.name, st.percent, onNew, s.Forward.Compared, s.Reverse.Compared, s.Forward.Mismatched+s.Reverse.Mismatched)
		before = s
	}
	if pct := 100 * float64(before.Routed.New) / float64(before.Routed.New+before.Routed.Old); pct < 30 {
		t.Errorf("only %.0f%% of calls went to Redis", pct)
	}
	// 10 calls per client in the first window against a limit of 7, 4 in
	// the second: exactly the limit, then 4.
	for c := range migrationClients {
		if admitted[0][c] != p.Limit || admitted[1][c] != 4 {
			t.Errorf("client %d admitted %d in the first window and %d in the second; want %d and 4",
				c, admitted[0][c], admitted[1][c], p.Limit)
		}
	}
}

// TestMigrationEvictionDiverges: when Memcached runs out of memory and
// evicts live windows, its clients get fresh windows; Redis, kept warm by
// the mirror, does not, and the shadow reports the divergence.
func TestMigrationEvictionDiverges(t *testing.T) {
	old, nu, mc, _ := migrationStores(t, "-m", "2")
	ctx := context.Background()
	p := throttler.Policy{Name: "api", Limit: 100, Window: time.Hour}
	o := &shadow.Options{Workers: 16, QueueSize: 4096, Timeout: 5 * time.Second}
	m := migrationNew(t, old, nu, migrationPercent(t), &migration.Options{Forward: o, Reverse: o})

	takeAll := func(now time.Time, n int) {
		migrationEach(32, migrationClients, func(c int) {
			for range n {
				if _, err := m.Take(ctx, migrationKey(c), p, 1, now); err != nil {
					t.Errorf("client %d: %v", c, err)
					return
				}
			}
		})
		migrationFlush(t, m)
	}
	takeAll(migrationT0, 3)
	migrationClean(t, "before the squeeze", "forward", m.Stats().Forward)

	// Other data fills the server: items of the limiter's sizes, so they
	// compete in the same slab classes, several times its memory.
	junk := memcachedClient(t, time.Second, mc.addr)
	migrationEach(32, 60000, func(i int) {
		_ = junk.Set(&memcache.Item{
			Key:   fmt.Sprintf("junk:%08d:%s", i, strings.Repeat("x", i%48)),
			Value: []byte("17722222222220000000000")[:1+i%20],
		})
	})

	takeAll(migrationT0.Add(time.Second), 1)
	s := m.Stats().Forward
	if s.Mismatched == 0 {
		t.Fatalf("Memcached was squeezed, yet the shadow saw no divergence: %+v", s)
	}
	// The control forgot: its counts are below the candidate's.
	forgot := 0
	for _, r := range s.LastMismatches {
		if r.Control.Used < r.Candidate.Used && r.Candidate.Used == 4 {
			forgot++
		}
	}
	if forgot == 0 {
		t.Errorf("no kept mismatch shows Memcached below Redis's count of 4: %v", s.LastMismatches)
	}
	t.Logf("after the squeeze: %d of %d calls diverged (%d compared), kinds %v",
		s.Mismatched, migrationClients, s.Compared, s.ByKind)
}

// migrationLatencies returns the median and the maximum of d.
func migrationLatencies(d []time.Duration) (median, maximum time.Duration) {
	slices.Sort(d)
	return d[len(d)/2], d[len(d)-1]
}

// TestMigrationCandidateDown: with Redis paused (calls hang) and then
// stopped (calls fail at once), the control path's decisions are exactly
// what Memcached alone decides, its latency stays Memcached's, and the
// shadow counts the drops and the errors.
func TestMigrationCandidateDown(t *testing.T) {
	old, nu, _, rc := migrationStores(t)
	ctx := context.Background()
	p := throttler.Policy{Name: "api", Limit: 1000, Window: time.Hour}
	const timeout = 50 * time.Millisecond

	// The baseline: Memcached alone, on keys of its own, counting in open
	// windows as the calls measured below do (opening one costs a round
	// trip more).
	migrationEach(4, migrationClients, func(c int) {
		_, _ = old.Take(ctx, "base-"+migrationKey(c), p, 1, migrationT0)
	})
	var mu sync.Mutex
	var base []time.Duration
	migrationEach(4, migrationClients, func(c int) {
		start := time.Now()
		if _, err := old.Take(ctx, "base-"+migrationKey(c), p, 1, migrationT0); err != nil {
			t.Errorf("baseline: %v", err)
		}
		el := time.Since(start)
		mu.Lock()
		base = append(base, el)
		mu.Unlock()
	})
	baseMedian, baseMax := migrationLatencies(base)
	t.Logf("Memcached alone: median %v, max %v", baseMedian, baseMax)

	// run makes one call per client through m and checks that each
	// decision is the next count of that client, as Memcached alone
	// would answer; it returns the median latency.
	run := func(phase string, m *migration.Migration, wantUsed int64, checkLatency bool) {
		var lat []time.Duration
		migrationEach(4, migrationClients, func(c int) {
			start := time.Now()
			d, err := m.Take(ctx, migrationKey(c), p, 1, migrationT0)
			el := time.Since(start)
			mu.Lock()
			lat = append(lat, el)
			mu.Unlock()
			if err != nil || !d.Allowed || d.Used != wantUsed || !d.ResetAt.Equal(migrationT0.Add(p.Window)) {
				t.Errorf("%s: client %d got %+v, %v; want allowed with Used %d", phase, c, d, err, wantUsed)
			}
		})
		med, mx := migrationLatencies(lat)
		t.Logf("%s: control median %v, max %v", phase, med, mx)
		// A shadow that waited for its candidate would cost every call the
		// candidate's timeout; this one must cost Memcached's latency. (With
		// Redis up, the mirror's work competes for the CPU: not checked.)
		if checkLatency && (med > 3*baseMedian+3*time.Millisecond || med > timeout/2) {
			t.Errorf("%s: control median %v against Memcached's %v alone: the candidate slowed the control path", phase, med, baseMedian)
		}
	}
	newMigration := func(queue int, timeout time.Duration) *migration.Migration {
		o := &shadow.Options{Workers: 2, QueueSize: queue, Timeout: timeout, DrainTimeout: 200 * time.Millisecond}
		return migrationNew(t, old, nu, migrationPercent(t), &migration.Options{Forward: o, Reverse: o})
	}

	healthy := newMigration(4096, 5*time.Second)
	run("Redis up", healthy, 1, false)
	migrationFlush(t, healthy)
	migrationClean(t, "Redis up", "forward", healthy.Stats().Forward)

	// Paused: every candidate call hangs until its timeout, the two
	// workers fall behind, their small queues fill and calls are dropped.
	redisPause(t, rc)
	paused := newMigration(16, timeout)
	run("Redis paused", paused, 2, true)
	waitFor(t, 10*time.Second, "a candidate timeout to be counted", func(context.Context) bool {
		return paused.Stats().Forward.ByKind[shadow.CandidateError] > 0
	})
	s := paused.Stats().Forward
	if s.ByKind[shadow.Dropped] == 0 || s.Mismatched != 0 {
		t.Errorf("Redis paused: dropped %d, mismatched %d; want drops and no mismatch", s.ByKind[shadow.Dropped], s.Mismatched)
	}
	if last := s.LastMismatches; len(last) != 0 {
		t.Errorf("errors and drops must not count as mismatches: %v", last)
	}
	_ = paused.Close() // gives up on the queue after its DrainTimeout
	t.Logf("Redis paused: %v", s.ByKind)

	// Stopped: the candidate refuses connections at once; every mirrored
	// call is an error, and none is lost.
	redisUnpause(t, rc)
	stopTimeout := time.Duration(0)
	if err := rc.c.Stop(context.Background(), &stopTimeout); err != nil {
		t.Fatalf("stop Redis: %v", err)
	}
	stopped := newMigration(4096, timeout)
	run("Redis stopped", stopped, 3, true)
	migrationFlush(t, stopped)
	s = stopped.Stats().Forward
	if s.ByKind[shadow.CandidateError]+s.ByKind[shadow.Dropped] != migrationClients || s.Compared != 0 {
		t.Errorf("Redis stopped: %d candidate errors, %d dropped, %d compared; want %d errors or drops, none compared",
			s.ByKind[shadow.CandidateError], s.ByKind[shadow.Dropped], s.Compared, migrationClients)
	}
	t.Logf("Redis stopped: %v", s.ByKind)
}
