package memcached

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/throttlekit/throttlekit/throttler"
)

// undoMembers are one member of each algorithm, each the first a composite
// takes (the least Remaining), to be undone when the second denies.
var undoMembers = []throttler.Policy{
	{Name: "u-fw", Limit: 5, Window: time.Minute},
	{Name: "u-tb", Limit: 5, Window: time.Minute, Algorithm: throttler.TokenBucket},
	{Name: "u-sw", Limit: 5, Window: time.Minute, Algorithm: throttler.SlidingWindow},
	{Name: "u-sl", Limit: 5, Window: time.Minute, Algorithm: throttler.SlidingLog},
}

// second is the member a composite takes second: more to spare than any
// of undoMembers.
var second = throttler.Policy{Name: "second", Limit: 10, Window: time.Hour}

// utc is d with its ResetAt in UTC: a composite's member Decisions are in
// the local time zone.
func utc(d throttler.Decision) throttler.Decision {
	d.ResetAt = d.ResetAt.UTC()
	return d
}

// peekMember is p's Decision of key at now, its ResetAt to the ms.
func peekMember(t *testing.T, b *Backend, key string, p throttler.Policy, now time.Time) throttler.Decision {
	t.Helper()
	d, err := b.Peek(context.Background(), key, p, now)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// raceSecond arranges, through f's hook, that just before the composite's
// Take of the second member (the incr of its counter, at now), another
// process spends all that member has left; it returns the backend and
// the composite.
func raceSecond(t *testing.T, f *fakeClient, first throttler.Policy, now time.Time) (*Backend, throttler.Policy) {
	t.Helper()
	ctx := context.Background()
	b, other := mustNew(t, f, nil), mustNew(t, f, nil)
	// Both members have state: the second's window is open and cached.
	for _, p := range []throttler.Policy{first, second} {
		if _, err := b.Take(ctx, "k", p, 1, now); err != nil {
			t.Fatal(err)
		}
	}
	counter := newItemKeys(b.opts.Prefix, second, "k").counter(now.Add(second.Window).UnixMilli())
	raced := false
	f.setBefore(func(op, key string) error {
		if op == "incr" && key == counter && !raced {
			raced = true
			if d, err := other.Take(ctx, "k", second, 9, now); err != nil || !d.Allowed {
				t.Errorf("the other process's Take: %+v, %v", d, err)
			}
		}
		return nil
	})
	return b, throttler.All(first, second)
}

// A composite whose read found every member admitting, and whose second
// member then denies (another process spent in between), undoes the first
// member's Take: its state is as before, whatever its algorithm, and the
// composite is denied, answering the second member's denied Take.
func TestCompositeRaceIsUndone(t *testing.T) {
	for _, first := range undoMembers {
		t.Run(first.Algorithm.String(), func(t *testing.T) {
			f := newFakeClient()
			now := t0.Add(10 * time.Second)
			b, c := raceSecond(t, f, first, t0)
			before := peekMember(t, b, "k", first, now)
			d, err := b.Take(context.Background(), "k", c, 2, now)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				t.Fatalf("admitted %+v: the second member was spent", d)
			}
			var ms []throttler.Decision
			for _, m := range d.Members() {
				ms = append(ms, m)
			}
			want := before
			want.Allowed, want.RetryAfter = true, 0
			if utc(ms[0]) != utc(want) {
				t.Errorf("the undone member's Decision\n got %+v\nwant %+v", ms[0], want)
			}
			if ms[1].Allowed || ms[1].Used != 10 || d.Binding() != 1 {
				t.Errorf("the second member's Decision %+v (binding %d), want its denied Take's", ms[1], d.Binding())
			}
			if after := peekMember(t, b, "k", first, now); after != before {
				t.Errorf("the first member after the undo\n got %+v\nwant %+v", after, before)
			}
			if got := peekMember(t, b, "k", second, now); got.Used != 10 {
				t.Errorf("the second member counts %d, want 10 (1 + the other process's 9)", got.Used)
			}
		})
	}
}

// timeout is a read timeout from a server, a store failure.
func timeout(addr string) error {
	a, _ := net.ResolveTCPAddr("tcp", addr)
	return &net.OpError{Op: "read", Net: "tcp", Addr: a, Err: &timeoutErr{}}
}

// A failure of the second member's Take undoes the first's and is
// returned as the store failure it is; if the undo fails too, the first
// member keeps the cost counted (the documented bound) until its window
// ends, and the error says so.
func TestCompositeFailureBetweenMembers(t *testing.T) {
	first := undoMembers[0]
	for _, undoFails := range []bool{false, true} {
		t.Run(fmt.Sprint("undo fails: ", undoFails), func(t *testing.T) {
			f := newFakeClient()
			b := mustNew(t, f, nil)
			ctx := context.Background()
			c := throttler.All(first, second)
			if _, err := b.Take(ctx, "k", c, 1, t0); err != nil {
				t.Fatal(err)
			}
			before := peekMember(t, b, "k", first, t0)
			k2 := newItemKeys(b.opts.Prefix, second, "k").counter(t0.Add(second.Window).UnixMilli())
			k1 := newItemKeys(b.opts.Prefix, first, "k").counter(t0.Add(first.Window).UnixMilli())
			f.setBefore(func(op, key string) error {
				if key == k2 && op == "incr" || undoFails && key == k1 && op == "decr" {
					return timeout("127.0.0.1:2")
				}
				return nil
			})
			_, err := b.Take(ctx, "k", c, 2, t0)
			f.setBefore(nil)
			if !errors.Is(err, throttler.ErrUnavailable) {
				t.Fatalf("err %v, want a store failure", err)
			}
			after := peekMember(t, b, "k", first, t0)
			if !undoFails {
				if after != before {
					t.Errorf("the first member after the undo\n got %+v\nwant %+v", after, before)
				}
				return
			}
			if !strings.Contains(err.Error(), "the window keeps 2 units too many until it ends") {
				t.Errorf("err %q does not say what the failed undo left", err)
			}
			if after.Used != before.Used+2 {
				t.Errorf("the first member counts %d, want %d: the failed undo's 2 units", after.Used, before.Used+2)
			}
			if end := peekMember(t, b, "k", first, t0.Add(first.Window)); end.Used != 0 {
				t.Errorf("at the window's end the first member counts %d, want 0", end.Used)
			}
		})
	}
}

// The undo runs when the context ends between the members' Takes.
func TestCompositeUndoRunsAfterCancel(t *testing.T) {
	f := newFakeClient()
	b := mustNew(t, f, nil)
	c := throttler.All(undoMembers[1], second)
	if _, err := b.Take(context.Background(), "k", c, 1, t0); err != nil {
		t.Fatal(err)
	}
	before := peekMember(t, b, "k", undoMembers[1], t0)
	ctx, cancel := context.WithCancel(context.Background())
	state := newItemKeys(b.opts.Prefix, undoMembers[1], "k").state()
	f.setBefore(func(op, key string) error {
		if op == "cas" && key == state {
			cancel() // the first member's write goes through; the second's is never made
		}
		return nil
	})
	if _, err := b.Take(ctx, "k", c, 2, t0); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want the context's end", err)
	}
	f.setBefore(nil)
	if after := peekMember(t, b, "k", undoMembers[1], t0); after != before {
		t.Errorf("the first member after the undo\n got %+v\nwant %+v", after, before)
	}
}

// TestCompositeRoundTrips pins the server calls of a composite: one
// multi-key gets reads every member; a denial writes nothing; an admitted
// composite adds each member's own write (incr, or cas over the state just
// read).
func TestCompositeRoundTrips(t *testing.T) {
	ctx := context.Background()
	fw := throttler.All(throttler.PerMinute(2).Named("rt-m"), throttler.PerHour(10).Named("rt-h"))
	mix := throttler.All(throttler.PerMinute(2).Named("rt-m"), throttler.PerHour(10).WithBurst(10).Named("rt-tb"))
	type want = map[string]int
	f := newFakeClient()
	b := mustNew(t, f, nil)
	for _, tt := range []struct {
		name, key string
		p         throttler.Policy
		op        throttler.Op
		want      want
	}{
		{"opening both windows (each as its own Take)", "k", fw, throttler.OpTake, want{"getm": 1, "get": 2, "add": 4}},
		{"both windows open and cached", "k", fw, throttler.OpTake, want{"getm": 1, "incr": 2}},
		{"denied by the minute: nothing written", "k", fw, throttler.OpTake, want{"getm": 1}},
		{"a peek", "k", fw, throttler.OpPeek, want{"getm": 1}},
		{"a bucket beside the full minute: nothing written", "k", mix, throttler.OpTake, want{"getm": 1}},
		{"a window opened, a bucket added", "k2", mix, throttler.OpTake, want{"getm": 1, "get": 1, "add": 3}},
		{"an open window and the bucket's cas over the state read", "k2", mix, throttler.OpTake, want{"getm": 1, "incr": 1, "cas": 1}},
		{"a peek of both", "k2", mix, throttler.OpPeek, want{"getm": 1}},
	} {
		f.callCounts()
		if _, err := backendDo(ctx, b, tt.op, tt.key, tt.p, t0); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if got := f.callCounts(); !maps.Equal(got, tt.want) {
			t.Errorf("%s: calls %v, want %v", tt.name, got, tt.want)
		}
	}
}

// backendDo is a Take of one unit or a Peek.
func backendDo(ctx context.Context, b *Backend, op throttler.Op, key string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	if op == throttler.OpPeek {
		return b.Peek(ctx, key, p, now)
	}
	return b.Take(ctx, key, p, 1, now)
}

// A composite's Store is its first member's, and its failures are blamed on
// the server they came from.
func TestCompositeStore(t *testing.T) {
	sel := twoServers(t)
	b := mustNew(t, newFakeClient(), &Options{Selector: sel})
	a, z := throttler.PerMinute(2).Named("st-a"), throttler.PerHour(9).WithBurst(9).Named("st-b")
	for i := range 20 {
		key := fmt.Sprint("user-", i)
		if got, want := b.store(throttler.OpTake, key, throttler.All(a, z)), b.store(throttler.OpTake, key, a); got != want {
			t.Fatalf("%q: Store %q, want the first member's %q", key, got, want)
		}
		if got, want := b.store(throttler.OpPeek, key, throttler.All(z, a)), b.store(throttler.OpPeek, key, z); got != want {
			t.Fatalf("%q: Store %q, want the first member's %q", key, got, want)
		}
	}
}

// inverse undoes an admitted Take whatever happened to the state between
// the Take and the undo: the state then answers as if only what happened
// in between had.
func TestCompositeInverse(t *testing.T) {
	tb := throttler.Policy{Limit: 10, Window: time.Second, Algorithm: throttler.TokenBucket, Burst: 6}
	sw := throttler.Policy{Limit: 10, Window: time.Second, Algorithm: throttler.SlidingWindow}
	sl := throttler.Policy{Limit: 10, Window: time.Second, Algorithm: throttler.SlidingLog}
	const t1 = 1_000_000_300 // a ms 300 into its window
	type call struct {
		t, cost int64
	}
	for _, tt := range []struct {
		name    string
		p       throttler.Policy
		before  []call // admitted Takes before the one undone
		between []call // Takes between it and its undo
		peekAt  int64
	}{
		{"bucket, nothing between", tb, []call{{t1 - 100, 2}}, nil, t1},
		{"bucket, refilled between by a clock ahead", tb, []call{{t1 - 100, 2}}, []call{{t1 + 400, 1}}, t1 + 400},
		{"bucket, refilled to full between", tb, nil, []call{{t1 + 5000, 1}}, t1 + 5000},
		{"bucket, a clock behind between", tb, []call{{t1, 1}}, []call{{t1 - 50, 1}}, t1},
		{"counter, same window", sw, []call{{t1 - 200, 3}}, []call{{t1 + 10, 1}}, t1 + 10},
		{"counter, the next window opened between", sw, []call{{t1 - 200, 3}}, []call{{t1 + 800, 1}}, t1 + 900},
		{"counter, two windows on between", sw, nil, []call{{t1 + 1800, 1}}, t1 + 1900},
		{"log, the entry shared with an earlier Take of its ms", sl, []call{{t1, 2}}, []call{{t1 + 5, 1}}, t1 + 5},
		{"log, a later entry between", sl, []call{{t1 - 500, 4}}, []call{{t1 + 700, 2}}, t1 + 800},
	} {
		t.Run(tt.name, func(t *testing.T) {
			apply := func(it *memcache.Item, c call) *memcache.Item {
				d, v, _, write, err := compute(tt.p, it, throttler.OpTake, c.cost, 0, c.t)
				if err != nil || !write || !d.Allowed {
					t.Fatalf("take %+v: %+v write %v err %v", c, d, write, err)
				}
				return &memcache.Item{Value: v}
			}
			var with, without *memcache.Item
			for _, c := range tt.before {
				with, without = apply(with, c), apply(without, c)
			}
			taken, _, _, _, _ := compute(tt.p, with, throttler.OpTake, 3, 0, t1)
			with = apply(with, call{t1, 3})
			wrote := with.Value
			for _, c := range tt.between {
				with, without = apply(with, c), apply(without, c)
			}
			v, _, write, err := inverse(tt.p, with, wrote, 3, taken.ResetAt.UnixMilli(), t1)
			if err != nil {
				t.Fatal(err)
			}
			if write {
				with = &memcache.Item{Value: v}
			}
			for _, at := range []int64{tt.peekAt, tt.peekAt + 250, tt.peekAt + 999} {
				got, _, _, _, _ := compute(tt.p, with, throttler.OpPeek, 1, 0, at)
				want, _, _, _, _ := compute(tt.p, without, throttler.OpPeek, 1, 0, at)
				if got != want {
					t.Errorf("at %d after the undo\n got %+v\nwant %+v (without the Take)", at, got, want)
				}
			}
		})
	}
}

// A Throttler over the backend takes composites, and refunds one member by
// member under each member's receipt.
func TestCompositeThroughAThrottler(t *testing.T) {
	b, _ := newTestBackend(t)
	now := t0
	th, err := throttler.New(b, &throttler.Options{Clock: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if !th.SupportsComposites() {
		t.Fatal("a Throttler over the backend takes no composites")
	}
	ctx := context.Background()
	login := throttler.All(throttler.PerSecond(1).Named("login-s"), throttler.PerHour(100).WithBurst(100).Named("login-h"))
	d, err := th.AllowN(ctx, "user", login, 1)
	if err != nil || !d.Allowed {
		t.Fatalf("first login: %+v, %v", d, err)
	}
	now = now.Add(500 * time.Millisecond)
	if again, err := th.AllowN(ctx, "user", login, 1); err != nil || again.Allowed || again.RetryAfter != 500*time.Millisecond {
		t.Fatalf("second login within the second: %+v, %v; want denied, RetryAfter 500ms", again, err)
	}
	if _, err := th.Refund(ctx, "user", login, 1, d); err != nil {
		t.Fatal(err)
	}
	for _, m := range login.Members() {
		if got := peekMember(t, b, "user", m, now); got.Used != 0 {
			t.Errorf("%v after the refund: Used %d, want 0", m, got.Used)
		}
	}
}

// A member's item that does not hold what the backend stores fails a
// composite's Take and Peek with ErrBadItem, one key's failure, and the
// Take writes nothing.
func TestCompositeBadItems(t *testing.T) {
	ctx := context.Background()
	fw := throttler.PerMinute(3).Named("bi-fw")
	tb := throttler.PerHour(9).WithBurst(9).Named("bi-tb")
	c := throttler.All(fw, tb)
	resetMs := t0.Add(fw.Window).UnixMilli()
	for _, tt := range []struct {
		name    string
		corrupt func(f *fakeClient, fk, tk itemKeys)
	}{
		{"a head that is not a number", func(f *fakeClient, fk, _ itemKeys) { f.set(fk.head(), "soon") }},
		{"a counter that is not a number", func(f *fakeClient, fk, _ itemKeys) {
			f.set(fk.head(), strconv.FormatInt(resetMs, 10))
			f.set(fk.counter(resetMs), "many")
		}},
		{"a state of another format", func(f *fakeClient, _, tk itemKeys) { f.set(tk.state(), "12") }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeClient()
			b := mustNew(t, f, &Options{NoCache: true})
			tt.corrupt(f, newItemKeys(b.opts.Prefix, fw, "k"), newItemKeys(b.opts.Prefix, tb, "k"))
			f.callCounts()
			for _, op := range []throttler.Op{throttler.OpTake, throttler.OpPeek} {
				_, err := backendDo(ctx, b, op, "k", c, t0)
				if !errors.Is(err, ErrBadItem) || !errors.Is(err, throttler.ErrKeyState) {
					t.Errorf("%v: err %v, want ErrBadItem, a key's failure", op, err)
				}
			}
			if calls := f.callCounts(); calls["getm"] < 2 || len(calls) != 1 {
				t.Errorf("calls %v, want reads alone", calls)
			}
		})
	}
}

// A window cached by this process whose counter has gone (evicted) is not
// counted from memory: the member's Take reads the head again, as a single
// Take does, and the composite counts in the window the head names.
func TestCompositeVanishedCounter(t *testing.T) {
	ctx := context.Background()
	f := newFakeClient()
	b := mustNew(t, f, nil)
	fw := throttler.PerMinute(3).Named("vc-fw")
	c := throttler.All(fw, throttler.PerHour(9).Named("vc-h"))
	if _, err := b.Take(ctx, "k", c, 1, t0); err != nil {
		t.Fatal(err)
	}
	k := newItemKeys(b.opts.Prefix, fw, "k")
	f.evict(k.counter(t0.Add(fw.Window).UnixMilli()))
	d, err := b.Take(ctx, "k", c, 2, t0.Add(time.Second))
	if err != nil || !d.Allowed {
		t.Fatalf("%+v, %v", d, err)
	}
	if got := peekMember(t, b, "k", fw, t0.Add(time.Second)); got.Used != 2 || !got.ResetAt.Equal(t0.Add(fw.Window)) {
		t.Errorf("the window after its counter vanished: %+v, want 2 used in the window of the head", got)
	}
}
