package shadow

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

// TestMain proves that every test's Close stopped its workers.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	t0  = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	pol = throttler.Policy{Name: "api", Limit: 3, Window: time.Minute}
)

// hooked wraps a Backend; before runs ahead of every call and may block, fail or panic. It records
// every call it receives, in order.
type hooked struct {
	throttler.Backend
	before func(ctx context.Context, op throttler.Op, key string) error

	mu    sync.Mutex
	calls []Result // throttler.Op, Key, Policy, Cost, Now of each call received
}

// inProcess is a hooked backend that declares itself in process, so that a worker calls it itself
// and waits for its answer.
type inProcess struct{ *hooked }

func (inProcess) Traits() throttler.Traits { return throttler.Traits{InProcess: true} }

func (h *hooked) enter(ctx context.Context, op throttler.Op, key string, p throttler.Policy, cost int64, now time.Time) error {
	h.mu.Lock()
	h.calls = append(h.calls, Result{Op: op, Key: key, Policy: p, Cost: cost, Now: now})
	h.mu.Unlock()
	if h.before != nil {
		return h.before(ctx, op, key)
	}
	return nil
}

func (h *hooked) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	if err := h.enter(ctx, throttler.OpTake, key, p, cost, now); err != nil {
		return throttler.Decision{}, err
	}
	return h.Backend.Take(ctx, key, p, cost, now)
}

func (h *hooked) Peek(ctx context.Context, key string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	if err := h.enter(ctx, throttler.OpPeek, key, p, 1, now); err != nil {
		return throttler.Decision{}, err
	}
	return h.Backend.Peek(ctx, key, p, now)
}

func (h *hooked) Refund(ctx context.Context, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
	if err := h.enter(ctx, throttler.OpRefund, key, p, cost, now); err != nil {
		return throttler.Decision{}, err
	}
	return h.Backend.Refund(ctx, key, p, cost, receipt, now)
}

func (h *hooked) received() []Result {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Result(nil), h.calls...)
}

// mem returns a default memory backend.
func mem(t testing.TB) *memory.Backend {
	t.Helper()
	b, err := memory.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// newShadow is New for arguments the test knows are valid, closed when the test ends.
func newShadow(t *testing.T, control, candidate throttler.Backend, o *Options) *Backend {
	t.Helper()
	s, err := New(control, candidate, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestNewErrors(t *testing.T) {
	var nilMem *memory.Backend
	tests := []struct {
		name               string
		control, candidate throttler.Backend
		opts               *Options
		want               string
	}{
		{"nil control", nil, mem(t), nil, "shadow: control backend is nil"},
		{"nil candidate", mem(t), nil, nil, "shadow: candidate backend is nil"},
		{"typed nil control", nilMem, mem(t), nil, "shadow: control backend is a nil *memory.Backend"},
		{"typed nil candidate", mem(t), nilMem, nil, "shadow: candidate backend is a nil *memory.Backend"},
		{"negative Workers", mem(t), mem(t), &Options{Workers: -1}, "shadow: Options.Workers is -1; want 0 (default 8) or more"},
		{"negative QueueSize", mem(t), mem(t), &Options{QueueSize: -5}, "shadow: Options.QueueSize is -5; want 0 (default 1024) or more"},
		{"negative Timeout", mem(t), mem(t), &Options{Timeout: -time.Millisecond}, "shadow: Options.Timeout is -1ms; want 0 (default 100ms) or more"},
		{"Timeout in nanoseconds", mem(t), mem(t), &Options{Timeout: 100}, "shadow: Options.Timeout is 100ns; want 0 (default 100ms) or at least 1ms: no store answers sooner"},
		{"negative DrainTimeout", mem(t), mem(t), &Options{DrainTimeout: -time.Second}, "shadow: Options.DrainTimeout is -1s; want 0 (default 1s) or more"},
		{"negative UsedTolerance", mem(t), mem(t), &Options{UsedTolerance: -1}, "shadow: Options.UsedTolerance is -1; want 0 (default 0, exact) or more"},
		{"negative ResetAtTolerance", mem(t), mem(t), &Options{ResetAtTolerance: -time.Microsecond}, "shadow: Options.ResetAtTolerance is -1µs; want 0 (default 1ms) or more"},
		{"negative ReorderSpan", mem(t), mem(t), &Options{ReorderSpan: -time.Millisecond}, "shadow: Options.ReorderSpan is -1ms; want 0 (default 0, nothing reordered) or more"},
		{"negative ReorderUnits", mem(t), mem(t), &Options{ReorderUnits: -2}, "shadow: Options.ReorderUnits is -2; want 0 (default 0) or more"},
		{"negative KeepMismatches", mem(t), mem(t), &Options{KeepMismatches: -100}, "shadow: Options.KeepMismatches is -100; want 0 (default 100) or more"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(tt.control, tt.candidate, tt.opts)
			if s != nil || err == nil || err.Error() != tt.want {
				if s != nil {
					s.Close()
				}
				t.Fatalf("New = %v, %v; want error %q", s, err, tt.want)
			}
		})
	}
	s := newShadow(t, mem(t), mem(t), &Options{})
	o := s.opts
	if o.Workers != 8 || o.QueueSize != 1024 || o.Timeout != 100*time.Millisecond || o.DrainTimeout != time.Second ||
		o.UsedTolerance != 0 || o.ResetAtTolerance != time.Millisecond || o.KeepMismatches != 100 {
		t.Errorf("zero Options became %+v, want the defaults", o)
	}
}

func flush(t *testing.T, s *Backend) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
}

// A shadow must answer exactly as its control would alone, whatever the candidate does.
func TestReturnsControlAnswer(t *testing.T) {
	errStore := errors.New("store down")
	cases := []struct {
		name   string
		before func(ctx context.Context, op throttler.Op, key string) error
		// timesOut: after a timeout, the calls queued with the one that timed out are
		// dropped, not sent.
		timesOut bool
	}{
		{"candidate agrees", nil, false},
		{"candidate fails", func(context.Context, throttler.Op, string) error { return errStore }, false},
		{"candidate panics", func(context.Context, throttler.Op, string) error { panic("boom") }, false},
		{"candidate hangs until its deadline", func(ctx context.Context, _ throttler.Op, _ string) error { <-ctx.Done(); return ctx.Err() }, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			alone := mem(t)
			candidate := &hooked{Backend: mem(t), before: tc.before}
			timeout := time.Minute // a loaded machine can starve a worker for longer than a short one
			if tc.timesOut {
				timeout = 20 * time.Millisecond
			}
			s := newShadow(t, mem(t), candidate, &Options{Timeout: timeout})
			var receipt time.Time // the latest admitted Take's ResetAt
			for i := range 6 {
				now := t0.Add(time.Duration(i) * 10 * time.Second)
				type op func(throttler.Backend) (throttler.Decision, error)
				ops := []op{
					func(b throttler.Backend) (throttler.Decision, error) { return b.Take(ctx, "k", pol, 1, now) },
					func(b throttler.Backend) (throttler.Decision, error) { return b.Peek(ctx, "k", pol, now) },
					func(b throttler.Backend) (throttler.Decision, error) { return b.Refund(ctx, "k", pol, 1, receipt, now) },
				}
				f := ops[i%3]
				want, wantErr := f(alone)
				if i%3 == 0 && want.Allowed {
					receipt = want.ResetAt
				}
				got, err := f(s)
				if got != want || !errors.Is(err, wantErr) {
					t.Fatalf("call %d: got %+v, %v; want %+v, %v", i, got, err, want, wantErr)
				}
			}
			flush(t, s)
			n, st := len(candidate.received()), s.Stats()
			if tc.timesOut && (n == 0 || uint64(n) != st.ByKind[CandidateError] || st.Results != 6) {
				t.Errorf("candidate received %d calls, %d timed out, %d results; want at least one, all timed out, and 6", n, st.ByKind[CandidateError], st.Results)
			}
			if !tc.timesOut && n != 6 {
				t.Errorf("candidate received %d calls, want 6", n)
			}
		})
	}
}

// The candidate gets the very call the control got.
func TestMirrorsTheSameCall(t *testing.T) {
	ctx := context.Background()
	control := &hooked{Backend: mem(t)}
	candidate := &hooked{Backend: mem(t)}
	// One worker, so that calls for different keys keep their order too.
	s := newShadow(t, control, candidate, &Options{Workers: 1})
	p2 := throttler.Policy{Name: "other", Limit: 10, Window: time.Second}
	_, _ = s.Take(ctx, "a", pol, 2, t0)
	_, _ = s.Peek(ctx, "b b", p2, t0.Add(time.Millisecond))
	_, _ = s.Refund(ctx, "a", pol, 1, t0.Add(pol.Window), t0.Add(2*time.Millisecond))
	flush(t, s)
	got, want := candidate.received(), control.received()
	if len(got) != 3 || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("candidate received\n%v\nwant\n%v", got, want)
	}
}

// Bad input is the control's to reject (the shadow does not validate), and is never mirrored: there
// is nothing to compare.
func TestBadInputIsNotMirrored(t *testing.T) {
	ctx := context.Background()
	control := &hooked{Backend: mem(t)}
	candidate := &hooked{Backend: mem(t)}
	s := newShadow(t, control, candidate, nil)
	cases := []struct {
		name string
		call func() error
		want error
	}{
		{"empty key", func() error { _, err := s.Take(ctx, "", pol, 1, t0); return err }, throttler.ErrInvalidKey},
		{"zero cost", func() error { _, err := s.Take(ctx, "k", pol, 0, t0); return err }, throttler.ErrInvalidCost},
		{"negative refund", func() error { _, err := s.Refund(ctx, "k", pol, -1, t0.Add(pol.Window), t0); return err }, throttler.ErrInvalidCost},
		{"zero limit", func() error { _, err := s.Peek(ctx, "k", throttler.Policy{Window: time.Second}, t0); return err }, throttler.ErrInvalidPolicy},
		{"cost above limit", func() error { _, err := s.Take(ctx, "k", pol, pol.Limit+1, t0); return err }, throttler.ErrInvalidCost},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	flush(t, s)
	if n, m := len(control.received()), len(candidate.received()); n != len(cases) || m != 0 {
		t.Errorf("control got %d calls, candidate %d; want %d and none", n, m, len(cases))
	}
	if st := s.Stats(); st.Results != 0 {
		t.Errorf("Results = %d, want 0", st.Results)
	}
}

func dec(allowed bool, used int64, reset time.Time) throttler.Decision {
	return throttler.Decision{Allowed: allowed, Limit: 10, Used: used, Remaining: 10 - used, ResetAt: reset}
}

func TestCompare(t *testing.T) {
	r := t0.Add(time.Minute)
	cases := []struct {
		name      string
		control   throttler.Decision
		candidate throttler.Decision
		usedTol   int64
		resetTol  time.Duration
		want      Kind
	}{
		{"identical", dec(true, 3, r), dec(true, 3, r), 0, time.Millisecond, 0},
		{"allowed and used differ", dec(true, 10, r), dec(false, 9, r), 0, time.Millisecond, AllowedDiffers | UsedDiffers},
		{"used off by one, exact", dec(true, 3, r), dec(true, 4, r), 0, time.Millisecond, UsedDiffers},
		{"used off by one, tolerated", dec(true, 3, r), dec(true, 4, r), 1, time.Millisecond, 0},
		{"used off by two, tolerance one", dec(true, 3, r), dec(true, 5, r), 1, time.Millisecond, UsedDiffers},
		{"remaining differs alone", dec(true, 3, r), throttler.Decision{Allowed: true, Limit: 10, Used: 3, Remaining: 5, ResetAt: r}, 0, time.Millisecond, UsedDiffers},
		{"reset within tolerance", dec(true, 3, r), dec(true, 3, r.Add(time.Millisecond)), 0, time.Millisecond, 0},
		{"reset later than tolerance", dec(true, 3, r), dec(true, 3, r.Add(2*time.Millisecond)), 0, time.Millisecond, ResetAtDiffers},
		{"reset earlier than tolerance", dec(true, 3, r), dec(true, 3, r.Add(-time.Second)), 0, 500 * time.Millisecond, ResetAtDiffers},
		{"fresh window on the candidate", dec(false, 10, r), dec(true, 1, r.Add(30*time.Second)), 0, time.Millisecond, AllowedDiffers | UsedDiffers | ResetAtDiffers},
		// A token bucket: both deny with the same count and reset, but one would send the
		// client back later.
		{"both deny, retry-after differs", retry(dec(false, 10, r), time.Second), retry(dec(false, 10, r), 3*time.Second), 0, time.Millisecond, RetryAfterDiffers},
		{"both deny, retry-after within tolerance", retry(dec(false, 10, r), time.Second), retry(dec(false, 10, r), time.Second+time.Millisecond), 0, time.Millisecond, 0},
		{"allowed differs: its retry-after says nothing more", dec(true, 9, r), retry(dec(false, 9, r), time.Second), 0, time.Millisecond, AllowedDiffers},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := compare(tc.control, tc.candidate, tc.usedTol, tc.resetTol); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// retry returns d with RetryAfter set to after.
func retry(d throttler.Decision, after time.Duration) throttler.Decision {
	d.RetryAfter = after
	return d
}

func TestKindString(t *testing.T) {
	cases := []struct {
		k    Kind
		want string
	}{
		{0, "match"},
		{AllowedDiffers, "allowed"},
		{AllowedDiffers | ResetAtDiffers, "allowed|reset_at"},
		{CandidateError | Dropped, "candidate_error|dropped"},
		{UsedDiffers | RetryAfterDiffers, "used|retry_after"},
		{UsedDiffers | Reordered, "used|reordered"},
		{UsedDiffers | Late, "used|late"},
		{Kind(1 << 9), "kind(512)"},
	}
	for _, tc := range cases {
		if got := tc.k.String(); got != tc.want {
			t.Errorf("%09b: got %q, want %q", uint16(tc.k), got, tc.want)
		}
	}
}

// skewed is a candidate that disagrees in a chosen way: it opens its windows late (an evicted
// window reopened) or counts extra units.
type skewed struct {
	throttler.Backend
	extra int64
}

func (s skewed) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	return s.Backend.Take(ctx, key, p, cost+s.extra, now)
}

// Each kind of outcome is classified, counted, published and kept.
func TestResults(t *testing.T) {
	errStore := errors.New("store down")
	ctx := context.Background()
	cases := []struct {
		name      string
		control   throttler.Backend
		candidate throttler.Backend
		opts      Options
		wantKinds Kind
		wantErr   error
		// timeout: CandidateErr matches context.DeadlineExceeded, and no other error does.
		timeout  bool
		compared bool
		mismatch bool
		ignored  bool
		// ignorePanics is the Stats.IgnorePanics expected.
		ignorePanics uint64
	}{
		{name: "match", control: mem(t), candidate: mem(t)},
		{name: "candidate counts more", control: mem(t), candidate: skewed{mem(t), 1},
			wantKinds: UsedDiffers, compared: true, mismatch: true},
		{name: "candidate counts more, tolerated", control: mem(t), candidate: skewed{mem(t), 1},
			opts: Options{UsedTolerance: 1}},
		{name: "candidate counts more, ignored", control: mem(t), candidate: skewed{mem(t), 1},
			opts:      Options{Ignore: func(r Result) bool { return r.Kinds == UsedDiffers }},
			wantKinds: UsedDiffers, compared: true, ignored: true},
		{name: "ignore panics", control: mem(t), candidate: skewed{mem(t), 1},
			opts:      Options{Ignore: func(Result) bool { panic("bad hook") }},
			wantKinds: UsedDiffers, compared: true, mismatch: true, ignorePanics: 1},
		{name: "candidate error", control: mem(t),
			candidate: &hooked{Backend: mem(t), before: func(context.Context, throttler.Op, string) error { return errStore }},
			wantKinds: CandidateError, wantErr: errStore},
		{name: "candidate panic", control: mem(t),
			candidate: &hooked{Backend: mem(t), before: func(context.Context, throttler.Op, string) error { panic("boom") }},
			wantKinds: CandidateError, wantErr: errCandidatePanic},
		{name: "candidate timeout", control: mem(t),
			candidate: &hooked{Backend: mem(t), before: func(ctx context.Context, _ throttler.Op, _ string) error { <-ctx.Done(); return ctx.Err() }},
			opts:      Options{Timeout: 10 * time.Millisecond},
			wantKinds: CandidateError, timeout: true},
		// A store that answers its deadline with its own error (a client's "i/o timeout")
		// still reads as a timeout, and keeps its error. In process, so that the worker
		// waits for the answer rather than abandon the call.
		{name: "candidate fails at its deadline", control: mem(t),
			candidate: inProcess{&hooked{Backend: mem(t), before: func(ctx context.Context, _ throttler.Op, _ string) error { <-ctx.Done(); return errStore }}},
			opts:      Options{Timeout: 10 * time.Millisecond},
			wantKinds: CandidateError, wantErr: errStore, timeout: true},
		{name: "control error", candidate: mem(t),
			control:   &hooked{Backend: mem(t), before: func(context.Context, throttler.Op, string) error { return errStore }},
			wantKinds: ControlError},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var published []Result
			o := tc.opts
			o.Publish = func(r Result) { mu.Lock(); published = append(published, r); mu.Unlock() }
			s := newShadow(t, tc.control, tc.candidate, &o)
			if _, err := s.Take(ctx, "k", pol, 1, t0); tc.wantKinds&ControlError == 0 && err != nil {
				t.Fatalf("Take: %v", err)
			}
			flush(t, s)
			mu.Lock()
			defer mu.Unlock()
			if len(published) != 1 {
				t.Fatalf("published %d results, want 1", len(published))
			}
			r := published[0]
			if r.Kinds != tc.wantKinds || r.Ignored != tc.ignored || r.Mismatch() != tc.mismatch {
				t.Errorf("Kinds %v Ignored %v Mismatch %v; want %v %v %v", r.Kinds, r.Ignored, r.Mismatch(), tc.wantKinds, tc.ignored, tc.mismatch)
			}
			if r.compared() != (tc.wantKinds&(CandidateError|ControlError) == 0) {
				t.Errorf("compared() = %v", r.compared())
			}
			if tc.wantErr != nil && !errors.Is(r.CandidateErr, tc.wantErr) {
				t.Errorf("CandidateErr = %v, want %v", r.CandidateErr, tc.wantErr)
			}
			if errors.Is(r.CandidateErr, context.DeadlineExceeded) != tc.timeout {
				t.Errorf("CandidateErr = %v: matches context.DeadlineExceeded %v, want %v",
					r.CandidateErr, !tc.timeout, tc.timeout)
			}
			if r.Key != "k" || r.Op != throttler.OpTake || r.Cost != 1 || !r.Now.Equal(t0) || r.Policy != pol {
				t.Errorf("result describes the wrong call: %+v", r)
			}
			st := s.Stats()
			wantMismatched, wantIgnored := uint64(0), uint64(0)
			if tc.mismatch {
				wantMismatched = 1
			}
			if tc.ignored {
				wantIgnored = 1
			}
			if st.Results != 1 || st.Mismatched != wantMismatched || st.Ignored != wantIgnored || len(st.LastMismatches) != int(wantMismatched) ||
				st.IgnorePanics != tc.ignorePanics || st.PublishPanics != 0 {
				t.Errorf("Stats = %+v", st)
			}
			for _, k := range kinds {
				want := uint64(0)
				if tc.wantKinds&k != 0 && !(tc.ignored && k&differs != 0) {
					want = 1
				}
				if st.ByKind[k] != want {
					t.Errorf("ByKind[%v] = %d, want %d", k, st.ByKind[k], want)
				}
			}
		})
	}
}

func TestStatsKeepsTheLatestMismatches(t *testing.T) {
	ctx := context.Background()
	s := newShadow(t, mem(t), skewed{mem(t), 1}, &Options{KeepMismatches: 3})
	big := throttler.Policy{Name: "big", Limit: 100, Window: time.Minute}
	for i := range 5 {
		_, _ = s.Take(ctx, fmt.Sprint("k", i), big, 1, t0)
	}
	// A match in between must not enter the list.
	_, _ = s.Peek(ctx, "other", big, t0)
	flush(t, s)
	st := s.Stats()
	if st.Compared != 6 || st.Mismatched != 5 {
		t.Fatalf("Compared %d Mismatched %d, want 6 and 5", st.Compared, st.Mismatched)
	}
	if len(st.LastMismatches) != 3 {
		t.Fatalf("LastMismatches has %d, want 3", len(st.LastMismatches))
	}
	before := fmt.Sprint(st.LastMismatches)
	// The snapshot is a copy: later mismatches do not change it.
	_, _ = s.Take(ctx, "k9", big, 1, t0)
	flush(t, s)
	if fmt.Sprint(st.LastMismatches) != before {
		t.Errorf("snapshot changed")
	}
	if last := s.Stats().LastMismatches; len(last) != 3 || last[2].Key != "k9" {
		t.Errorf("latest mismatch is not last: %v", last)
	}
}

func TestStatsRingOrder(t *testing.T) {
	var g ring
	g.init(3)
	for i := range 5 {
		g.add(Result{Key: fmt.Sprint(i), Kinds: UsedDiffers})
	}
	var got []string
	for _, r := range g.appendTo(nil) {
		got = append(got, r.Key)
	}
	if fmt.Sprint(got) != "[2 3 4]" {
		t.Errorf("got %v, want [2 3 4], oldest first", got)
	}
}

// Calls for one key reach the candidate in the order the control served them, whichever worker the
// key hashes to.
func TestPerKeyOrder(t *testing.T) {
	ctx := context.Background()
	candidate := &hooked{Backend: mem(t)}
	s := newShadow(t, mem(t), candidate, &Options{Workers: 4, QueueSize: 10000, Timeout: time.Minute})
	big := throttler.Policy{Limit: 1 << 40, Window: time.Hour}
	const keys, perKey = 16, 200
	var wg sync.WaitGroup
	for k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perKey {
				_, _ = s.Take(ctx, fmt.Sprint("key", k), big, int64(i+1), t0)
			}
		}()
	}
	wg.Wait()
	flush(t, s)
	next := map[string]int64{}
	for _, c := range candidate.received() {
		next[c.Key]++
		if c.Cost != next[c.Key] {
			t.Fatalf("key %s: call with cost %d arrived as number %d", c.Key, c.Cost, next[c.Key])
		}
	}
	if st := s.Stats(); st.Compared != keys*perKey || st.Mismatched != 0 {
		t.Errorf("Compared %d Mismatched %d, want %d and 0", st.Compared, st.Mismatched, keys*perKey)
	}
}

// gate blocks the candidate's calls until released, reporting each arrival.
type gate struct {
	arrived chan string
	release chan struct{}
}

func newGate() *gate { return &gate{arrived: make(chan string, 100), release: make(chan struct{})} }

func (g *gate) before(ctx context.Context, _ throttler.Op, key string) error {
	g.arrived <- key
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// With the worker stuck, exactly QueueSize calls wait and the rest drop, on the caller's goroutine,
// without waiting; the drops are published all the same (as many as QueueSize wait for Publish; see
// TestBlockedPublishNeverHoldsCallers for more).
func TestFullQueueDrops(t *testing.T) {
	ctx := context.Background()
	g := newGate()
	var dropped atomic.Int64
	s := newShadow(t, mem(t), &hooked{Backend: mem(t), before: g.before}, &Options{
		Workers: 1, QueueSize: 4, Timeout: time.Minute,
		Publish: func(r Result) {
			if r.Kinds == Dropped {
				dropped.Add(1)
			}
		},
	})
	big := throttler.Policy{Limit: 1000, Window: time.Hour}
	_, _ = s.Take(ctx, "first", big, 1, t0)
	<-g.arrived // the worker now holds "first"
	for i := range 8 {
		if _, err := s.Take(ctx, fmt.Sprint("k", i), big, 1, t0); err != nil {
			t.Fatal(err)
		}
	}
	if st := s.Stats(); st.ByKind[Dropped] != 4 || st.Queued != 4 {
		t.Fatalf("dropped %d, queued %d; want 4 and 4", st.ByKind[Dropped], st.Queued)
	}
	// The publisher does not wait for the stuck worker.
	waitFor(t, "the drops' Publish", func() bool { return dropped.Load() == 4 })
	close(g.release)
	flush(t, s)
	if st := s.Stats(); st.Compared != 5 || st.Results != 9 || dropped.Load() != 4 || st.PublishDropped != 0 {
		t.Errorf("Compared %d Results %d, published drops %d, PublishDropped %d; want 5, 9, 4, 0",
			st.Compared, st.Results, dropped.Load(), st.PublishDropped)
	}
}

func TestEnabled(t *testing.T) {
	ctx := context.Background()
	var on atomic.Bool
	candidate := &hooked{Backend: mem(t)}
	s := newShadow(t, mem(t), candidate, &Options{Enabled: on.Load})
	_, _ = s.Take(ctx, "k", pol, 1, t0)
	on.Store(true)
	_, _ = s.Take(ctx, "k", pol, 1, t0)
	on.Store(false)
	_, _ = s.Take(ctx, "k", pol, 1, t0)
	flush(t, s)
	// Only the middle call was mirrored: the candidate counted one unit where the control
	// counted two, and that one comparison differs.
	if n := len(candidate.received()); n != 1 {
		t.Fatalf("candidate received %d calls, want 1", n)
	}
	if st := s.Stats(); st.Results != 1 || st.Mismatched != 1 {
		t.Errorf("Results %d Mismatched %d, want 1 and 1", st.Results, st.Mismatched)
	}
}

// A panicking Publish is recovered and counted, for a comparison and a drop alike, and the
// publisher carries on.
func TestPublishPanicIsCounted(t *testing.T) {
	ctx := context.Background()
	g := newGate()
	s := newShadow(t, mem(t), &hooked{Backend: mem(t), before: g.before}, &Options{
		Workers: 1, QueueSize: 1, Timeout: time.Minute,
		Publish: func(Result) { panic("bad hook") },
	})
	_, _ = s.Take(ctx, "k", pol, 1, t0)
	<-g.arrived                            // the worker holds the first call
	_, _ = s.Take(ctx, "k", pol, 1, t0)    // queued
	d, err := s.Take(ctx, "k", pol, 1, t0) // dropped
	if err != nil || !d.Allowed {
		t.Fatalf("Take with a panicking Publish = %+v, %v", d, err)
	}
	// The drop's Publish comes first, so that the outbox, two Results here, has room for both
	// comparisons whenever the publisher runs.
	waitFor(t, "the drop's Publish", func() bool { return s.Stats().PublishPanics == 1 })
	close(g.release)
	flush(t, s)
	if st := s.Stats(); st.Compared != 2 || st.ByKind[Dropped] != 1 || st.PublishPanics != 3 {
		t.Errorf("Compared %d, dropped %d, PublishPanics %d; want 2, 1, 3", st.Compared, st.ByKind[Dropped], st.PublishPanics)
	}
}

func TestFlushHonoursContext(t *testing.T) {
	g := newGate()
	s := newShadow(t, mem(t), &hooked{Backend: mem(t), before: g.before}, &Options{Workers: 2, Timeout: time.Minute})
	_, _ = s.Take(context.Background(), "k", pol, 1, t0)
	<-g.arrived
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := s.Flush(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Flush = %v, want DeadlineExceeded", err)
	}
	close(g.release)
}

// Close drains within its bound: a candidate that never answers is cancelled, what is left is
// dropped and counted, and the workers are gone (goleak checks the latter in TestMain).
func TestCloseBoundsTheDrain(t *testing.T) {
	ctx := context.Background()
	g := newGate() // never released
	s := newShadow(t, mem(t), &hooked{Backend: mem(t), before: g.before}, &Options{
		Workers: 1, QueueSize: 10, Timeout: time.Hour, DrainTimeout: 20 * time.Millisecond,
	})
	for i := range 5 {
		_, _ = s.Take(ctx, fmt.Sprint("k", i), pol, 1, t0)
	}
	<-g.arrived
	err := s.Close()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close = %v, want a drain timeout", err)
	}
	st := s.Stats()
	// k0 was cancelled in flight (a candidate error); k1..k4 were dropped.
	if st.ByKind[Dropped] != 4 || st.ByKind[CandidateError] != 1 {
		t.Errorf("dropped %d, candidate errors %d; want 4 and 1", st.ByKind[Dropped], st.ByKind[CandidateError])
	}
	// After Close the control still serves; mirroring is off and counted.
	d, err := s.Take(ctx, "late", pol, 1, t0)
	if err != nil || !d.Allowed {
		t.Errorf("Take after Close = %+v, %v", d, err)
	}
	if got := s.Stats().ByKind[Dropped]; got != 5 {
		t.Errorf("dropped after Close = %d, want 5", got)
	}
	if err := s.Flush(ctx); !errors.Is(err, errClosed) {
		t.Errorf("Flush after Close = %v, want errClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
}

func TestCloseDrainsQueuedCalls(t *testing.T) {
	ctx := context.Background()
	candidate := &hooked{Backend: mem(t)}
	s := newShadow(t, mem(t), candidate, &Options{Timeout: time.Minute})
	for i := range 100 {
		_, _ = s.Take(ctx, fmt.Sprint("k", i), pol, 1, t0)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if n := len(candidate.received()); n != 100 {
		t.Errorf("candidate received %d calls before Close returned, want 100", n)
	}
	if st := s.Stats(); st.Compared != 100 || st.Mismatched != 0 {
		t.Errorf("Compared %d Mismatched %d", st.Compared, st.Mismatched)
	}
}

// Under concurrent load on many keys, both backends agree on every call once the mirror has
// drained. Run with -race.
func TestConcurrentAgreement(t *testing.T) {
	ctx := context.Background()
	candidate := mem(t)
	s := newShadow(t, mem(t), candidate, &Options{QueueSize: 1 << 14})
	p := throttler.Policy{Name: "c", Limit: 5, Window: time.Second}
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// One goroutine per key, so the control's order is the order the calls were
			// made in.
			for i := range 20 {
				now := t0.Add(time.Duration(i) * 100 * time.Millisecond)
				_, _ = s.Take(ctx, fmt.Sprint("client", g), p, 1, now)
			}
		}()
	}
	wg.Wait()
	flush(t, s)
	st := s.Stats()
	if st.Compared != 32*20 || st.Mismatched != 0 || st.ByKind[Dropped] != 0 {
		t.Fatalf("Stats = %+v", st)
	}
	// The candidate's counts are warm: it denies exactly where the control does.
	for g := range 32 {
		d, err := candidate.Peek(ctx, fmt.Sprint("client", g), p, t0.Add(1900*time.Millisecond))
		if err != nil || d.Used != 5 {
			t.Fatalf("candidate window for client%d: %+v, %v", g, d, err)
		}
	}
}

// Queue slots are reused without being cleared, and Flush follows the worker's counts across
// batches of every size.
func TestSlotsReusedAfterFlush(t *testing.T) {
	ctx := context.Background()
	s := newShadow(t, mem(t), mem(t), &Options{Workers: 1})
	big := throttler.Policy{Limit: 1000, Window: time.Hour}
	total := 0
	for round := 1; round <= 6; round++ {
		for i := range round {
			_, _ = s.Take(ctx, fmt.Sprint("k", i), big, 1, t0)
			total++
		}
		flush(t, s)
		if st := s.Stats(); st.Compared != uint64(total) || st.Mismatched != 0 {
			t.Fatalf("round %d: compared %d, mismatched %d; want %d and 0", round, st.Compared, st.Mismatched, total)
		}
	}
}

// Every call starts with nearly its whole Timeout; a call after a timeout gets a new context, not
// the expired one.
func TestCandidateDeadline(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	left := map[string]time.Duration{}
	candidate := &hooked{Backend: mem(t), before: func(ctx context.Context, _ throttler.Op, key string) error {
		d, ok := ctx.Deadline()
		if !ok {
			return errors.New("no deadline")
		}
		mu.Lock()
		left[key] = time.Until(d)
		mu.Unlock()
		if key == "slow" {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}}
	const timeout = 200 * time.Millisecond
	s := newShadow(t, mem(t), candidate, &Options{Workers: 1, Timeout: timeout})
	for _, key := range []string{"first", "slow", "after"} {
		_, _ = s.Take(ctx, key, pol, 1, t0)
		flush(t, s)
	}
	st := s.Stats()
	if st.ByKind[CandidateError] != 1 || st.Compared != 2 {
		t.Fatalf("candidate errors %d, compared %d; want 1 and 2", st.ByKind[CandidateError], st.Compared)
	}
	mu.Lock()
	defer mu.Unlock()
	for key, l := range left {
		// 7/8 of the timeout, less a generous allowance for a busy machine.
		if l <= timeout/2 || l > timeout {
			t.Errorf("%s started with %v of its %v deadline left", key, l, timeout)
		}
	}
}

// A candidate that ignores cancellation cannot hold Close: it returns after twice DrainTimeout,
// saying so, and the control keeps serving meanwhile.
func TestCloseIsBoundedByAStuckCandidate(t *testing.T) {
	ctx := context.Background()
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	stuck := &hooked{Backend: mem(t), before: func(context.Context, throttler.Op, string) error {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release // ignores its context
		return nil
	}}
	s := newShadow(t, mem(t), stuck, &Options{Workers: 1, QueueSize: 2, DrainTimeout: 20 * time.Millisecond})
	defer func() {
		close(release) // let the stuck call end before goleak looks
		s.wg.Wait()
	}()
	for i := range 5 {
		d, err := s.Take(ctx, fmt.Sprint("k", i), pol, 1, t0)
		if err != nil || !d.Allowed {
			t.Fatalf("Take %d: %+v, %v", i, d, err)
		}
		if i == 0 {
			<-entered
		}
	}
	start := time.Now()
	err := s.Close()
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "left to finish") {
		t.Fatalf("Close = %v", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("Close took %v", el)
	}
	// The queue held 2 behind the stuck call, and 2 more found it full; the worker abandoned
	// the stuck call when Close cancelled it, and dropped the 2 queued.
	if got := s.Stats().ByKind[Dropped]; got != 4 {
		t.Errorf("dropped %d, want 4", got)
	}
}

func TestShadowInProcessFollowsTheControl(t *testing.T) {
	s := newShadow(t, mem(t), struct{ throttler.Backend }{mem(t)}, nil)
	if !s.Traits().InProcess {
		t.Error("a memory control is in process: the candidate is never on the caller's path")
	}
	s2 := newShadow(t, struct{ throttler.Backend }{mem(t)}, mem(t), nil)
	if s2.Traits().InProcess {
		t.Error("a control that may block is not in process")
	}
}

// An Op that names no operation reaches neither backend.
func TestUnknownOp(t *testing.T) {
	control, candidate := &hooked{Backend: mem(t)}, &hooked{Backend: mem(t)}
	s := newShadow(t, control, candidate, nil)
	_, err := s.do()(context.Background(), throttler.Op(0), "k", pol, 1, time.Time{}, t0)
	if !errors.Is(err, backend.ErrUnknownOp) {
		t.Fatalf("got %v, want backend.ErrUnknownOp", err)
	}
	flush(t, s)
	if n, m := len(control.received()), len(candidate.received()); n+m != 0 || s.Stats().Results != 0 {
		t.Errorf("control got %d calls, candidate %d, results %d; want none", n, m, s.Stats().Results)
	}
}

// waitFor polls cond until it holds, failing the test after a generous deadline: for what another
// goroutine does without telling the test.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within 10s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// returns runs f on its own goroutine and fails the test if it has not returned after a generous
// deadline: the proof that f does not wait on something the test holds.
func returns(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not return", what)
	}
}

// A Flush that gives up on a stuck candidate leaves nothing behind: a hundred thousand of them
// leave the queues empty, Stats unchanged and the heap as it was, and the Flush after the candidate
// recovers still works.
func TestFlushesThatGiveUpLeaveNothing(t *testing.T) {
	ctx := context.Background()
	g := newGate()
	s := newShadow(t, mem(t), &hooked{Backend: mem(t), before: g.before}, &Options{Workers: 2, Timeout: time.Hour})
	_, _ = s.Take(ctx, "k", pol, 1, t0)
	<-g.arrived // a worker holds the call until release
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const flushes = 100_000
	for range flushes {
		if err := s.Flush(cancelled); !errors.Is(err, context.Canceled) {
			t.Fatalf("Flush = %v, want Canceled", err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	// Today's queue entries were about 300 bytes each: 100,000 left behind would be 30 MB.
	// Nothing left behind is a few channels.
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 1<<20 {
		t.Errorf("the heap grew %d bytes over %d Flushes that gave up", grew, flushes)
	}
	if st := s.Stats(); st.Queued != 0 || st.Results != 0 {
		t.Errorf("Queued %d Results %d after %d Flushes; want 0 and 0", st.Queued, st.Results, flushes)
	}
	// Concurrent Flushes share what they wait on; those that give up do not disturb those that
	// wait on.
	var gaveUp, waited sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg := &waited
		fctx := ctx
		if i%2 == 0 {
			wg = &gaveUp
			var cancel context.CancelFunc
			fctx, cancel = context.WithTimeout(ctx, time.Millisecond)
			defer cancel()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.Flush(fctx)
			if i%2 == 0 && !errors.Is(err, context.DeadlineExceeded) || i%2 == 1 && err != nil {
				errs <- fmt.Errorf("Flush %d = %v", i, err)
			}
		}()
	}
	gaveUp.Wait()
	close(g.release)
	waited.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	flush(t, s)
	if st := s.Stats(); st.Results != 1 || st.Compared != 1 || st.Queued != 0 {
		t.Errorf("Results %d Compared %d Queued %d; want 1, 1, 0: a Flush is not a call", st.Results, st.Compared, st.Queued)
	}
}

// blockingPublish is a Publish that blocks until release is closed, and counts the Results it took
// in.
type blockingPublish struct {
	entered   chan struct{} // one value, at the first call
	release   chan struct{}
	once      sync.Once
	published atomic.Uint64
}

func newBlockingPublish() *blockingPublish {
	return &blockingPublish{entered: make(chan struct{}), release: make(chan struct{})}
}

func (p *blockingPublish) publish(Result) {
	p.once.Do(func() { close(p.entered) })
	<-p.release
	p.published.Add(1)
}

// A Publish that never returns holds up no caller, whether the candidate is stuck or healthy; the
// drops it cannot take are counted, and once it returns every Result is published or counted, none
// lost.
func TestBlockedPublishNeverHoldsCallers(t *testing.T) {
	ctx := context.Background()
	big := throttler.Policy{Name: "big", Limit: 1 << 20, Window: time.Hour}
	const calls = 500
	t.Run("stuck candidate", func(t *testing.T) {
		g := newGate()
		pub := newBlockingPublish()
		s := newShadow(t, mem(t), &hooked{Backend: mem(t), before: g.before}, &Options{
			Workers: 1, QueueSize: 4, Timeout: time.Hour, Publish: pub.publish,
		})
		_, _ = s.Take(ctx, "k", big, 1, t0)
		<-g.arrived // the worker holds call 1; 2 to 5 will wait in its queue
		returns(t, "callers with the candidate stuck", func() {
			for range 5 {
				_, _ = s.Take(ctx, "k", big, 1, t0)
			}
		})
		<-pub.entered // the publisher holds the drop of call 6 in Publish
		returns(t, "callers with Publish blocked", func() {
			for range calls - 6 {
				if _, err := s.Take(ctx, "k", big, 1, t0); err != nil {
					t.Error(err)
				}
			}
		})
		// 495 drops: one in Publish, QueueSize waiting for it, the rest counted.
		st := s.Stats()
		if st.ByKind[Dropped] != calls-5 || st.Queued != 4 || st.PublishDropped != calls-5-1-4 {
			t.Errorf("Dropped %d Queued %d PublishDropped %d; want %d, 4, %d", st.ByKind[Dropped], st.Queued, st.PublishDropped, calls-5, calls-5-1-4)
		}
		close(pub.release)
		close(g.release)
		flush(t, s)
		st = s.Stats()
		if st.Results != calls || st.Compared != 5 || pub.published.Load()+st.PublishDropped != calls {
			t.Errorf("Results %d Compared %d, published %d + PublishDropped %d; want %d, 5, and %d in all",
				st.Results, st.Compared, pub.published.Load(), st.PublishDropped, calls, calls)
		}
	})
	t.Run("healthy candidate", func(t *testing.T) {
		// The worker is held by Publish as by a stuck candidate: its queue fills, and the
		// callers drop and go on.
		pub := newBlockingPublish()
		s := newShadow(t, mem(t), mem(t), &Options{Workers: 1, QueueSize: 4, Publish: pub.publish})
		returns(t, "callers with Publish blocked", func() {
			for range calls {
				if _, err := s.Take(ctx, "k", big, 1, t0); err != nil {
					t.Error(err)
				}
			}
		})
		<-pub.entered
		if st := s.Stats(); st.PublishDropped == 0 {
			t.Errorf("PublishDropped 0 with Publish blocked; want the drops beyond its queue counted")
		}
		close(pub.release)
		flush(t, s)
		st := s.Stats()
		if st.Results != calls || pub.published.Load()+st.PublishDropped != calls {
			t.Errorf("Results %d, published %d + PublishDropped %d; want %d, and %d in all",
				st.Results, pub.published.Load(), st.PublishDropped, calls, calls)
		}
	})
}

// Under concurrent load with drops, every Result is published or counted in PublishDropped, and
// Flush waits for the publishing. Run with -race.
func TestEveryResultPublishedOrCounted(t *testing.T) {
	ctx := context.Background()
	var published atomic.Uint64
	s := newShadow(t, mem(t), mem(t), &Options{
		Workers: 2, QueueSize: 8,
		Publish: func(Result) { published.Add(1) },
	})
	big := throttler.Policy{Name: "big", Limit: 1 << 20, Window: time.Hour}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				_, _ = s.Take(ctx, fmt.Sprint("k", g, i%7), big, 1, t0)
			}
		}()
	}
	wg.Wait()
	flush(t, s)
	st := s.Stats()
	if st.Results != 8*500 || st.Compared+st.ByKind[Dropped] != st.Results || published.Load()+st.PublishDropped != st.Results {
		t.Errorf("Results %d = Compared %d + Dropped %d = published %d + PublishDropped %d; want all %d",
			st.Results, st.Compared, st.ByKind[Dropped], published.Load(), st.PublishDropped, 8*500)
	}
}

// A Publish that never returns cannot hold Close, on a worker or on the publisher: Close returns
// after twice DrainTimeout, saying so, and what it could not publish is counted.
func TestCloseIsBoundedByAStuckPublish(t *testing.T) {
	ctx := context.Background()
	big := throttler.Policy{Name: "big", Limit: 1 << 20, Window: time.Hour}
	t.Run("on a worker", func(t *testing.T) {
		pub := newBlockingPublish()
		s := newShadow(t, mem(t), mem(t), &Options{Workers: 1, DrainTimeout: 20 * time.Millisecond, Publish: pub.publish})
		for range 3 {
			_, _ = s.Take(ctx, "k", big, 1, t0)
		}
		<-pub.entered
		err := s.Close()
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "workers still busy") {
			t.Fatalf("Close = %v, want the worker left to finish", err)
		}
		close(pub.release)
		s.wg.Wait() // before goleak looks
		if st := s.Stats(); st.Results != 3 || pub.published.Load() != 3 || st.PublishDropped != 0 {
			t.Errorf("Results %d, published %d, PublishDropped %d; want 3, 3, 0", st.Results, pub.published.Load(), st.PublishDropped)
		}
	})
	t.Run("on the publisher", func(t *testing.T) {
		g := newGate() // honours its context: Close's cancel ends call 1
		pub := newBlockingPublish()
		s := newShadow(t, mem(t), &hooked{Backend: mem(t), before: g.before}, &Options{
			Workers: 1, QueueSize: 2, Timeout: time.Hour, DrainTimeout: 20 * time.Millisecond, Publish: pub.publish,
		})
		_, _ = s.Take(ctx, "k", big, 1, t0)
		<-g.arrived
		for range 3 { // 2 and 3 queued, 4 dropped
			_, _ = s.Take(ctx, "k", big, 1, t0)
		}
		<-pub.entered // the publisher holds drop 4
		for range 3 { // 5 and 6 wait for the publisher, 7 is counted
			_, _ = s.Take(ctx, "k", big, 1, t0)
		}
		err := s.Close()
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "Publish still running") {
			t.Fatalf("Close = %v, want Publish left to finish", err)
		}
		close(pub.release)
		s.wg.Wait()
		<-s.pub.done
		// Published: drop 4, and from the worker call 1 (cancelled) and calls 2 and 3
		// (dropped by Close). Counted: 7, then 5 and 6, which the publisher found once
		// Close had given up.
		st := s.Stats()
		if st.Results != 7 || pub.published.Load() != 4 || st.PublishDropped != 3 {
			t.Errorf("Results %d, published %d, PublishDropped %d; want 7, 4, 3", st.Results, pub.published.Load(), st.PublishDropped)
		}
		// A call after Close is served, dropped, and counted as unpublished.
		if d, err := s.Take(ctx, "k", big, 1, t0); err != nil || !d.Allowed {
			t.Errorf("Take after Close = %+v, %v", d, err)
		}
		if st := s.Stats(); st.Results != 8 || st.PublishDropped != 4 {
			t.Errorf("after Close: Results %d PublishDropped %d; want 8 and 4", st.Results, st.PublishDropped)
		}
	})
}
