package shed_test

import (
	"context"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/shed"
)

var t0 = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

func at(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

// utilization is a Utilization source a test sets.
type utilization struct{ bits atomic.Uint64 }

func (u *utilization) set(v float64) { u.bits.Store(math.Float64bits(v)) }
func (u *utilization) get() float64  { return math.Float64frombits(u.bits.Load()) }

func newWorker(t testing.TB, o shed.WorkerOptions) (*shed.Worker, *utilization) {
	t.Helper()
	u := &utilization{}
	if o.Utilization == nil && o.Workers == 0 {
		o.Utilization = u.get
	}
	w, err := shed.NewWorker(&o)
	if err != nil {
		t.Fatal(err)
	}
	return w, u
}

// chances are the drop probabilities the controller's definition gives for
// shedding amount s: with 3 shed-able classes, class i (least important
// first) drops clamp(3s - i, 0, 1).
func chances(s float64) map[shed.Class]float64 {
	c := func(i float64) float64 { return min(max(3*s-i, 0), 1) }
	return map[shed.Class]float64{shed.TestMode: c(0), shed.Read: c(1), shed.Write: c(2), shed.Critical: 0}
}

// TestWorkerOverTime drives the controller with Stripe's constants one tick
// a second through a table of utilization, and checks the shedding amount
// (in 120ths: the amount moves by one per second at utilization 1) and the
// drop chance of every class at fixed instants: the 28 s delay, the 120 s
// ramp, the dead zone holding, the equally slow recovery, and a half-speed
// rise and fall at utilizations 0.9 and 0.35.
func TestWorkerOverTime(t *testing.T) {
	w, u := newWorker(t, shed.WorkerOptions{})
	// From second `from` (exclusive: its tick belongs to the previous row)
	// to `to`, utilization is u.
	segments := []struct {
		to int
		u  float64
	}{
		{200, 1},    // saturated: rest -28 → 0 at 28 s → 120 at 148 s, then held at 1
		{260, 0.75}, // dead zone: holds
		{500, 0},    // idle: falls one a second, to rest at 408
		{540, 0.9},  // half speed up: from -28, 0 at 556 (past the row's end)
		{560, 0.35}, // half speed down
	}
	want := map[int]float64{ // second → amount × 120
		0: -28, 1: -27, 27: -1, 28: 0, 29: 1, 30: 2, 68: 40, 88: 60, 128: 100, 148: 120, 149: 120, 200: 120,
		201: 120, 260: 120,
		261: 119, 320: 60, 380: 0, 381: -1, 408: -28, 409: -28, 500: -28,
		501: -27.5, 540: -8,
		541: -8.5, 560: -18,
	}
	w.Update(at(0)) // starts the clock
	if got := w.Stats().ShedAmount * 120; math.Abs(got-want[0]) > 1e-9 {
		t.Fatalf("at rest: amount %v/120, want %v/120", got, want[0])
	}
	sec := 0
	for _, seg := range segments {
		for ; sec < seg.to; sec++ {
			u.set(seg.u)
			w.Update(at(sec + 1))
			s, ok := want[sec+1]
			if !ok {
				continue
			}
			if got := w.Stats().ShedAmount * 120; math.Abs(got-s) > 1e-9 {
				t.Errorf("t=%ds (u=%v): amount %v/120, want %v/120", sec+1, seg.u, got, s)
			}
			for c, p := range chances(s / 120) {
				if got := w.Stats().DropChance[c]; math.Abs(got-p) > 1e-9 {
					t.Errorf("t=%ds (u=%v): %v drop chance %v, want %v", sec+1, seg.u, c, got, p)
				}
			}
		}
	}
	if len(want) == 0 || sec != 560 {
		t.Fatalf("table walked to %d s", sec)
	}
}

// TestWorkerShedsLeastImportantFirst pins the spread over classes at the
// instants each class starts and finishes being shed.
func TestWorkerShedsLeastImportantFirst(t *testing.T) {
	w, u := newWorker(t, shed.WorkerOptions{})
	u.set(1)
	w.Update(at(0))
	sec := 0
	for _, tc := range []struct {
		sec                   int
		test, read, write, cr float64
	}{
		{28, 0, 0, 0, 0},     // 28 s of bad utilization: not yet
		{29, 0.025, 0, 0, 0}, // test mode first
		{68, 1, 0, 0, 0},     // 40 s later all test mode, no read yet
		{78, 1, 0.25, 0, 0},  // reads next
		{108, 1, 1, 0, 0},    // all reads, no write yet
		{118, 1, 1, 0.25, 0}, // writes last
		{148, 1, 1, 1, 0},    // 120 s after shedding started: everything shed-able
		{1000, 1, 1, 1, 0},   // critical never
	} {
		for ; sec < tc.sec; sec++ {
			w.Update(at(sec + 1))
		}
		for c, p := range map[shed.Class]float64{shed.TestMode: tc.test, shed.Read: tc.read, shed.Write: tc.write, shed.Critical: tc.cr} {
			if got := w.Stats().DropChance[c]; math.Abs(got-p) > 1e-9 {
				t.Errorf("t=%ds: %v drop chance %v, want %v", tc.sec, c, got, p)
			}
		}
	}
}

// TestWorkerTickAccounting: the first tick only starts the clock, one tick
// accounts for at most Delay (a stalled ticker cannot jump the amount), and
// a clock stepping back accounts for nothing.
func TestWorkerTickAccounting(t *testing.T) {
	w, u := newWorker(t, shed.WorkerOptions{})
	u.set(1)
	w.Update(at(1000)) // however late the first tick comes
	if got := w.Stats().ShedAmount * 120; math.Abs(got+28) > 1e-9 {
		t.Fatalf("after the first tick: %v/120, want -28/120", got)
	}
	w.Update(at(1100)) // 100 s gap: counts 28
	if got := w.Stats().ShedAmount * 120; math.Abs(got) > 1e-9 {
		t.Fatalf("after a 100 s gap: %v/120, want 0", got)
	}
	w.Update(at(900)) // back in time: nothing
	if got := w.Stats().ShedAmount * 120; math.Abs(got) > 1e-9 {
		t.Fatalf("after the clock stepped back: %v/120, want 0", got)
	}
	w.Update(at(910)) // from the new instant on
	if got := w.Stats().ShedAmount * 120; math.Abs(got-10) > 1e-9 {
		t.Fatalf("10 s after the step back: %v/120, want 10/120", got)
	}
	u.set(math.NaN()) // no sample: hold
	w.Update(at(920))
	if got := w.Stats().ShedAmount * 120; math.Abs(got-10) > 1e-9 {
		t.Fatalf("after a NaN sample: %v/120, want 10/120", got)
	}
	u.set(7) // beyond 1 counts as 1
	w.Update(at(921))
	if got := w.Stats().ShedAmount * 120; math.Abs(got-11) > 1e-9 {
		t.Fatalf("after a sample of 7: %v/120, want 11/120", got)
	}
	u.set(-3) // below 0 counts as 0
	w.Update(at(922))
	if got := w.Stats().ShedAmount * 120; math.Abs(got-10) > 1e-9 {
		t.Fatalf("after a sample of -3: %v/120, want 10/120", got)
	}
}

// TestWorkerDropRates draws at a fixed seed and checks each class's drop
// rate against its chance within five standard deviations, and that chances
// of 0 and 1 are exact.
func TestWorkerDropRates(t *testing.T) {
	for _, sec := range []int{88, 124} { // amount 60/120 and 96/120
		r := rand.New(rand.NewPCG(13, uint64(sec)))
		w, u := newWorker(t, shed.WorkerOptions{Random: r.Uint64})
		u.set(1)
		w.Update(at(0))
		for s := 1; s <= sec; s++ {
			w.Update(at(s))
		}
		const n = 200_000
		for c, p := range chances(float64(sec-28) / 120) {
			dropped := 0
			for range n {
				if !w.Admit(c) {
					dropped++
				} else {
					w.Done()
				}
			}
			rate := float64(dropped) / n
			switch p {
			case 0, 1:
				if rate != p {
					t.Errorf("amount %d/120: %v dropped %v of requests, want exactly %v", sec-28, c, rate, p)
				}
			default:
				if sigma := math.Sqrt(p * (1 - p) / n); math.Abs(rate-p) > 5*sigma {
					t.Errorf("amount %d/120: %v dropped %v of requests, want %v ± %v", sec-28, c, rate, p, 5*sigma)
				}
			}
		}
		if w.Stats().InFlight != 0 {
			t.Errorf("in flight after every Done: %d", w.Stats().InFlight)
		}
	}
}

// TestWorkerDefaultUtilization: by default utilization is the admitted
// requests in flight over Workers.
func TestWorkerDefaultUtilization(t *testing.T) {
	w, _ := newWorker(t, shed.WorkerOptions{Workers: 4})
	for range 4 {
		if !w.Admit(shed.Read) {
			t.Fatal("at rest, a read was shed")
		}
	}
	w.Update(at(0))
	for s := 1; s <= 29; s++ {
		w.Update(at(s))
	}
	if got := w.Stats().ShedAmount * 120; math.Abs(got-1) > 1e-9 {
		t.Fatalf("after 29 s of 4 in flight of 4: %v/120, want 1/120", got)
	}
	for range 2 {
		w.Done()
	}
	w.Update(at(30)) // 2 of 4: 0.5/0.7 - 1 = -2/7
	if got, want := w.Stats().ShedAmount*120, 1-2.0/7; math.Abs(got-want) > 1e-9 {
		t.Fatalf("after 1 s of 2 in flight of 4: %v/120, want %v/120", got, want)
	}
	if w.Stats().InFlight != 2 {
		t.Fatalf("in flight: %d, want 2", w.Stats().InFlight)
	}
}

func TestWorkerInvalidClassShedAsWrite(t *testing.T) {
	w, u := newWorker(t, shed.WorkerOptions{})
	u.set(1)
	w.Update(at(0))
	for s := 1; s <= 148; s++ {
		w.Update(at(s))
	}
	if w.Stats().DropChance[shed.Write] != 1 || w.Admit(shed.Class(9)) {
		t.Fatal("an invalid class was not shed as Write")
	}
}

func TestNewWorkerErrors(t *testing.T) {
	src := func() float64 { return 0 }
	for _, tc := range []struct {
		name string
		o    *shed.WorkerOptions
		want string
	}{
		{"nil", nil, "needs Workers"},
		{"no source", &shed.WorkerOptions{}, "needs Workers"},
		{"negative workers", &shed.WorkerOptions{Workers: -1}, "Workers must be >= 0"},
		{"good below 0", &shed.WorkerOptions{Workers: 1, GoodBelow: -0.1}, "GoodBelow must be in [0, 1)"},
		{"good 1", &shed.WorkerOptions{Workers: 1, GoodBelow: 1}, "GoodBelow must be in [0, 1)"},
		{"good NaN", &shed.WorkerOptions{Workers: 1, GoodBelow: math.NaN()}, "GoodBelow must be in [0, 1)"},
		{"bad 1", &shed.WorkerOptions{Utilization: src, BadFrom: 1}, "BadFrom must be in [0, 1)"},
		{"bad NaN", &shed.WorkerOptions{Utilization: src, BadFrom: math.NaN()}, "BadFrom must be in [0, 1)"},
		{"good above bad", &shed.WorkerOptions{Utilization: src, GoodBelow: 0.9}, "GoodBelow (0.9) must not exceed BadFrom (0.8)"},
		{"negative delay", &shed.WorkerOptions{Utilization: src, Delay: -time.Second}, "Delay must be >= 0"},
		{"negative ramp", &shed.WorkerOptions{Utilization: src, Ramp: -time.Second}, "Ramp must be >= 0"},
		{"negative interval", &shed.WorkerOptions{Utilization: src, Interval: -time.Second}, "Interval must be >= 0"},
		{"interval above delay", &shed.WorkerOptions{Utilization: src, Interval: 30 * time.Second}, "Interval (30s) must not exceed Delay (28s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := shed.NewWorker(tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "shed: ") {
				t.Fatalf("NewWorker: %v, %v; want an error containing %q", w, err, tc.want)
			}
		})
	}
}

// TestNilWorker: a nil Worker sheds nothing and panics nowhere.
func TestNilWorker(t *testing.T) {
	var w *shed.Worker
	w.Update(t0)
	w.Done()
	if !w.Admit(shed.TestMode) || w.Stats().InFlight != 0 || w.Stats().ShedAmount != 0 || w.Stats().DropChance[shed.Read] != 0 {
		t.Fatal("a nil Worker did something")
	}
	if err := w.Run(context.Background()); err == nil {
		t.Fatal("Run on a nil Worker: no error")
	}
}

// TestWorkerRun: Run ticks at the instants Clock gives until its context
// ends, and a second Run is refused.
func TestWorkerRun(t *testing.T) {
	var ticks atomic.Int64
	clock := func() time.Time { return at(int(ticks.Add(1))) }
	w, u := newWorker(t, shed.WorkerOptions{Interval: time.Millisecond, Clock: clock})
	u.set(1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	deadline := time.After(time.Minute)
	for w.Stats().ShedAmount < 0 { // 29 ticks of the fake clock, 1 s each
		select {
		case err := <-done:
			t.Fatalf("Run returned early: %v", err)
		case <-deadline:
			t.Fatalf("after a minute of 1 ms ticks: amount %v, %d clock reads", w.Stats().ShedAmount, ticks.Load())
		case <-time.After(time.Millisecond):
		}
	}
	if err := w.Run(ctx); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Errorf("second Run: %v", err)
	}
	cancel()
	if err := <-done; err != context.Canceled {
		t.Fatalf("Run returned %v, want context.Canceled", err)
	}
}

// TestWorkerConcurrent runs Admit and Done from several goroutines while
// ticks move the controller, for the race detector, and checks that every
// admitted request was counted out again.
func TestWorkerConcurrent(t *testing.T) {
	w, u := newWorker(t, shed.WorkerOptions{})
	u.set(1)
	done := make(chan struct{})
	var admitted, dropped atomic.Int64
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				if w.Admit(shed.Class(1 + (g+i)%3)) {
					admitted.Add(1)
					w.Done()
				} else {
					dropped.Add(1)
				}
			}
		}()
	}
	// Requests run before, during and after the ticks: wait until some
	// were admitted at rest, and some dropped at the end.
	for admitted.Load() < 100 {
		runtime.Gosched()
	}
	for s := 0; s <= 148; s++ {
		w.Update(at(s))
	}
	for dropped.Load() < 100 {
		runtime.Gosched()
	}
	close(done)
	wg.Wait()
	if w.Stats().InFlight != 0 || w.Stats().ShedAmount != 1 {
		t.Fatalf("in flight %d, amount %v; want 0 and 1", w.Stats().InFlight, w.Stats().ShedAmount)
	}
}
