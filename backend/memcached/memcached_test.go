package memcached

import (
	"context"
	"errors"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/throttlekit/throttlekit/backend/backendtest"
	"github.com/throttlekit/throttlekit/internal/algo"
	"github.com/throttlekit/throttlekit/throttler"
)

var t0 = time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)

func newTestBackend(t *testing.T) (*Backend, *fakeClient) {
	t.Helper()
	f := newFakeClient()
	return mustNew(t, f, nil), f
}

// mustNew is New for a client and options that cannot be wrong.
func mustNew(t testing.TB, c Client, opts *Options) *Backend {
	t.Helper()
	b, err := New(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSequence runs operations on one key at fixed instants and checks every
// decision field.
func TestSequence(t *testing.T) {
	p := throttler.Policy{Name: "api", Limit: 5, Window: time.Minute}
	type step struct {
		op          string // take, peek, refund
		at          time.Duration
		cost        int64
		wantAllowed bool
		wantUsed    int64
		wantReset   time.Duration // from t0
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"open, count, deny counts nothing", []step{
			{"take", 0, 2, true, 2, time.Minute},
			{"take", time.Second, 3, true, 5, time.Minute},
			{"take", 2 * time.Second, 1, false, 5, time.Minute},
			{"peek", 3 * time.Second, 1, false, 5, time.Minute},
		}},
		{"overshoot is undone", []step{
			{"take", 0, 4, true, 4, time.Minute},
			{"take", time.Second, 2, false, 4, time.Minute},
			{"take", time.Second, 1, true, 5, time.Minute},
		}},
		{"window ends at reset-at", []step{
			{"take", 0, 5, true, 5, time.Minute},
			{"take", time.Minute - time.Millisecond, 1, false, 5, time.Minute},
			{"peek", time.Minute, 1, true, 0, 2 * time.Minute},
			{"take", time.Minute, 1, true, 1, 2 * time.Minute},
			{"take", time.Minute + 30*time.Second, 1, true, 2, 2 * time.Minute},
		}},
		{"refund never below zero", []step{
			{"take", 0, 2, true, 2, time.Minute},
			{"refund", time.Second, 1, true, 1, time.Minute},
			{"refund", time.Second, 5, true, 0, time.Minute},
			{"take", 2 * time.Second, 5, true, 5, time.Minute},
		}},
		{"refund with no window opens nothing", []step{
			{"refund", 0, 3, true, 0, time.Minute},
			{"take", 10 * time.Second, 1, true, 1, 10*time.Second + time.Minute},
		}},
		{"refund above the limit clamps", []step{
			{"take", 0, 5, true, 5, time.Minute},
			{"refund", time.Second, MaxLimit, true, 0, time.Minute},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, _ := newTestBackend(t)
			ctx := context.Background()
			receipt := t0.Add(p.Window) // the latest admitted Take's ResetAt
			for i, s := range tt.steps {
				now := t0.Add(s.at)
				var d throttler.Decision
				var err error
				switch s.op {
				case "take":
					if d, err = b.Take(ctx, "user-1", p, s.cost, now); err == nil && d.Allowed {
						receipt = d.ResetAt
					}
				case "peek":
					d, err = b.Peek(ctx, "user-1", p, now)
				case "refund":
					d, err = b.Refund(ctx, "user-1", p, s.cost, receipt, now)
				}
				if err != nil {
					t.Fatalf("step %d (%s): %v", i, s.op, err)
				}
				want := algo.WindowState(p, s.wantUsed, t0.Add(s.wantReset), now, s.wantAllowed)
				if d != want {
					t.Errorf("step %d (%s at +%v cost %d):\n got %+v\nwant %+v", i, s.op, s.at, s.cost, d, want)
				}
			}
		})
	}
}

// TestRoundTrips pins the number of server calls of each path, with the
// head cache (the default) and without. Once a pair's window is known, the
// head is read together with that window's counter ("getm", one round
// trip), at most once per CacheFor.
func TestRoundTrips(t *testing.T) {
	p := throttler.Policy{Limit: 2, Window: time.Minute}
	ctx := context.Background()
	type want = map[string]int
	tests := []struct {
		name             string
		do               func(b *Backend) error
		cached, uncached want
	}{
		{"open", func(b *Backend) error { _, err := b.Take(ctx, "k", p, 1, t0); return err },
			want{"get": 1, "add": 2}, want{"get": 1, "add": 2}},
		{"count", func(b *Backend) error { _, err := b.Take(ctx, "k", p, 1, t0); return err },
			want{"incr": 1}, want{"getm": 1, "incr": 1}},
		{"deny", func(b *Backend) error { _, err := b.Take(ctx, "k", p, 1, t0); return err },
			want{"incr": 1, "decr": 1}, want{"get": 1, "incr": 1, "decr": 1}},
		{"peek", func(b *Backend) error { _, err := b.Peek(ctx, "k", p, t0); return err },
			want{"get": 1}, want{"get": 2}},
		{"refund", func(b *Backend) error { _, err := b.Refund(ctx, "k", p, 1, t0.Add(p.Window), t0); return err },
			want{"decr": 1}, want{"get": 1, "decr": 1}},
		{"count after CacheFor", func(b *Backend) error { _, err := b.Take(ctx, "k", p, 1, t0.Add(time.Second)); return err },
			want{"getm": 1, "incr": 1}, want{"getm": 1, "incr": 1}},
		{"count within CacheFor of the last read", func(b *Backend) error {
			_, err := b.Take(ctx, "k", p, 1, t0.Add(1999*time.Millisecond))
			return err
		}, want{"incr": 1, "decr": 1}, want{"get": 1, "incr": 1, "decr": 1}},
		{"reopen", func(b *Backend) error { _, err := b.Take(ctx, "k", p, 1, t0.Add(time.Hour)); return err },
			want{"getm": 1, "cas": 1, "add": 1}, want{"getm": 1, "cas": 1, "add": 1}},
	}
	for _, noCache := range []bool{false, true} {
		f := newFakeClient()
		b := mustNew(t, f, &Options{NoCache: noCache})
		for _, tt := range tests {
			f.callCounts()
			if err := tt.do(b); err != nil {
				t.Fatalf("%s: %v", tt.name, err)
			}
			want := tt.cached
			if noCache {
				want = tt.uncached
			}
			if got := f.callCounts(); !maps.Equal(got, want) {
				t.Errorf("NoCache %v, %s: calls %v, want %v", noCache, tt.name, got, want)
			}
		}
	}
}

// TestCacheStaleness: a process whose clock is behind counts in the window
// that another process (whose clock is ahead, by less than CacheFor)
// already opened, with the cache as without it: the contract's answer (the
// stored window is open at its now), which Redis gives too. Trusting the
// cache up to the reset-at counted it in the window the other process had
// ended. A vanished counter makes it read the head.
func TestCacheStaleness(t *testing.T) {
	p := throttler.Policy{Limit: 10, Window: time.Minute}
	ctx := context.Background()
	for _, noCache := range []bool{false, true} {
		f := newFakeClient()
		a := mustNew(t, f, &Options{NoCache: noCache})
		other := mustNew(t, f, &Options{NoCache: true})
		end := t0.Add(time.Minute)
		if _, err := a.Take(ctx, "k", p, 3, t0); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Take(ctx, "k", p, 1, end.Add(-500*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		// The other process, 10ms ahead, sees the window ended and opens the next.
		if _, err := other.Take(ctx, "k", p, 1, end); err != nil {
			t.Fatal(err)
		}
		d, err := a.Take(ctx, "k", p, 1, end.Add(-10*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		wantUsed, wantReset := int64(2), end.Add(time.Minute)
		if d.Used != wantUsed || !d.ResetAt.Equal(wantReset) {
			t.Errorf("NoCache %v: Used %d ResetAt %v, want %d %v", noCache, d.Used, d.ResetAt, wantUsed, wantReset)
		}
	}

	// Everything lost (a restarted server): the cached window's counter is
	// missing, so the head is read and a window opens.
	f := newFakeClient()
	b := mustNew(t, f, nil)
	if _, err := b.Take(ctx, "k", p, 5, t0); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	clear(f.items)
	f.mu.Unlock()
	f.callCounts()
	d, err := b.Take(ctx, "k", p, 1, t0.Add(100*time.Millisecond))
	if err != nil || d.Used != 1 || !d.ResetAt.Equal(t0.Add(100*time.Millisecond+time.Minute)) {
		t.Errorf("after restart: %+v, %v; want a window opened now", d, err)
	}
	if got, want := f.callCounts(), map[string]int{"incr": 1, "get": 1, "add": 2}; !maps.Equal(got, want) {
		t.Errorf("calls %v, want %v", got, want)
	}
}

func TestHeadCacheBounded(t *testing.T) {
	c := newHeadCache(4, 1000, 1000)
	for i := range 100 {
		c.put(strconv.Itoa(i), 5000, 0, false)
	}
	c.mu.Lock()
	n := len(c.cur) + len(c.prev)
	c.mu.Unlock()
	if n > 4 {
		t.Errorf("%d entries, want at most 4", n)
	}
	if _, ok := c.get("99"); !ok {
		t.Error("the latest entry was dropped")
	}
	if _, ok := c.get("0"); ok {
		t.Error("the oldest entry was kept")
	}
	h, _ := c.get("99")
	for _, tt := range []struct {
		now  int64
		want bool
	}{{-1000, false}, {-999, true}, {999, true}, {1000, false}, {4999, false}} {
		if got := c.trusted(h, tt.now); got != tt.want {
			t.Errorf("trusted at %d: %v, want %v", tt.now, got, tt.want)
		}
	}
	if c.trusted(cachedHead{resetAt: 5000, readAt: 4500}, 5000) {
		t.Error("trusted at reset-at")
	}
	if newHeadCache(4, 0, 1000).trusted(cachedHead{resetAt: 5000, readAt: 10}, 10) {
		t.Error("a ttl of 0 (NoCache) trusted an entry")
	}
	// The counter is fetched with the head at most once per fetchEvery,
	// and again when the window changes.
	c.put("f", 5000, 100, true)
	c.put("f", 5000, 200, false)
	h, _ = c.get("f")
	for _, tt := range []struct {
		now  int64
		want bool
	}{{100, false}, {1099, false}, {1100, true}, {-900, true}} {
		if got := c.needsFetch(h, tt.now); got != tt.want {
			t.Errorf("needsFetch at %d: %v, want %v", tt.now, got, tt.want)
		}
	}
	c.put("f", 6000, 300, false)
	if h, _ = c.get("f"); !c.needsFetch(h, 300) {
		t.Error("a new window's counter was taken as fetched")
	}
}

func TestExptime(t *testing.T) {
	const day = 24 * time.Hour
	tests := []struct {
		left time.Duration // reset-at - now
		want int32
	}{
		{time.Millisecond, 3},
		{time.Second, 3},
		{time.Minute, 62},
		{time.Minute + time.Millisecond, 63},
		{30*day - 2*time.Second, maxRelativeExptime},
		{30*day - 2*time.Second + time.Millisecond, 0},
		{365 * day, 0},
		{290 * 365 * day, 0}, // near the largest Duration
		{0, 2},
		{-time.Hour, 1},
	}
	for _, tt := range tests {
		got := exptime(t0.Add(tt.left).UnixMilli(), t0, defaultExpiryMargin)
		if got != tt.want {
			t.Errorf("exptime(now+%v) = %d, want %d", tt.left, got, tt.want)
		}
	}
}

// TestItemsExpireAfterResetAt checks the exptimes actually stored, with an
// application clock far from the server's: relative, from reset-at - now.
func TestItemsExpireAfterResetAt(t *testing.T) {
	b, f := newTestBackend(t)
	ctx := context.Background()
	for _, tt := range []struct {
		window time.Duration
		want   int32
	}{
		{time.Second, 3},
		{time.Hour, 3602},
		{29 * 24 * time.Hour, 29*24*3600 + 2},
		{31 * 24 * time.Hour, 0},
	} {
		p := throttler.Policy{Name: "w" + tt.window.String(), Limit: 3, Window: tt.window}
		d, err := b.Take(ctx, "k", p, 1, t0)
		if err != nil {
			t.Fatal(err)
		}
		k := newItemKeys(b.opts.Prefix, p, "k")
		for _, key := range []string{k.head(), k.counter(d.ResetAt.UnixMilli())} {
			if got := f.exptimeOf(key); got != tt.want {
				t.Errorf("window %v: %s exptime %d, want %d", tt.window, key, got, tt.want)
			}
		}
		// Counting keeps the exptime set when the window opened.
		if _, err := b.Take(ctx, "k", p, 1, t0.Add(tt.window/2)); err != nil {
			t.Fatal(err)
		}
		if got := f.exptimeOf(k.head()); got != tt.want {
			t.Errorf("window %v: head exptime changed to %d", tt.window, got)
		}
	}
}

// TestExpiryMargin: Options.ExpiryMargin sets how long every item outlives
// the end of what it holds, on every algorithm.
func TestExpiryMargin(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		margin time.Duration
		want   int32 // a window of 1s ending 1s after now
	}{
		{0, 3},
		{time.Second, 2},
		{6 * time.Second, 7},
		{6*time.Second + time.Millisecond, 8},
	} {
		f := newFakeClient()
		b := mustNew(t, f, &Options{ExpiryMargin: tt.margin})
		for _, alg := range []throttler.Algorithm{throttler.FixedWindow, throttler.SlidingLog} {
			p := throttler.Policy{Name: "m", Limit: 3, Window: time.Second, Algorithm: alg}
			if _, err := b.Take(ctx, "k", p, 1, t0); err != nil {
				t.Fatal(err)
			}
			k := newItemKeys(b.opts.Prefix, p, "k")
			items := []string{k.state()}
			if alg == throttler.FixedWindow {
				items = []string{k.head(), k.counter(t0.Add(time.Second).UnixMilli())}
			}
			for _, key := range items {
				if got := f.exptimeOf(key); got != tt.want {
					t.Errorf("ExpiryMargin %v, %v: %s exptime %d, want %d", tt.margin, alg, key, got, tt.want)
				}
			}
		}
	}
}

func TestResetAtIsStoredMilliseconds(t *testing.T) {
	b, _ := newTestBackend(t)
	p := throttler.Policy{Limit: 10, Window: time.Second}
	loc := time.FixedZone("X", 3600)
	now := t0.Add(1234567 * time.Nanosecond).In(loc) // sub-millisecond now
	d1, err := b.Take(context.Background(), "k", p, 1, now)
	if err != nil {
		t.Fatal(err)
	}
	want := time.UnixMilli(now.Add(time.Second).UnixMilli()).In(loc)
	if !d1.ResetAt.Equal(want) || d1.ResetAt.Location() != loc {
		t.Errorf("ResetAt %v, want %v", d1.ResetAt, want)
	}
	d2, err := b.Peek(context.Background(), "k", p, now.Add(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if d2.ResetAt != d1.ResetAt {
		t.Errorf("ResetAt moved: %v then %v", d1.ResetAt, d2.ResetAt)
	}
}

// TestPolicyAndKeyAreSeparate checks that distinct (policy, key) pairs count
// separately, including pairs whose plain concatenations look alike.
func TestPolicyAndKeyAreSeparate(t *testing.T) {
	b, _ := newTestBackend(t)
	ctx := context.Background()
	pairs := []struct{ name, key string }{
		{"a", "b:c"}, {"a:b", "c"}, {"", "a:b:c"}, {"a", "b c"}, {"a", "b\x00c"},
		{"a", strings.Repeat("x", 300)}, {"a", strings.Repeat("x", 301)},
	}
	for i, pr := range pairs {
		p := throttler.Policy{Name: pr.name, Limit: 100, Window: time.Minute}
		d, err := b.Take(ctx, pr.key, p, int64(i+1), t0)
		if err != nil {
			t.Fatalf("%q/%q: %v", pr.name, pr.key, err)
		}
		if d.Used != int64(i+1) {
			t.Errorf("%q/%q: Used %d, want %d (shares an item)", pr.name, pr.key, d.Used, i+1)
		}
	}
}

// TestSpuriousDenialIsRetried interleaves a concurrent overshoot between a
// Take's incr and decr: the Take must still get the units that fit.
func TestSpuriousDenialIsRetried(t *testing.T) {
	p := throttler.Policy{Limit: 10, Window: time.Minute}
	ctx := context.Background()
	b, f := newTestBackend(t)
	if _, err := b.Take(ctx, "k", p, 5, t0); err != nil {
		t.Fatal(err)
	}
	counter := newItemKeys(b.opts.Prefix, p, "k").counter(t0.Add(time.Minute).UnixMilli())
	// Another Take of 6 is in flight: its incr lands before ours, so ours
	// overshoots; its decr lands before ours, so our undo finds room and
	// the Take tries again.
	var incrs, decrs int
	f.setBefore(func(op, key string) error {
		switch {
		case op == "incr" && key == counter && incrs == 0:
			incrs++
			_, err := f.Increment(counter, 6) // recursion: incrs is already 1
			return err
		case op == "decr" && key == counter && decrs == 0:
			decrs++
			f.setBefore(nil)
			_, err := f.Decrement(counter, 6)
			return err
		}
		return nil
	})
	d, err := b.Take(ctx, "k", p, 5, t0.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed || d.Used != 10 {
		t.Errorf("got %+v, want admitted with Used 10", d)
	}
	if v, _ := f.value(counter); strings.TrimSpace(v) != "10" {
		t.Errorf("counter %q, want 10", v)
	}
}

// TestPersistentOvershootDenies keeps a concurrent overshoot pending for the
// whole Take: it is denied after MaxAttempts, counting nothing.
func TestPersistentOvershootDenies(t *testing.T) {
	p := throttler.Policy{Limit: 10, Window: time.Minute}
	ctx := context.Background()
	f := newFakeClient()
	b := mustNew(t, f, &Options{MaxAttempts: 3})
	if _, err := b.Take(ctx, "k", p, 5, t0); err != nil {
		t.Fatal(err)
	}
	counter := newItemKeys(b.opts.Prefix, p, "k").counter(t0.Add(time.Minute).UnixMilli())
	f.set(counter, "11") // 5 counted + 6 of a Take between its incr and decr
	f.callCounts()
	d, err := b.Take(ctx, "k", p, 5, t0)
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed {
		t.Errorf("admitted %+v", d)
	}
	if v, _ := f.value(counter); strings.TrimSpace(v) != "11" {
		t.Errorf("counter %q, want 11: a denied Take counted", v)
	}
	// One decr undoes "11"+5=16 to 11; 11+5 > 10, so no retry.
	if c := f.callCounts(); c["incr"] != 1 || c["decr"] != 1 {
		t.Errorf("calls %v, want one incr and one decr", c)
	}

	// Now the pending overshoot leaves exactly while each incr happens, and
	// comes back before each decr: every attempt looks spurious.
	f.set(counter, "5")
	f.setBefore(func(op, key string) error {
		if key == counter && op == "incr" {
			f.mu.Lock()
			f.items[counter].value = []byte("11")
			f.mu.Unlock()
		}
		if key == counter && op == "decr" {
			f.mu.Lock()
			f.items[counter].value = []byte("10")
			f.mu.Unlock()
		}
		return nil
	})
	d, err = b.Take(ctx, "k", p, 5, t0)
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.Used != 5 {
		t.Errorf("got %+v, want denied with Used 5", d)
	}
	if c := f.callCounts(); c["incr"] != 4 || c["decr"] != 4 {
		t.Errorf("calls %v, want 1+MaxAttempts incr and decr", c)
	}
}

// TestUndoRunsAfterCancel cancels the context between incr and decr: the
// overshoot must still be undone.
func TestUndoRunsAfterCancel(t *testing.T) {
	p := throttler.Policy{Limit: 3, Window: time.Minute}
	b, f := newTestBackend(t)
	if _, err := b.Take(context.Background(), "k", p, 3, t0); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.setBefore(func(op, key string) error {
		if op == "incr" {
			cancel()
		}
		return nil
	})
	d, err := b.Take(ctx, "k", p, 2, t0)
	if err != nil || d.Allowed || d.Used != 3 {
		t.Fatalf("got %+v, %v; want denied with Used 3", d, err)
	}
	f.setBefore(nil)
	d, err = b.Peek(context.Background(), "k", p, t0)
	if err != nil || d.Used != 3 {
		t.Errorf("after cancel: %+v, %v; want Used 3", d, err)
	}
}

func TestContextCheckedBeforeEachCall(t *testing.T) {
	p := throttler.Policy{Limit: 3, Window: time.Minute}
	b, f := newTestBackend(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for name, op := range map[string]func() error{
		"take":   func() error { _, err := b.Take(ctx, "k", p, 1, t0); return err },
		"peek":   func() error { _, err := b.Peek(ctx, "k", p, t0); return err },
		"refund": func() error { _, err := b.Refund(ctx, "k", p, 1, t0.Add(p.Window), t0); return err },
	} {
		if err := op(); !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), "memcached: ") {
			t.Errorf("%s: err %v, want memcached: … context.Canceled", name, err)
		}
	}
	if c := f.callCounts(); len(c) != 0 {
		t.Errorf("calls made with a done context: %v", c)
	}
	// Cancelled between the head and the counter: the second call is not made.
	ctx, cancel = context.WithCancel(context.Background())
	f.setBefore(func(op, key string) error {
		cancel()
		return nil
	})
	if _, err := b.Take(ctx, "k", p, 1, t0); !errors.Is(err, context.Canceled) {
		t.Errorf("take: err %v, want context.Canceled", err)
	}
	if c := f.callCounts(); c["get"] != 1 || len(c) != 1 {
		t.Errorf("calls %v, want only the get", c)
	}
}

// TestContention makes every attempt to open a window lose.
func TestContention(t *testing.T) {
	p := throttler.Policy{Limit: 3, Window: time.Minute}
	f := newFakeClient()
	b := mustNew(t, f, &Options{MaxAttempts: 4})
	for _, op := range []string{"add", "cas"} {
		t.Run(op, func(t *testing.T) {
			if op == "cas" {
				// An ended window, so opening needs cas.
				f.setBefore(nil)
				if _, err := b.Take(context.Background(), "k", p, 1, t0.Add(-time.Hour)); err != nil {
					t.Fatal(err)
				}
			}
			f.setBefore(func(o, key string) error {
				if o == op {
					return map[string]error{"add": memcache.ErrNotStored, "cas": memcache.ErrCASConflict}[op]
				}
				return nil
			})
			f.callCounts()
			_, err := b.Take(context.Background(), "k", p, 1, t0)
			if !errors.Is(err, ErrContention) {
				t.Fatalf("err %v, want ErrContention", err)
			}
			if c := f.callCounts(); c["get"]+c["getm"] != 4 || c[op] != 4 {
				t.Errorf("calls %v, want 4 gets and 4 %s", c, op)
			}
		})
	}
}

// TestEvictedCounter: a live head whose counter is gone counts afresh, the
// documented effect of eviction.
func TestEvictedCounter(t *testing.T) {
	p := throttler.Policy{Limit: 3, Window: time.Minute}
	b, f := newTestBackend(t)
	ctx := context.Background()
	if _, err := b.Take(ctx, "k", p, 3, t0); err != nil {
		t.Fatal(err)
	}
	k := newItemKeys(b.opts.Prefix, p, "k")
	f.evict(k.counter(t0.Add(time.Minute).UnixMilli()))
	d, err := b.Take(ctx, "k", p, 1, t0.Add(time.Second))
	if err != nil || !d.Allowed || d.Used != 1 || !d.ResetAt.Equal(t0.Add(time.Minute)) {
		t.Errorf("got %+v, %v; want a fresh count in the same window", d, err)
	}
	f.evict(k.head())
	d, err = b.Take(ctx, "k", p, 1, t0.Add(2*time.Second))
	if err != nil || !d.Allowed || d.Used != 1 || !d.ResetAt.Equal(t0.Add(2*time.Second+time.Minute)) {
		t.Errorf("got %+v, %v; want a fresh window", d, err)
	}
}

func TestServerErrors(t *testing.T) {
	p := throttler.Policy{Name: "api", Limit: 3, Window: time.Minute}
	boom := errors.New("connection reset")
	for _, failOp := range []string{"get", "add", "cas", "incr", "decr"} {
		t.Run(failOp, func(t *testing.T) {
			b, f := newTestBackend(t)
			ctx := context.Background()
			// State that makes each command happen: an ended window (cas),
			// then a full one (incr, decr).
			if failOp == "cas" {
				if _, err := b.Take(ctx, "k", p, 1, t0.Add(-time.Hour)); err != nil {
					t.Fatal(err)
				}
			}
			if failOp == "incr" || failOp == "decr" {
				if _, err := b.Take(ctx, "k", p, 3, t0); err != nil {
					t.Fatal(err)
				}
			}
			f.setBefore(func(op, key string) error {
				if op == failOp {
					return boom
				}
				return nil
			})
			_, err := b.Take(ctx, "k", p, 1, t0)
			if !errors.Is(err, boom) || !strings.HasPrefix(err.Error(), "memcached: ") {
				t.Errorf("err %v, want memcached: … %v", err, boom)
			}
		})
	}
}

func TestBadItems(t *testing.T) {
	p := throttler.Policy{Limit: 3, Window: time.Minute}
	ctx := context.Background()
	b, f := newTestBackend(t)
	k := newItemKeys(b.opts.Prefix, p, "k")
	resetMs := t0.Add(time.Minute).UnixMilli()
	live := strconv.FormatInt(resetMs, 10)
	errServer := errors.New("any error")
	tests := []struct {
		name      string
		head, cnt string
		want      map[string]error // by op; errServer: any error will do
	}{
		{"head not a number", "soon", "", map[string]error{"take": ErrBadItem, "peek": ErrBadItem, "refund": ErrBadItem}},
		{"head empty", "", "", map[string]error{"take": ErrBadItem, "peek": ErrBadItem, "refund": ErrBadItem}},
		// incr and decr refuse a non-number themselves.
		{"counter not a number", live, "many", map[string]error{"take": errServer, "peek": ErrBadItem, "refund": errServer}},
		// incr wraps it (caught as a wrap), decr leaves it above int64.
		{"counter above int64", live, "18446744073709551615", map[string]error{"take": ErrBadItem, "peek": ErrBadItem, "refund": ErrBadItem}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ops := map[string]func() error{
				"take":   func() error { _, err := b.Take(ctx, "k", p, 1, t0); return err },
				"peek":   func() error { _, err := b.Peek(ctx, "k", p, t0); return err },
				"refund": func() error { _, err := b.Refund(ctx, "k", p, 1, t0.Add(p.Window), t0); return err },
			}
			for name, op := range ops {
				f.set(k.head(), tt.head)
				f.evict(k.counter(resetMs))
				if tt.cnt != "" {
					f.set(k.counter(resetMs), tt.cnt)
				}
				err := op()
				switch want := tt.want[name]; {
				case err == nil:
					t.Errorf("%s: no error", name)
				case want != errServer && !errors.Is(err, want):
					t.Errorf("%s: err %v, want %v", name, err, want)
				case !strings.HasPrefix(err.Error(), "memcached: "):
					t.Errorf("%s: err %q lacks the package prefix", name, err)
				}
			}
		})
	}
	// A client that answers neither an item nor an error.
	nilClient := &nilItemClient{fakeClient: newFakeClient()}
	if _, err := mustNew(t, nilClient, nil).Peek(ctx, "k", p, t0); !errors.Is(err, ErrBadItem) {
		t.Errorf("nil item: err %v, want ErrBadItem", err)
	}
}

type nilItemClient struct{ *fakeClient }

func (nilItemClient) Get(string) (*memcache.Item, error) { return nil, nil }

func TestInvalidInput(t *testing.T) {
	b, f := newTestBackend(t)
	ctx := context.Background()
	ok := throttler.Policy{Limit: 3, Window: time.Minute}
	tests := []struct {
		name     string
		key      string
		p        throttler.Policy
		cost     int64
		want     error
		takeOnly bool // a Refund of that cost is fine
	}{
		{"empty key", "", ok, 1, throttler.ErrInvalidKey, false},
		{"zero limit", "k", throttler.Policy{Window: time.Second}, 1, throttler.ErrInvalidPolicy, false},
		{"limit above MaxLimit", "k", throttler.Policy{Limit: MaxLimit + 1, Window: time.Second}, 1, throttler.ErrInvalidPolicy, false},
		{"zero cost", "k", ok, 0, throttler.ErrInvalidCost, false},
		{"cost above MaxLimit", "k", ok, MaxLimit + 1, throttler.ErrInvalidCost, false},
		// Never admissible: an input error, not a denial.
		{"take above the limit", "k", ok, ok.Limit + 1, throttler.ErrInvalidCost, true},
	}
	for _, tt := range tests {
		if _, err := b.Take(ctx, tt.key, tt.p, tt.cost, t0); !errors.Is(err, tt.want) {
			t.Errorf("%s: take err %v, want %v", tt.name, err, tt.want)
		}
		if tt.takeOnly {
			continue
		}
		if _, err := b.Refund(ctx, tt.key, tt.p, tt.cost, t0.Add(time.Second), t0); !errors.Is(err, tt.want) {
			t.Errorf("%s: refund err %v, want %v", tt.name, err, tt.want)
		}
		if tt.want != throttler.ErrInvalidCost {
			if _, err := b.Peek(ctx, tt.key, tt.p, t0); !errors.Is(err, tt.want) {
				t.Errorf("%s: peek err %v, want %v", tt.name, err, tt.want)
			}
		}
	}
	if c := f.callCounts(); len(c) != 0 {
		t.Errorf("bad input reached the server: %v", c)
	}
	if _, err := b.Take(ctx, "k", throttler.Policy{Limit: MaxLimit, Window: time.Second}, MaxLimit, t0); err != nil {
		t.Errorf("MaxLimit: %v", err)
	}
}

func TestConstructionErrors(t *testing.T) {
	var nilClient *memcache.Client // a typed nil: an unassigned variable
	tests := []struct {
		name string
		c    Client
		opts *Options
		want string // a fragment naming the bad field
	}{
		{"nil client", nil, nil, "memcached: the Client is nil"},
		{"typed-nil client", nilClient, nil, "memcached: the Client is a nil *memcache.Client"},
		{"prefix with space", newFakeClient(), &Options{Prefix: "my app:"}, `memcached: Options.Prefix "my app:" must be printable ASCII without spaces`},
		{"prefix with a control byte", newFakeClient(), &Options{Prefix: "a\n"}, "memcached: Options.Prefix"},
		{"prefix not ASCII", newFakeClient(), &Options{Prefix: "ünï:"}, "memcached: Options.Prefix"},
		{"prefix too long", newFakeClient(), &Options{Prefix: strings.Repeat("p", MaxPrefixLen+1)}, "memcached: Options.Prefix is 65 bytes, at most 64 allowed"},
		{"negative MaxAttempts", newFakeClient(), &Options{MaxAttempts: -1}, "memcached: Options.MaxAttempts must be >= 0 (0: the default, 8), got -1"},
		{"negative CacheFor", newFakeClient(), &Options{CacheFor: -time.Second}, "memcached: Options.CacheFor must be >= 0 (0: the default, 1s), got -1s"},
		{"negative CacheSize", newFakeClient(), &Options{CacheSize: -1}, "memcached: Options.CacheSize must be >= 0 (0: the default, 65536), got -1"},
		{"negative ExpiryMargin", newFakeClient(), &Options{ExpiryMargin: -time.Second}, "memcached: Options.ExpiryMargin must be 0 (the default, 2s) or at least 1s, Memcached's granularity, got -1s"},
		{"ExpiryMargin below a second", newFakeClient(), &Options{ExpiryMargin: 999 * time.Millisecond}, "memcached: Options.ExpiryMargin must be 0 (the default, 2s) or at least 1s, Memcached's granularity, got 999ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := New(tt.c, tt.opts)
			if err == nil || b != nil {
				t.Fatalf("got %v, %v; want an error", b, err)
			}
			if !strings.Contains(err.Error(), tt.want) || strings.Count(err.Error(), "memcached:") != 1 {
				t.Errorf("err %q, want one prefix and %q", err, tt.want)
			}
		})
	}
}

func TestOptionDefaults(t *testing.T) {
	p := throttler.Policy{Limit: 3, Window: time.Minute}
	for _, tt := range []struct {
		opts *Options
		want Options
	}{
		{nil, Options{Prefix: "throttlekit:", MaxAttempts: 8, CacheFor: time.Second, CacheSize: 65536, ExpiryMargin: 2 * time.Second}},
		{&Options{}, Options{Prefix: "throttlekit:", MaxAttempts: 8, CacheFor: time.Second, CacheSize: 65536, ExpiryMargin: 2 * time.Second}},
		{&Options{Prefix: "rl:", MaxAttempts: 2, CacheFor: time.Minute, CacheSize: 10, NoCache: true, ExpiryMargin: 6 * time.Second},
			Options{Prefix: "rl:", MaxAttempts: 2, CacheFor: time.Minute, CacheSize: 10, NoCache: true, ExpiryMargin: 6 * time.Second}},
	} {
		if b := mustNew(t, newFakeClient(), tt.opts); b.opts != tt.want {
			t.Errorf("%+v: options %+v, want %+v", tt.opts, b.opts, tt.want)
		}
	}
	b := mustNew(t, newFakeClient(), &Options{Prefix: strings.Repeat("p", MaxPrefixLen)})
	if _, err := b.Take(context.Background(), strings.Repeat("k", throttler.MaxKeyLen), p, 1, t0); err != nil {
		t.Errorf("longest prefix and key: %v", err)
	}
}

// TestConcurrentTakes: many goroutines on one key, across a window
// boundary, admit exactly Limit per window with one ResetAt per window.
func TestConcurrentTakes(t *testing.T) {
	p := throttler.Policy{Limit: 50, Window: time.Minute}
	b, _ := newTestBackend(t)
	for _, now := range []time.Time{t0, t0.Add(time.Minute), t0.Add(3 * time.Minute)} {
		var admitted atomic.Int64
		var wg sync.WaitGroup
		resets := sync.Map{}
		for g := 0; g < 16; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 10; i++ {
					d, err := b.Take(context.Background(), "hot", p, 1, now)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						admitted.Add(1)
					}
					resets.Store(d.ResetAt.UnixMilli(), true)
				}
			}()
		}
		wg.Wait()
		if got := admitted.Load(); got != p.Limit {
			t.Errorf("at %v: admitted %d, want %d", now, got, p.Limit)
		}
		n := 0
		resets.Range(func(k, v any) bool { n++; return true })
		if n != 1 {
			t.Errorf("at %v: %d distinct ResetAt", now, n)
		}
	}
}

// TestConformance runs the suite on the in-process fake; the integration
// module runs it on real servers.
func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) throttler.Backend { return mustNew(t, newFakeClient(), nil) })
}

// TestHintMismatch: the counter fetched with the head belongs to the window
// this process last saw; when the head names another window it is not used.
func TestHintMismatch(t *testing.T) {
	p := throttler.Policy{Limit: 10, Window: time.Minute}
	ctx := context.Background()
	f := newFakeClient()
	a, other := mustNew(t, f, &Options{NoCache: true}), mustNew(t, f, &Options{NoCache: true})
	if _, err := a.Take(ctx, "k", p, 7, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Take(ctx, "k", p, 2, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	f.callCounts()
	d, err := a.Peek(ctx, "k", p, t0.Add(time.Hour+time.Second))
	if err != nil || d.Used != 2 || !d.ResetAt.Equal(t0.Add(time.Hour+time.Minute)) {
		t.Errorf("got %+v, %v; want the new window's count, 2", d, err)
	}
	if got, want := f.callCounts(), map[string]int{"getm": 1, "get": 1}; !maps.Equal(got, want) {
		t.Errorf("calls %v, want %v", got, want)
	}
}

// TestCacheNotTrustedNearReset: the cached window answers only while more
// than CacheFor of it is left; in its last CacheFor every call reads the
// head, and a window no longer than CacheFor is never cached.
func TestCacheNotTrustedNearReset(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name     string
		window   time.Duration
		at       time.Duration // after the window opened at t0
		readHead bool
	}{
		{"more than CacheFor left", time.Minute, time.Minute - time.Second - time.Millisecond, false},
		{"CacheFor left", time.Minute, time.Minute - time.Second, true},
		{"window of CacheFor", time.Second, 2 * time.Millisecond, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := throttler.Policy{Limit: 10, Window: tt.window}
			f := newFakeClient()
			b := mustNew(t, f, nil)
			// Open the window, then read the head 1 ms before the call, so
			// that the cache's age never stands in the way.
			for _, at := range []time.Duration{0, tt.at - time.Millisecond} {
				if _, err := b.Take(ctx, "k", p, 1, t0.Add(at)); err != nil {
					t.Fatal(err)
				}
			}
			f.callCounts()
			d, err := b.Take(ctx, "k", p, 1, t0.Add(tt.at))
			if err != nil || d.Used != 3 || !d.ResetAt.Equal(t0.Add(tt.window)) {
				t.Fatalf("%+v, %v; want Used 3 in the window opened at t0", d, err)
			}
			got := f.callCounts()
			if reads := got["get"] + got["getm"]; reads != map[bool]int{false: 0, true: 1}[tt.readHead] || got["incr"] != 1 {
				t.Errorf("calls %v; want the head read: %v", got, tt.readHead)
			}
		})
	}
}
