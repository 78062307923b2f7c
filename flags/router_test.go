package flags

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/backend/backendtest"
	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/flags/internal/flagstest"
	"github.com/throttlekit/throttlekit/throttler"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// mem returns a default memory backend.
func mem(t testing.TB) *memory.Backend {
	t.Helper()
	b, err := memory.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// router is NewRouter for arguments the test knows are valid.
func router(t testing.TB, old, new throttler.Backend, r Rollout, opts *RouterOptions) *Router {
	t.Helper()
	rt, err := NewRouter(old, new, r, opts)
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

func TestNewRouterErrors(t *testing.T) {
	var nilMem *memory.Backend
	var nilPct *Percent
	tests := []struct {
		name     string
		old, new throttler.Backend
		rollout  Rollout
		want     string
	}{
		{"nil old", nil, mem(t), percent(t, 0), "flags: old backend is nil"},
		{"nil new", mem(t), nil, percent(t, 0), "flags: new backend is nil"},
		{"typed nil old", nilMem, mem(t), percent(t, 0), "flags: old backend is a nil *memory.Backend"},
		{"typed nil new", mem(t), nilMem, percent(t, 0), "flags: new backend is a nil *memory.Backend"},
		{"nil rollout", mem(t), mem(t), nil, "flags: rollout is nil; pass flags.NewPercent(0) to keep every key on old"},
		{"typed nil rollout", mem(t), mem(t), nilPct, "flags: rollout is a nil *flags.Percent"},
		{"nil func rollout", mem(t), mem(t), rolloutFunc(nil), "flags: rollout is a nil flags.rolloutFunc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewRouter(tt.old, tt.new, tt.rollout, nil)
			if r != nil || err == nil || err.Error() != tt.want {
				t.Fatalf("NewRouter = %v, %v; want error %q", r, err, tt.want)
			}
		})
	}
}

func TestRouterConformance(t *testing.T) {
	for _, p := range []int{0, 50, 100} {
		t.Run(strconv.Itoa(p), func(t *testing.T) {
			backendtest.Run(t, func(t *testing.T) throttler.Backend {
				return router(t, mem(t), mem(t), percent(t, p), nil)
			})
		})
	}
}

// TestRouterSendsEachKeyToItsBackend checks every operation against the
// backend the rollout names, by reading both backends directly.
func TestRouterSendsEachKeyToItsBackend(t *testing.T) {
	ctx := context.Background()
	pol := throttler.PerMinute(10)
	old, nw := mem(t), mem(t)
	pct := percent(t, 30)
	r := router(t, old, nw, pct, nil)
	keys := testKeys(400)
	var wantOld, wantNew uint64
	for _, k := range keys {
		if _, err := r.Take(ctx, k, pol, 3, t0); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Refund(ctx, k, pol, 1, t0.Add(pol.Window), t0); err != nil {
			t.Fatal(err)
		}
		d, err := r.Peek(ctx, k, pol, t0)
		if err != nil {
			t.Fatal(err)
		}
		if d.Used != 2 {
			t.Fatalf("key %q: Used = %d through the router, want 2", k, d.Used)
		}
		served, other := old, nw
		if pct.UseNew(k) {
			served, other = nw, old
			wantNew += 3
		} else {
			wantOld += 3
		}
		if d, _ := served.Peek(ctx, k, pol, t0); d.Used != 2 {
			t.Errorf("key %q: serving backend has Used %d, want 2", k, d.Used)
		}
		if d, _ := other.Peek(ctx, k, pol, t0); d.Used != 0 {
			t.Errorf("key %q: other backend has Used %d, want 0", k, d.Used)
		}
	}
	if got := r.Stats(); got != (Stats{Old: wantOld, New: wantNew}) {
		t.Errorf("Stats() = %+v, want {Old:%d New:%d}", got, wantOld, wantNew)
	}
	if wantOld == 0 || wantNew == 0 {
		t.Fatalf("30%% rollout put all keys on one side: old %d, new %d calls", wantOld, wantNew)
	}
}

// TestRouterRollback: a key that moved to new and back finds the old
// backend's count where it left it.
func TestRouterRollback(t *testing.T) {
	ctx := context.Background()
	pol := throttler.PerHour(100)
	pct := percent(t, 0)
	r := router(t, mem(t), mem(t), pct, nil)
	key := ""
	for _, k := range testKeys(100) {
		if Bucket(DefaultGroupID, k) <= 50 {
			key = k
			break
		}
	}
	steps := []struct {
		percent  int
		cost     int64
		wantUsed int64
		wantNew  bool
	}{
		{0, 5, 5, false},
		{50, 7, 7, true},   // a fresh count on new: nothing was mirrored here
		{0, 1, 6, false},   // back to old, whose count is intact
		{50, 1, 8, true},   // and new kept its own
		{100, 2, 10, true}, // raising keeps it new
	}
	for i, s := range steps {
		if err := pct.Set(s.percent); err != nil {
			t.Fatal(err)
		}
		if got := r.rollout.UseNew(key); got != s.wantNew {
			t.Fatalf("step %d: UseNew = %v, want %v", i, got, s.wantNew)
		}
		d, err := r.Take(ctx, key, pol, s.cost, t0.Add(time.Duration(i)*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if d.Used != s.wantUsed {
			t.Errorf("step %d at %d%%: Used = %d, want %d", i, s.percent, d.Used, s.wantUsed)
		}
	}
}

type failing struct{ err error }

func (f failing) Take(context.Context, string, throttler.Policy, int64, time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, f.err
}
func (f failing) Peek(context.Context, string, throttler.Policy, time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, f.err
}
func (f failing) Refund(context.Context, string, throttler.Policy, int64, time.Time, time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, f.err
}

func TestRouterErrors(t *testing.T) {
	ctx := context.Background()
	pol := throttler.PerSecond(5)
	errDown := errors.New("connection refused")
	type op func(throttler.Backend) error
	take := func(key string, cost int64) op {
		return func(b throttler.Backend) error { _, err := b.Take(ctx, key, pol, cost, t0); return err }
	}
	peek := func(key string, p throttler.Policy) op {
		return func(b throttler.Backend) error { _, err := b.Peek(ctx, key, p, t0); return err }
	}
	refund := func(key string, cost int64) op {
		return func(b throttler.Backend) error {
			_, err := b.Refund(ctx, key, pol, cost, t0.Add(pol.Window), t0)
			return err
		}
	}
	tests := []struct {
		name      string
		router    *Router
		op        op
		want      error
		wantText  string
		wantCalls Stats
	}{
		// Input errors are the backend's, returned as they are.
		{"empty key", router(t, mem(t), mem(t), percent(t, 100), nil), take("", 1), throttler.ErrInvalidKey, "throttler: invalid key: empty", Stats{New: 1}},
		{"zero cost", router(t, mem(t), mem(t), percent(t, 100), nil), take("k", 0), throttler.ErrInvalidCost, "", Stats{New: 1}},
		{"cost above limit", router(t, mem(t), mem(t), percent(t, 0), nil), take("k", 6), throttler.ErrInvalidCost, "", Stats{Old: 1}},
		{"bad refund", router(t, mem(t), mem(t), percent(t, 0), nil), refund("k", -1), throttler.ErrInvalidCost, "", Stats{Old: 1}},
		{"bad policy", router(t, mem(t), mem(t), percent(t, 0), nil), peek("k", throttler.Policy{}), throttler.ErrInvalidPolicy, "", Stats{Old: 1}},
		{"old fails", router(t, failing{errDown}, mem(t), percent(t, 0), &RouterOptions{OldName: "memcached"}), take("k", 1), errDown, "memcached backend: connection refused", Stats{Old: 1}},
		{"new fails", router(t, mem(t), failing{errDown}, percent(t, 100), nil), peek("k", pol), errDown, "new backend: connection refused", Stats{New: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.op(tt.router)
			if !errors.Is(err, tt.want) {
				t.Fatalf("error = %v, want %v", err, tt.want)
			}
			if tt.wantText != "" && err.Error() != tt.wantText {
				t.Errorf("error text = %q, want %q", err, tt.wantText)
			}
			if got := tt.router.Stats(); got != tt.wantCalls {
				t.Errorf("Stats() = %+v, want %+v", got, tt.wantCalls)
			}
		})
	}
}

// TestRouterConcurrentRamp changes the percentage while many goroutines
// take: every call is counted once on exactly one side, and the two
// backends together hold every unit taken.
func TestRouterConcurrentRamp(t *testing.T) {
	ctx := context.Background()
	pol := throttler.PerHour(1 << 40)
	old, nw := mem(t), mem(t)
	pct := percent(t, 0)
	r := router(t, old, nw, pct, nil)
	keys := testKeys(64)
	const workers, per = 4, 500
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				if _, err := r.Take(ctx, keys[(w*per+i)%len(keys)], pol, 1, t0); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for p := 0; p <= 100; p += 10 {
		pct.Set(p)
	}
	wg.Wait()
	st := r.Stats()
	if st.Old+st.New != workers*per {
		t.Fatalf("Stats %+v count %d calls, want %d", st, st.Old+st.New, workers*per)
	}
	var held int64
	for _, k := range keys {
		for _, b := range []throttler.Backend{old, nw} {
			d, err := b.Peek(ctx, k, pol, t0)
			if err != nil {
				t.Fatal(err)
			}
			held += d.Used
		}
	}
	if held != workers*per {
		t.Errorf("backends hold %d units, want %d", held, workers*per)
	}
}

func TestRouterInProcessOnlyWhenBothAre(t *testing.T) {
	m := mem(t)
	if !router(t, m, mem(t), percent(t, 50), nil).Traits().InProcess {
		t.Error("two memory backends: in process")
	}
	if router(t, m, notLocal{m}, percent(t, 50), nil).Traits().InProcess {
		t.Error("one backend that may block: not in process")
	}
}

// notLocal hides its backend's Traits, like a network store.
type notLocal struct{ throttler.Backend }

// An Op that names no operation reaches no backend's store: it is
// backend.Do's ErrUnknownOp, unwrapped.
func TestRouterUnknownOp(t *testing.T) {
	r := router(t, mem(t), mem(t), percent(t, 50), nil)
	_, err := r.do()(context.Background(), throttler.Op(9), "k", throttler.PerMinute(1), 1, time.Time{}, t0)
	if !errors.Is(err, backend.ErrUnknownOp) || err.Error() != "backend: unknown operation: Op(9)" {
		t.Fatalf("got %v, want backend.ErrUnknownOp", err)
	}
}

// A router ignores its context when either backend does, so that a
// Throttler detaches calls that may reach it.
func TestRouterIgnoresContextWhenEitherBackendDoes(t *testing.T) {
	m := mem(t)
	if router(t, m, mem(t), percent(t, 50), nil).Traits().IgnoresContext {
		t.Error("two memory backends honour their context")
	}
	if !router(t, m, blind{m}, percent(t, 50), nil).Traits().IgnoresContext {
		t.Error("the new backend ignores its context: so does the router")
	}
	if !router(t, blind{m}, m, percent(t, 0), nil).Traits().IgnoresContext {
		t.Error("the old backend ignores its context: so does the router, whatever the percentage")
	}
}

// blind says its calls may outlive their context, like the Memcached backend.
type blind struct{ throttler.Backend }

func (blind) Traits() throttler.Traits { return throttler.Traits{IgnoresContext: true} }

// hiddenPercent routes as its Percent does without telling the percentage.
type hiddenPercent struct{ p *Percent }

func (h hiddenPercent) UseNew(k string) bool { return h.p.UseNew(k) }

// TestPercentSources: Percent and File tell their percentage and group,
// which package migration asks for (see Rollout), a File without a way to
// change it; a rollout of one's own need not.
func TestPercentSources(t *testing.T) {
	type percenter interface {
		Rollout
		Percent() int
		GroupID() string
	}
	p := percent(t, 30)
	if pc := percenter(p); pc.Percent() != 30 || pc.GroupID() != DefaultGroupID {
		t.Errorf("*Percent: Percent() = %d, GroupID() = %q", pc.Percent(), pc.GroupID())
	}
	path := filepath.Join(t.TempDir(), "rollout.json")
	if err := os.WriteFile(path, []byte(`{"percent": 40}`), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := NewFile(path, &FileOptions{GroupID: "g", Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fp := percenter(f)
	if fp.Percent() != 40 || fp.GroupID() != "g" {
		t.Fatalf("*File: Percent() = %d, GroupID() = %q", fp.Percent(), fp.GroupID())
	}
	if _, settable := fp.(interface{ Set(int) error }); settable {
		t.Error("a File can change its percentage")
	}
	for _, k := range flagstest.Keys(200) {
		if fp.UseNew(k) != (Bucket("g", k) <= 40) {
			t.Fatalf("%q: the File routes apart from its percentage", k)
		}
	}
	if _, ok := Rollout(hiddenPercent{p}).(percenter); ok {
		t.Error("hiddenPercent tells its percentage")
	}
}
