package migration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/shadow"
	"github.com/throttlekit/throttlekit/throttler"
)

// monoClock is an injected monotonic clock, moved by hand.
type monoClock struct{ t atomic.Int64 }

func (c *monoClock) now() time.Duration  { return time.Duration(c.t.Load()) }
func (c *monoClock) set(d time.Duration) { c.t.Store(int64(d)) }

// migration is newMigration with c as the moving keys' clock.
func (c *monoClock) migration(t *testing.T, old, new throttler.Backend, r flags.Rollout, opts *Options) *Migration {
	t.Helper()
	m, err := newWith(old, new, r, opts, c.now)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// keyIn returns a key of DefaultGroupID whose bucket b has lo < b <= hi.
func keyIn(t testing.TB, lo, hi int) string {
	t.Helper()
	for i := range 100000 {
		k := fmt.Sprint("client-", i)
		if b := flags.Bucket(flags.DefaultGroupID, k); lo < b && b <= hi {
			return k
		}
	}
	t.Fatalf("no key with a bucket in (%d, %d]", lo, hi)
	return ""
}

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// movingCalls makes one Take of key and reports whether it was a moving
// key's call.
func movingCall(t *testing.T, m *Migration, key string, p throttler.Policy) bool {
	t.Helper()
	before := m.Stats().Moving.Calls
	if _, err := m.Take(context.Background(), key, p, 1, t0); err != nil {
		t.Fatal(err)
	}
	return m.Stats().Moving.Calls == before+1
}

// TestMovingFor: a key is moving from the moment this process sees the
// change until horizon(p) + Settle later, exactly, per algorithm; a key
// the change does not move never is.
func TestMovingFor(t *testing.T) {
	const settle = 5 * time.Second
	w := 10 * time.Second
	cases := []struct {
		p       throttler.Policy
		horizon time.Duration
	}{
		{throttler.Policy{Name: "fw", Limit: 5, Window: w}, 2 * w},
		{throttler.Policy{Name: "log", Limit: 5, Window: w, Algorithm: throttler.SlidingLog}, w},
		{throttler.Policy{Name: "sw", Limit: 5, Window: w, Algorithm: throttler.SlidingWindow}, 2 * w},
		// 2 tokens per 10s refill a bucket of 6 from empty in 30s.
		{throttler.Policy{Name: "tb", Limit: 2, Window: w}.WithBurst(6), 30 * time.Second},
		// 3 per 10s refill 4 in 13.33…s: rounded up to the nanosecond.
		{throttler.Policy{Name: "tb3", Limit: 3, Window: w}.WithBurst(4), 13333333334},
	}
	moved, stays := keyIn(t, 0, 50), keyIn(t, 50, 100)
	for _, tc := range cases {
		t.Run(tc.p.Name, func(t *testing.T) {
			if got := horizon(tc.p); got != tc.horizon {
				t.Fatalf("horizon = %v, want %v", got, tc.horizon)
			}
			var clk monoClock
			clk.set(time.Hour) // the change is seen at 1h
			r := percent(t, 0)
			m := clk.migration(t, mem(t), mem(t), r, &Options{Settle: settle})
			if movingCall(t, m, moved, tc.p) {
				t.Fatal("moving before any change")
			}
			if err := r.Set(50); err != nil {
				t.Fatal(err)
			}
			end := time.Hour + tc.horizon + settle
			for _, row := range []struct {
				at         time.Duration
				key        string
				wantMoving bool
			}{
				{time.Hour, moved, true}, // the call that sees the change
				{time.Hour, stays, false},
				{end - time.Nanosecond, moved, true},
				{end - time.Nanosecond, stays, false},
				{end, moved, false},
				{end + time.Hour, moved, false},
			} {
				clk.set(row.at)
				if got := movingCall(t, m, row.key, tc.p); got != row.wantMoving {
					t.Errorf("%s at %v: moving %v, want %v", row.key, row.at-time.Hour, got, row.wantMoving)
				}
			}
			if st := m.Stats().Moving; !st.Tracked || st.Changes != 1 {
				t.Errorf("Stats.Moving = %+v; want tracked, 1 change", st)
			}
		})
	}
}

// TestHorizonNoOverflow: policies a store would refuse still get a
// horizon, never a panic or a negative one.
func TestHorizonNoOverflow(t *testing.T) {
	for _, p := range []throttler.Policy{
		{Limit: 1, Window: 1 << 62, Algorithm: throttler.TokenBucket, Burst: 1 << 62},
		{Limit: 1, Window: 1 << 62},
		{Limit: 0, Window: time.Second, Algorithm: throttler.TokenBucket},
		{Limit: 1, Window: -time.Second},
		{Limit: 1, Window: time.Second, Algorithm: 99},
	} {
		if h := horizon(p); h < 0 {
			t.Errorf("horizon(%+v) = %v", p, h)
		}
	}
}

// scripted is a store whose every answer is set by the test; it records
// what it was asked.
type scripted struct {
	name  string
	allow bool
	err   error
	mu    sync.Mutex
	calls []string // "take@<ms>", "refund@<ms>", "peek@<ms>"
	// receipts are the Refunds' receipts.
	receipts []time.Time
}

func (s *scripted) answer(op throttler.Op, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	s.mu.Lock()
	s.calls = append(s.calls, fmt.Sprintf("%v@%d", op, now.Sub(t0).Milliseconds()))
	s.mu.Unlock()
	if s.err != nil {
		return throttler.Decision{}, s.err
	}
	d := throttler.Decision{Allowed: s.allow, Limit: p.Limit, Used: 1, Remaining: p.Limit - 1, ResetAt: t0.Add(p.Window)}
	if !s.allow {
		d.Used, d.Remaining, d.RetryAfter = p.Limit, 0, p.Window
	}
	return d, nil
}

func (s *scripted) Take(_ context.Context, _ string, p throttler.Policy, _ int64, now time.Time) (throttler.Decision, error) {
	return s.answer(throttler.OpTake, p, now)
}
func (s *scripted) Peek(_ context.Context, _ string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	return s.answer(throttler.OpPeek, p, now)
}
func (s *scripted) Refund(_ context.Context, _ string, p throttler.Policy, _ int64, receipt, now time.Time) (throttler.Decision, error) {
	s.mu.Lock()
	s.receipts = append(s.receipts, receipt)
	s.mu.Unlock()
	return s.answer(throttler.OpRefund, p, now)
}

func (s *scripted) log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.calls, " ")
}

// TestCombine: every combination of answers of the serving store (new,
// after a change to 100%) and the other store (old), for an algorithm
// called on both at once (token bucket) and for the fixed window, whose
// serving store is called after the other at the start of the other's
// window (ResetAt − Window; the scripted stores' windows start at t0,
// 1000 ms before the call).
func TestCombine(t *testing.T) {
	down := errors.New("connection refused")
	bad := fmt.Errorf("%w: too long for this store", throttler.ErrInvalidKey)
	type answer struct {
		allow bool
		err   error
	}
	allow, deny, fail, refuse := answer{allow: true}, answer{}, answer{err: down}, answer{err: bad}
	bucket := throttler.Policy{Name: "b", Limit: 5, Window: time.Minute}.WithBurst(5)
	fixed := throttler.Policy{Name: "f", Limit: 5, Window: time.Minute}
	const at = "@1000" // the call's now, ms after t0
	cases := []struct {
		name          string
		p             throttler.Policy
		op            throttler.Op
		serving, othr answer
		wantAllowed   bool
		wantErr       error  // matched with errors.Is
		wantNew       string // the serving store's calls
		wantOld       string // the other store's calls
		oneStore      uint64
	}{
		{"bucket: both admit", bucket, throttler.OpTake, allow, allow, true, nil, "take" + at, "take" + at, 0},
		{"bucket: serving denies", bucket, throttler.OpTake, deny, allow, false, nil, "take" + at, "take" + at + " refund" + at, 0},
		{"bucket: other denies", bucket, throttler.OpTake, allow, deny, false, nil, "take" + at + " refund" + at, "take" + at, 0},
		{"bucket: both deny", bucket, throttler.OpTake, deny, deny, false, nil, "take" + at, "take" + at, 0},
		{"bucket: serving fails, other admits", bucket, throttler.OpTake, fail, allow, false, down, "take" + at, "take" + at + " refund" + at, 0},
		{"bucket: serving fails, other denies", bucket, throttler.OpTake, fail, deny, false, down, "take" + at, "take" + at, 0},
		{"bucket: serving refuses the key", bucket, throttler.OpTake, refuse, allow, false, bad, "take" + at, "take" + at + " refund" + at, 0},
		{"bucket: both fail", bucket, throttler.OpTake, fail, fail, false, down, "take" + at, "take" + at, 0},
		{"bucket: other fails, serving admits", bucket, throttler.OpTake, allow, fail, true, nil, "take" + at, "take" + at, 1},
		{"bucket: other fails, serving denies", bucket, throttler.OpTake, deny, fail, false, nil, "take" + at, "take" + at, 1},
		{"bucket: other refuses the key", bucket, throttler.OpTake, allow, refuse, true, nil, "take" + at, "take" + at, 1},
		{"bucket: peek, other says no", bucket, throttler.OpPeek, allow, deny, false, nil, "peek" + at, "peek" + at, 0},
		{"bucket: peek, other fails", bucket, throttler.OpPeek, allow, fail, true, nil, "peek" + at, "peek" + at, 1},
		{"bucket: refund both", bucket, throttler.OpRefund, allow, allow, true, nil, "refund" + at, "refund" + at, 0},
		{"bucket: refund, serving fails", bucket, throttler.OpRefund, fail, allow, false, down, "refund" + at, "refund" + at, 0},

		{"fixed: both admit", fixed, throttler.OpTake, allow, allow, true, nil, "take@0", "take" + at, 0},
		{"fixed: serving denies", fixed, throttler.OpTake, deny, allow, false, nil, "take@0", "take" + at + " refund" + at, 0},
		{"fixed: other denies, serving not asked", fixed, throttler.OpTake, allow, deny, false, nil, "", "take" + at, 0},
		{"fixed: other denies, serving down", fixed, throttler.OpTake, fail, deny, false, nil, "", "take" + at, 0},
		{"fixed: serving fails", fixed, throttler.OpTake, fail, allow, false, down, "take@0", "take" + at + " refund" + at, 0},
		{"fixed: other fails, serving alone at now", fixed, throttler.OpTake, allow, fail, true, nil, "take" + at, "take" + at, 1},
		{"fixed: other fails, serving denies", fixed, throttler.OpTake, deny, fail, false, nil, "take" + at, "take" + at, 1},
		{"fixed: both fail", fixed, throttler.OpTake, fail, fail, false, down, "take" + at, "take" + at, 0},
		{"fixed: refund both, in the other's window", fixed, throttler.OpRefund, allow, allow, true, nil, "refund@0", "refund" + at, 0},
		{"fixed: peek both at now", fixed, throttler.OpPeek, deny, allow, false, nil, "peek" + at, "peek" + at, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var clk monoClock
			nw := &scripted{name: "new", allow: tc.serving.allow, err: tc.serving.err}
			old := &scripted{name: "old", allow: tc.othr.allow, err: tc.othr.err}
			r := percent(t, 0)
			m := clk.migration(t, old, nw, r, nil)
			if err := r.Set(100); err != nil {
				t.Fatal(err)
			}
			var d throttler.Decision
			var err error
			now := t0.Add(time.Second)
			switch tc.op {
			case throttler.OpTake:
				d, err = m.Take(context.Background(), "k", tc.p, 1, now)
			case throttler.OpPeek:
				d, err = m.Peek(context.Background(), "k", tc.p, now)
			case throttler.OpRefund:
				d, err = m.Refund(context.Background(), "k", tc.p, 1, now.Add(tc.p.Window), now)
			}
			switch {
			case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			case tc.wantErr == nil && err != nil:
				t.Fatalf("err = %v", err)
			case tc.wantErr == bad && err.Error() != bad.Error():
				t.Errorf("an input error must come back as it is: %q", err)
			case tc.wantErr == down && !strings.HasPrefix(err.Error(), "new backend: "):
				t.Errorf("the serving store's failure must name it: %q", err)
			case err == nil && d.Allowed != tc.wantAllowed:
				t.Errorf("Allowed = %v, want %v (%+v)", d.Allowed, tc.wantAllowed, d)
			}
			if got := nw.log(); got != tc.wantNew {
				t.Errorf("serving store got %q, want %q", got, tc.wantNew)
			}
			if got := old.log(); got != tc.wantOld {
				t.Errorf("other store got %q, want %q", got, tc.wantOld)
			}
			st := m.Stats()
			refunds := uint64(strings.Count(nw.log()+old.log(), "refund"))
			if tc.op == throttler.OpRefund {
				refunds = 0
			}
			if st.Moving.Calls != 1 || st.Moving.OneStore != tc.oneStore || st.Moving.Compensated != refunds || st.Routed.New != 1 || st.Routed.Old != 0 {
				t.Errorf("stats: moving %+v, routed %+v", st.Moving, st.Routed)
			}
			if st.Forward.Results+st.Reverse.Results != 0 {
				t.Errorf("a moving key's call was mirrored: %+v", st)
			}
		})
	}
}

// A failing compensating Refund is counted; the call's answer is the
// denial all the same.
func TestCompensationFails(t *testing.T) {
	var clk monoClock
	r := percent(t, 0)
	// The serving (new) store admits and the old one denies: the new store
	// is refunded, and its Refund fails.
	m := clk.migration(t, &scripted{allow: false}, &failingRefund{scripted{allow: true}}, r, nil)
	_ = r.Set(100)
	p := throttler.Policy{Name: "b", Limit: 5, Window: time.Minute}.WithBurst(5)
	d, err := m.Take(context.Background(), "k", p, 1, t0)
	if err != nil || d.Allowed {
		t.Fatalf("got %+v, %v; want a denial", d, err)
	}
	if st := m.Stats().Moving; st.Compensated != 1 || st.RefundFailed != 1 {
		t.Errorf("stats %+v; want 1 compensation, failed", st)
	}
}

type failingRefund struct{ scripted }

func (f *failingRefund) Refund(context.Context, string, throttler.Policy, int64, time.Time, time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, errors.New("refund lost")
}

// A moving key's Take that one store admits and the other denies leaves
// the admitting store as it was: the compensation is real, on real
// arithmetic.
func TestCompensationRestores(t *testing.T) {
	ctx := context.Background()
	for _, p := range []throttler.Policy{
		throttler.Policy{Name: "b", Limit: 3, Window: time.Minute}.WithBurst(3),
		{Name: "log", Limit: 3, Window: time.Minute, Algorithm: throttler.SlidingLog},
		{Name: "sw", Limit: 3, Window: time.Minute, Algorithm: throttler.SlidingWindow},
		{Name: "fw", Limit: 3, Window: time.Minute},
	} {
		t.Run(p.Name, func(t *testing.T) {
			var clk monoClock
			old, nw := mem(t), mem(t)
			r := percent(t, 0)
			m := clk.migration(t, old, nw, r, nil)
			// The key spent its limit on the old store; the new store has
			// seen one of its calls (the mirror dropped the rest).
			for range 3 {
				if d, _ := old.Take(ctx, "k", p, 1, t0); !d.Allowed {
					t.Fatal("setup")
				}
			}
			if d, _ := nw.Take(ctx, "k", p, 1, t0); !d.Allowed {
				t.Fatal("setup")
			}
			_ = r.Set(100)
			d, err := m.Take(ctx, "k", p, 1, t0.Add(time.Second))
			if err != nil || d.Allowed {
				t.Fatalf("moving key: %+v, %v; want the old store's denial", d, err)
			}
			if pk, _ := nw.Peek(ctx, "k", p, t0.Add(time.Second)); pk.Used != 1 {
				t.Errorf("the new store holds %d used, want the 1 it had: the denied call left nothing", pk.Used)
			}
		})
	}
}

// TestRollbackMidMove: 0% → 50% → 0% while the first move is under way.
// The key moved there and back is moving until horizon + Settle after the
// rollback; its old-store count is binding throughout, so it never gets
// more than its limit in a window, and once both moves are over it is
// served by the old store alone.
func TestRollbackMidMove(t *testing.T) {
	ctx := context.Background()
	const settle = 2 * time.Second
	p := throttler.Policy{Name: "api", Limit: 3, Window: 10 * time.Second} // horizon 20s
	var clk monoClock
	old, nw := mem(t), mem(t)
	r := percent(t, 0)
	r.SetMirror(true)
	m := clk.migration(t, old, nw, r, &Options{Settle: settle,
		// One queued call at most: mirroring drops, as under load.
		Forward: &shadow.Options{Workers: 1, QueueSize: 1}, Reverse: &shadow.Options{Workers: 1, QueueSize: 1}})
	key := keyIn(t, 0, 50)
	admitted := map[int]int{} // window index → admitted
	take := func(at time.Duration) (moving bool) {
		t.Helper()
		clk.set(at) // the window clock and the monotonic one move together
		before := m.Stats().Moving.Calls
		d, err := m.Take(ctx, key, p, 1, t0.Add(at))
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted[int(at/p.Window)]++
		}
		return m.Stats().Moving.Calls > before
	}
	for at := time.Duration(0); at < 3*time.Second; at += time.Second {
		if take(at) {
			t.Fatalf("moving at %v, before any change", at)
		}
	}
	_ = r.Set(50) // seen at 3s: moving until 3s + 20s + 2s = 25s
	for at := 3 * time.Second; at < 6*time.Second; at += time.Second {
		if !take(at) {
			t.Fatalf("not moving at %v, just after the ramp", at)
		}
	}
	_ = r.Set(0) // the rollback, seen at 6s: moving until 28s
	for at := 6 * time.Second; at < 28*time.Second; at += time.Second {
		if !take(at) {
			t.Fatalf("not moving at %v: the rollback's move runs until 28s", at)
		}
	}
	for at := 28 * time.Second; at < 40*time.Second; at += time.Second {
		if take(at) {
			t.Fatalf("moving at %v, after both moves", at)
		}
	}
	for w, n := range admitted {
		if n > 3 {
			t.Errorf("window %d: %d admitted, limit 3", w, n)
		}
	}
	if admitted[0] != 3 || admitted[2] != 3 || admitted[3] != 3 {
		t.Errorf("admitted per window %v; want the limit in each (the client asks every second)", admitted)
	}
	if st := m.Stats(); st.Moving.Changes != 2 || st.Moving.Calls != 25 {
		t.Errorf("moving stats %+v; want 2 changes, 25 calls", st.Moving)
	}
}

// TestFixedWindowPhase: the store a fixed-window key moves to had opened
// its window at another instant than the old store (it missed the call
// that opened the old one). Called at the start of the old store's window,
// it comes to count in the old store's windows, so that served alone later
// it admits no more than the old store would have: the key never gets more
// than its limit in any of the old store's windows, which are the ones it
// has been counted in.
func TestFixedWindowPhase(t *testing.T) {
	ctx := context.Background()
	p := throttler.Policy{Name: "api", Limit: 3, Window: 10 * time.Second}
	var clk monoClock
	old, nw := mem(t), mem(t)
	r := percent(t, 0)
	m := clk.migration(t, old, nw, r, &Options{Settle: time.Second}) // moving for 21s
	key := "k"
	// The old store's window opens at 0 and is spent; the new store saw
	// only the last of those calls, at 4s: its window is [4s, 14s).
	for _, at := range []time.Duration{0, time.Second, 4 * time.Second} {
		if d, _ := old.Take(ctx, key, p, 1, t0.Add(at)); !d.Allowed {
			t.Fatal("setup")
		}
	}
	if d, _ := nw.Take(ctx, key, p, 1, t0.Add(4*time.Second)); !d.Allowed {
		t.Fatal("setup")
	}
	_ = r.Set(100)
	// The client asks every 500ms from 5s to 60s; windows of the old store
	// are [0, 10s), [10s, 20s), …: each admits 3.
	perWindow := map[int]int{0: 3}
	var lastReset time.Time
	for at := 5 * time.Second; at < 60*time.Second; at += 500 * time.Millisecond {
		clk.set(at - 5*time.Second) // the change was seen at 5s
		d, err := m.Take(ctx, key, p, 1, t0.Add(at))
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			perWindow[int(at/p.Window)]++
			lastReset = d.ResetAt
		}
	}
	for w, n := range perWindow {
		if n > 3 {
			t.Errorf("the old store's window %d: %d admitted, limit 3 (%v)", w, n, perWindow)
		}
	}
	if len(perWindow) != 6 {
		t.Errorf("admitted per window %v; want each of the 6 windows used", perWindow)
	}
	// Served alone since 26s, the new store counts in the windows the old
	// one opened.
	if want := t0.Add(60 * time.Second); !lastReset.Equal(want) {
		t.Errorf("the last admission's window ends at %v, want %v", lastReset.Sub(t0), want.Sub(t0))
	}
}

// TestHistoryBound: 40 changes keep at most maxMarks marks; merging the
// oldest still counts the keys they moved as moving.
func TestHistoryBound(t *testing.T) {
	var clk monoClock
	r := percent(t, 0)
	m := clk.migration(t, mem(t), mem(t), r, &Options{Settle: time.Minute})
	p := throttler.Policy{Name: "api", Limit: 3, Window: time.Second}
	first := keyIn(t, 0, 1) // moved by the first change only
	for i := 1; i <= 40; i++ {
		clk.set(time.Duration(i) * time.Millisecond)
		_ = r.Set(i)
		movingCall(t, m, keyIn(t, 90, 100), p) // the call that sees it
	}
	if n := len(m.moves.hist.Load().marks); n != maxMarks {
		t.Fatalf("%d marks, want %d", n, maxMarks)
	}
	if !movingCall(t, m, first, p) {
		t.Error("the key the first change moved is not moving after its mark merged")
	}
	if movingCall(t, m, keyIn(t, 40, 100), p) {
		t.Error("a key no change moved is moving")
	}
	if st := m.Stats().Moving; st.Changes != 40 {
		t.Errorf("Changes = %d, want 40", st.Changes)
	}
}

// opaque hides a rollout's percentage: a Migration cannot tell what a
// change moves, so it never treats a key as moving.
type opaque struct{ r *flags.Percent }

func (o opaque) UseNew(k string) bool { return o.r.UseNew(k) }
func (o opaque) Mirroring() bool      { return o.r.Mirroring() }

func TestUntrackedRollout(t *testing.T) {
	r := percent(t, 0)
	m := newMigration(t, mem(t), mem(t), opaque{r}, nil)
	_ = r.Set(100)
	p := throttler.PerMinute(3)
	if movingCall(t, m, "k", p) {
		t.Error("a moving call on a rollout that cannot tell its percentage")
	}
	if st := m.Stats(); st.Moving.Tracked || st.Moving.Changes != 0 || st.Routed.New != 1 {
		t.Errorf("stats %+v", st)
	}
}

// A File is tracked through its settings.
// writeFile replaces the file at path atomically, as operators are told to.
func writeFile(path, body string) error {
	if err := os.WriteFile(path+".tmp", []byte(body), 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

func TestFileRolloutTracked(t *testing.T) {
	path := t.TempDir() + "/rollout.json"
	if err := writeFile(path, `{"percent": 0}`); err != nil {
		t.Fatal(err)
	}
	f, err := flags.NewFile(path, &flags.FileOptions{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := newMigration(t, mem(t), mem(t), f, nil)
	if err := writeFile(path, `{"percent": 100}`); err != nil {
		t.Fatal(err)
	}
	if err := f.Reload(); err != nil {
		t.Fatal(err)
	}
	if !movingCall(t, m, "k", throttler.PerMinute(3)) || !m.Stats().Moving.Tracked {
		t.Errorf("a key the file moved is not moving: %+v", m.Stats().Moving)
	}
}

// TestMovingRace: goroutines spend one window of many keys while two of
// them flip the percentage between 0 and 100 and the mirror's one-call
// queues drop; the moving keys' calls keep every key within its limit. With
// the percentage hidden (no moving keys) the same run hands out fresh
// windows, which proves the check can fail. Run with -race.
func TestMovingRace(t *testing.T) {
	p := throttler.Policy{Name: "api", Limit: 5, Window: time.Hour}
	flipRace(t, p.Limit, "a fresh window", func(m *Migration, key string, _ int) (bool, error) {
		d, err := m.Take(context.Background(), key, p, 1, t0)
		return d.Allowed, err
	})
}

// flipRace is the race of TestMovingRace and TestLeasesExactUnderARamp:
// 8 goroutines make 400 calls each over 50 keys, all at t0, while two of
// them flip the percentage between 0 and 100 with the mirror on and its
// one-call queues dropping; call (given the migration, a key and a number
// unique to the call) reports whether a call was admitted. Without hiding
// the percentage, no key may be admitted more than limit, and moving keys
// must have been exercised; with it hidden (so that no key is moving),
// some key must get more, what (fresh) says, which proves the check can
// fail.
func flipRace(t *testing.T, limit int64, fresh string, call func(m *Migration, key string, n int) (bool, error)) {
	t.Helper()
	for _, hide := range []bool{false, true} {
		t.Run(fmt.Sprint("hidden=", hide), func(t *testing.T) {
			r := percent(t, 0)
			r.SetMirror(true)
			var rollout flags.Rollout = r
			if hide {
				rollout = opaque{r}
			}
			small := &shadow.Options{Workers: 1, QueueSize: 1}
			m := newMigration(t, mem(t), mem(t), rollout, &Options{Forward: small, Reverse: small})
			const keys, goroutines = 50, 8
			var admitted [keys]atomic.Int64
			var calls sync.WaitGroup
			for g := range goroutines {
				calls.Go(func() {
					for i := range 400 {
						if g < 2 && i%20 == 10 {
							_ = r.Set(100 * (i / 20 % 2))
						}
						k := (g*7 + i) % keys
						ok, err := call(m, fmt.Sprint("client-", k), g*1000+i+1)
						if err != nil {
							t.Error(err)
							return
						}
						if ok {
							admitted[k].Add(1)
						}
					}
				})
			}
			calls.Wait()
			over := 0
			for k := range admitted {
				if n := admitted[k].Load(); n > limit {
					over++
					if !hide {
						t.Errorf("client-%d admitted %d, limit %d", k, n, limit)
					}
				}
			}
			st := m.Stats().Moving
			switch {
			case hide && over == 0:
				t.Errorf("with the percentage hidden no key got %s: the check cannot fail", fresh)
			case !hide && (st.Calls == 0 || st.Changes == 0):
				t.Errorf("the race exercised no moving key: %+v", st)
			}
		})
	}
}

type panicking struct{ scripted }

func (*panicking) Take(context.Context, string, throttler.Policy, int64, time.Time) (throttler.Decision, error) {
	panic("boom")
}

// A store that panics while called alongside the other is a failure of
// that store, not of the process.
func TestOtherStorePanics(t *testing.T) {
	r := percent(t, 0)
	m := newMigration(t, &panicking{}, &scripted{allow: true}, r, nil)
	_ = r.Set(100)
	p := throttler.Policy{Name: "b", Limit: 5, Window: time.Minute}.WithBurst(5)
	d, err := m.Take(context.Background(), "k", p, 1, t0)
	if err != nil || !d.Allowed || m.Stats().Moving.OneStore != 1 {
		t.Fatalf("got %+v, %v, %+v; want the serving store's answer alone", d, err, m.Stats().Moving)
	}
}

// TestBucketLeveled: a token bucket the mirror left fuller in the store a
// key moves to is emptied down to the other store's level on the first
// call that both admit, so that once the move is over the new store admits
// what the old one would have, though the key never stopped spending.
func TestBucketLeveled(t *testing.T) {
	ctx := context.Background()
	p := throttler.Policy{Name: "tb", Limit: 1, Window: time.Second}.WithBurst(5) // horizon 5s
	var clk monoClock
	old, nw := mem(t), mem(t)
	r := percent(t, 0)
	m := clk.migration(t, old, nw, r, &Options{Settle: time.Second})
	// Old: 3 of 5 taken; new: the mirror delivered none of it.
	if d, _ := old.Take(ctx, "k", p, 3, t0); !d.Allowed {
		t.Fatal("setup")
	}
	_ = r.Set(100)
	d, err := m.Take(ctx, "k", p, 1, t0)
	if err != nil || !d.Allowed || d.Remaining != 1 {
		t.Fatalf("moving Take: %+v, %v; want admitted, 1 left", d, err)
	}
	pk, _ := nw.Peek(ctx, "k", p, t0)
	if pk.Remaining != 1 || m.Stats().Moving.Leveled != 1 {
		t.Fatalf("the new store has %d left (leveled %d); want the old store's 1", pk.Remaining, m.Stats().Moving.Leveled)
	}
	// The key keeps spending a token a second, as fast as it refills,
	// past the move's end at 6s; the new store alone admits exactly what
	// the old store's count allows.
	admitted := 0
	for at := time.Second; at <= 10*time.Second; at += 500 * time.Millisecond {
		clk.set(at)
		d, err := m.Take(ctx, "k", p, 1, t0.Add(at))
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	// 1 left at 0s, plus a token a second for 10 seconds.
	if admitted != 11 {
		t.Errorf("%d admitted after the first call, want 11", admitted)
	}
}

// A compensating Refund names what the store that admitted counted the
// Take in: its own decision's ResetAt (the scripted stores' is t0+Window,
// a minute before the call's now+Window). So a window that another call
// opened in between is never credited, for the fixed window called in
// phase as for the other algorithms called at once, and nothing has to be
// taken back.
func TestCompensationNamesTheTakesState(t *testing.T) {
	for _, p := range []throttler.Policy{
		{Name: "f", Limit: 5, Window: time.Minute},
		{Name: "b", Limit: 5, Window: time.Minute, Algorithm: throttler.TokenBucket},
	} {
		old := &scripted{allow: true}
		r := percent(t, 0)
		m := newMigration(t, old, &scripted{allow: false}, r, nil)
		_ = r.Set(100)
		d, err := m.Take(context.Background(), "k", p, 1, t0.Add(time.Second))
		if err != nil || d.Allowed {
			t.Fatalf("%v: got %+v, %v; want the serving store's denial", p.Algorithm, d, err)
		}
		if log := old.log(); log != "take@1000 refund@1000" {
			t.Errorf("%v: the old store got %q; want its Take refunded, nothing taken back", p.Algorithm, log)
		}
		if got, want := old.receipts, []time.Time{t0.Add(p.Window)}; !slices.Equal(got, want) {
			t.Errorf("%v: refund receipts %v, want the old store's ResetAt %v", p.Algorithm, got, want)
		}
		if st := m.Stats().Moving; st.Compensated != 1 || st.RefundFailed != 0 {
			t.Errorf("%v: stats %+v", p.Algorithm, st)
		}
	}
}

// A caller whose clock is behind the process that opened the other store's
// window still has the serving store count in that window: it is called at
// the window's start, after the caller's now.
func TestPhasedClockBehind(t *testing.T) {
	nw, old := &scripted{allow: true}, &scripted{allow: true} // old's window starts at t0
	r := percent(t, 0)
	m := newMigration(t, old, nw, r, nil)
	_ = r.Set(100)
	fixed := throttler.Policy{Name: "f", Limit: 5, Window: time.Minute}
	if _, err := m.Take(context.Background(), "k", fixed, 1, t0.Add(-30*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if got := nw.log(); got != "take@0" {
		t.Errorf("the serving store got %q, want a Take at the old store's window start, take@0", got)
	}
}
