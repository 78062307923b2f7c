package memcached

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/throttlekit/throttlekit/backend/backendtest"
	"github.com/throttlekit/throttlekit/internal/algo"
	"github.com/throttlekit/throttlekit/internal/identity"
	"github.com/throttlekit/throttlekit/internal/leaseset"
	"github.com/throttlekit/throttlekit/throttler"
)

var leasePolicy = throttler.ConcurrencyPolicy{Name: "jobs", Limit: 2, TTL: time.Minute}

// leaseItem is the item key of (leasePolicy, key) under the default prefix.
func leaseItem(key string) string {
	return identityKeys("throttlekit:", identity.Lease(leasePolicy), key).leases()
}

// TestLeaseRoundTrips pins the server calls of each path: a call that
// changes the leases is gets then add or cas, one that changes nothing is
// gets alone.
func TestLeaseRoundTrips(t *testing.T) {
	ctx := context.Background()
	f := newFakeClient()
	b := mustNew(t, f, nil)
	p := leasePolicy
	acquire := func(id throttler.LeaseID, at time.Duration, allowed bool) func() error {
		return func() error {
			d, err := b.Acquire(ctx, "k", p, id, t0.Add(at))
			if err == nil && d.Allowed != allowed {
				err = fmt.Errorf("allowed %v, want %v", d.Allowed, allowed)
			}
			return err
		}
	}
	release := func(id throttler.LeaseID, at time.Duration, held bool) func() error {
		return func() error {
			got, _, err := b.Release(ctx, "k", p, id, t0.Add(at))
			if err == nil && got != held {
				err = fmt.Errorf("held %v, want %v", got, held)
			}
			return err
		}
	}
	type want = map[string]int
	checkCalls(t, f, []callStep{
		{"release, no item", release(1, 0, false), want{"get": 1}},
		{"first acquire", acquire(1, 0, true), want{"get": 1, "add": 1}},
		{"acquire", acquire(2, 0, true), want{"get": 1, "cas": 1}},
		{"denied acquire", acquire(3, time.Second, false), want{"get": 1}},
		{"refresh", acquire(2, time.Second, true), want{"get": 1, "cas": 1}},
		{"release of a lease not held", release(3, time.Second, false), want{"get": 1}},
		{"release", release(1, time.Second, true), want{"get": 1, "cas": 1}},
		{"release again", release(1, time.Second, false), want{"get": 1}},
		{"release of an expired lease drops it", release(2, time.Minute+time.Second, false), want{"get": 1, "cas": 1}},
		{"acquire on an empty item", acquire(4, 2*time.Minute, true), want{"get": 1, "cas": 1}},
	})
}

// TestLeaseContention: a cas that keeps losing is retried, up to
// MaxAttempts rounds for an Acquire and four times as many for a Release
// (a Release that gives up holds a slot for the lease's TTL), then the
// call fails with ErrContention, which is neither a server's nor the
// key's failure, and has changed nothing; losing fewer times than that
// still succeeds, once.
func TestLeaseContention(t *testing.T) {
	ctx := context.Background()
	p := leasePolicy
	for _, tt := range []struct {
		release     bool
		maxAttempts int // 0: the default, 8
		losses      int
		wantRounds  int
		wantErr     bool
	}{
		{false, 4, 0, 1, false},
		{false, 4, 3, 4, false},
		{false, 4, 4, 4, true},
		{false, 4, 100, 4, true},
		{false, 0, 7, 8, false},
		{false, 0, 8, 8, true},
		{true, 4, 0, 1, false},
		{true, 4, 3, 4, false},
		{true, 4, 4, 5, false}, // where an Acquire gives up
		{true, 4, 15, 16, false},
		{true, 4, 16, 16, true},
		{true, 4, 100, 16, true},
		{true, 0, 8, 9, false},
		{true, 0, 31, 32, false},
		{true, 0, 32, 32, true},
	} {
		t.Run(fmt.Sprintf("release %v/MaxAttempts %d/lose %d", tt.release, tt.maxAttempts, tt.losses), func(t *testing.T) {
			f := newFakeClient()
			b := mustNew(t, f, &Options{MaxAttempts: tt.maxAttempts})
			if _, err := b.Acquire(ctx, "k", p, 1, t0); err != nil { // later writes are cas
				t.Fatal(err)
			}
			before, _ := f.value(leaseItem("k"))
			var lost int
			f.setBefore(func(op, key string) error {
				if op == "cas" && lost < tt.losses {
					lost++
					return memcache.ErrCASConflict
				}
				return nil
			})
			f.callCounts()
			var ok bool
			var err error
			if tt.release {
				ok, _, err = b.Release(ctx, "k", p, 1, t0)
			} else {
				var d throttler.Decision
				d, err = b.Acquire(ctx, "k", p, 2, t0)
				ok = d.Allowed
			}
			calls := f.callCounts()
			f.setBefore(nil)
			if tt.wantErr {
				if !errors.Is(err, ErrContention) || !strings.HasPrefix(err.Error(), "memcached: ") ||
					errors.Is(err, throttler.ErrUnavailable) || errors.Is(err, throttler.ErrKeyState) {
					t.Fatalf("err %v, want only ErrContention", err)
				}
				if !strings.Contains(err.Error(), fmt.Sprintf("each of %d attempts", tt.wantRounds)) {
					t.Errorf("err %v does not name its %d attempts", err, tt.wantRounds)
				}
				if after, _ := f.value(leaseItem("k")); after != before {
					t.Errorf("the item changed to %x", after)
				}
			} else if err != nil || !ok {
				t.Fatalf("got %v, %v; want success", ok, err)
			}
			if calls["get"] != tt.wantRounds || calls["cas"] != tt.wantRounds {
				t.Errorf("calls %v, want %d gets and cas", calls, tt.wantRounds)
			}
		})
	}
	// A lost add (another process created the item first) is a lost round:
	// the next one counts the other's lease.
	f := newFakeClient()
	b := mustNew(t, f, &Options{MaxAttempts: 2})
	p1 := throttler.ConcurrencyPolicy{Name: "one", Limit: 1, TTL: time.Minute}
	other := appendLeases(nil, []leaseset.Entry{{ID: 7, Expiry: t0.Add(time.Minute).UnixMilli()}})
	ik := identityKeys(b.opts.Prefix, identity.Lease(p1), "k").leases()
	f.setBefore(func(op, key string) error {
		if op == "add" {
			f.setBefore(nil)
			f.set(key, string(other))
		}
		return nil
	})
	if d, err := b.Acquire(ctx, "k", p1, 1, t0); err != nil || d.Allowed || d.Used != 1 {
		t.Errorf("after a lost add: %+v, %v; want denied by the other's lease", d, err)
	}
	if v, _ := f.value(ik); v != string(other) {
		t.Errorf("stored %x", v)
	}
}

// TestLeaseReleaseContext: a Release's larger budget of rounds stays
// within the caller's context: cancelled after its third lost round, it
// stops there with the context's error (not ErrContention), the lease
// still held.
func TestLeaseReleaseContext(t *testing.T) {
	f := newFakeClient()
	b := mustNew(t, f, nil)
	if _, err := b.Acquire(context.Background(), "k", leasePolicy, 1, t0); err != nil {
		t.Fatal(err)
	}
	before, _ := f.value(leaseItem("k"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var lost int
	f.setBefore(func(op, key string) error {
		if op != "cas" {
			return nil
		}
		if lost++; lost == 3 {
			cancel()
		}
		return memcache.ErrCASConflict
	})
	f.callCounts()
	held, _, err := b.Release(ctx, "k", leasePolicy, 1, t0)
	calls := f.callCounts()
	f.setBefore(nil)
	if held || !errors.Is(err, context.Canceled) || errors.Is(err, ErrContention) {
		t.Errorf("got %v, %v; want the context's error", held, err)
	}
	if calls["cas"] != 3 {
		t.Errorf("calls %v, want 3 rounds", calls)
	}
	if after, _ := f.value(leaseItem("k")); after != before {
		t.Errorf("the item changed to %x", after)
	}
}

// TestBackoffLimit pins the bound of the wait before each attempt: the
// round just lost (at least contentionBackoff), doubled per attempt, at
// most maxContentionBackoff, and never negative however many attempts a
// Release or a large MaxAttempts makes (shifting by the attempt overflowed
// from the forties on, and rand.N panicked).
func TestBackoffLimit(t *testing.T) {
	for _, tt := range []struct {
		attempt int
		round   time.Duration
		want    time.Duration
	}{
		{1, 0, contentionBackoff},
		{2, 0, 2 * contentionBackoff},
		{4, 0, 8 * contentionBackoff},
		{1, 3 * time.Millisecond, 3 * time.Millisecond},
		{2, 3 * time.Millisecond, 6 * time.Millisecond},
		{3, 3 * time.Millisecond, maxContentionBackoff},
		{1, time.Hour, maxContentionBackoff},
		{31, 0, maxContentionBackoff},
		{48, 0, maxContentionBackoff},
		{64, 2 * time.Second, maxContentionBackoff},
		{1 << 20, time.Hour, maxContentionBackoff},
	} {
		if got := backoffLimit(tt.attempt, tt.round); got != tt.want {
			t.Errorf("backoffLimit(%d, %v) = %v, want %v", tt.attempt, tt.round, got, tt.want)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := backoff(ctx, 64, 2*time.Second); !errors.Is(err, context.Canceled) {
		t.Errorf("backoff at attempt 64: %v", err)
	}
}

// TestLeaseBadItems: a value that is not a lease item is ErrBadItem, the
// key's failure, for both operations, and is left alone.
func TestLeaseBadItems(t *testing.T) {
	ctx := context.Background()
	exp := t0.Add(time.Minute).UnixMilli()
	good := appendLeases(nil, []leaseset.Entry{{ID: 1, Expiry: exp}, {ID: 9, Expiry: exp + 5}})
	entry := func(id uint64, delta uint64) []byte {
		return binary.AppendUvarint(binary.BigEndian.AppendUint64(nil, id), delta)
	}
	head := func(n uint64, base int64) []byte {
		return binary.AppendVarint(binary.AppendUvarint([]byte{formatLeases}, n), base)
	}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	for _, tt := range []struct {
		name  string
		value []byte
	}{
		{"empty", nil},
		{"a fixed-window count", []byte("12")},
		{"a token bucket", appendBucket(nil, algo.TokenBucketState{Tokens: 1, At: 5, Window: 1})},
		{"a later version", append([]byte{0xE2}, good[1:]...)},
		{"truncated", good[:len(good)-1]},
		{"truncated in an ID", good[:len(good)-4]},
		{"trailing byte", append(bytes.Clone(good), 0)},
		{"trailing byte after no lease", []byte{formatLeases, 0, 0}},
		{"more leases than bytes", cat(head(3, exp), entry(1, 0), entry(2, 0))},
		{"above MaxConcurrencyLimit leases", binary.AppendUvarint([]byte{formatLeases}, throttler.MaxConcurrencyLimit+1)},
		{"zero ID", cat(head(1, exp), entry(0, 0))},
		{"repeated ID", cat(head(2, exp), entry(3, 0), entry(3, 1))},
		{"IDs not increasing", cat(head(2, exp), entry(4, 0), entry(3, 1))},
		{"base not the earliest", cat(head(2, exp), entry(3, 1), entry(4, 1))},
		{"expiry beyond int64", cat(head(2, math.MaxInt64-1), entry(3, 0), entry(4, 2))},
		{"overlong varint", append([]byte{formatLeases}, bytes.Repeat([]byte{0xff}, 11)...)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeClient()
			b := mustNew(t, f, nil)
			f.set(leaseItem("k"), string(tt.value))
			_, aErr := b.Acquire(ctx, "k", leasePolicy, 1, t0)
			_, _, rErr := b.Release(ctx, "k", leasePolicy, 1, t0)
			for op, err := range map[string]error{"acquire": aErr, "release": rErr} {
				if !errors.Is(err, ErrBadItem) || !errors.Is(err, throttler.ErrKeyState) || errors.Is(err, throttler.ErrUnavailable) ||
					!strings.HasPrefix(err.Error(), "memcached: leases of ") {
					t.Errorf("%s: err %v, want ErrBadItem", op, err)
				}
			}
			if v, _ := f.value(leaseItem("k")); v != string(tt.value) {
				t.Errorf("the item was changed to %x", v)
			}
		})
	}
}

// TestLeaseExptime: the item expires with its latest lease, plus the
// margin, rounded up to seconds; never beyond 30 days; an item emptied by
// the last Release expires seconds later.
func TestLeaseExptime(t *testing.T) {
	ctx := context.Background()
	f := newFakeClient()
	b := mustNew(t, f, nil)
	p := throttler.ConcurrencyPolicy{Name: "x", Limit: 3, TTL: 1500 * time.Millisecond}
	ik := identityKeys(b.opts.Prefix, identity.Lease(p), "k").leases()
	steps := []struct {
		name    string
		release bool
		id      throttler.LeaseID
		at      time.Duration
		ttl     time.Duration
		want    int32
	}{
		// 1.5 s + 2 s margin, rounded up.
		{"first lease", false, 1, 0, 0, 4},
		// The latest expiry is t0+2.5s: at t0+1s that is 1.5 s away.
		{"a later lease", false, 2, time.Second, 0, 4},
		// Releasing the later lease leaves t0+1.5s: 0.5 s away at t0+1s.
		{"the latest released", true, 2, time.Second, 0, 3},
		{"the last released", true, 1, time.Second, 0, 2},
		{"29 days", false, 3, time.Second, 29 * 24 * time.Hour, 29*24*3600 + 2},
		{"31 days", false, 4, time.Second, 31 * 24 * time.Hour, 0},
		// The 31-day lease is still the latest.
		{"a short lease beside it", false, 5, time.Second, time.Second, 0},
	}
	for _, s := range steps {
		q := p
		if s.ttl != 0 {
			q.TTL = s.ttl
		}
		var err error
		if s.release {
			_, _, err = b.Release(ctx, "k", q, s.id, t0.Add(s.at))
		} else {
			var d throttler.Decision
			d, err = b.Acquire(ctx, "k", q, s.id, t0.Add(s.at))
			if err == nil && !d.Allowed {
				err = fmt.Errorf("denied: %+v", d)
			}
		}
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := f.exptimeOf(ik); got != s.want {
			t.Errorf("%s: exptime %d, want %d", s.name, got, s.want)
		}
	}
}

// TestLeaseKeys: the lease item is a legal key for any policy name and
// key, of its own kind, apart from the items of a rate policy of the same
// name; a named policy keeps its item when its Limit and TTL change.
func TestLeaseKeys(t *testing.T) {
	ctx := context.Background()
	f := newFakeClient()
	b := mustNew(t, f, nil)
	rate := throttler.Policy{Name: "api", Limit: 1, Window: time.Minute, Algorithm: throttler.TokenBucket}
	if _, err := b.Take(ctx, "k", rate, 1, t0); err != nil {
		t.Fatal(err)
	}
	named := throttler.ConcurrencyPolicy{Name: "api", Limit: 1, TTL: time.Minute}
	if d, err := b.Acquire(ctx, "k", named, 1, t0); err != nil || !d.Allowed {
		t.Fatalf("acquire beside a rate limit of the same name: %+v, %v", d, err)
	}
	for _, p := range []throttler.ConcurrencyPolicy{named, throttler.Concurrent(3, time.Second)} {
		for _, key := range []string{"k", strings.Repeat("é", 200), "a b\x00c", strings.Repeat("x", 250)} {
			ik := b.leaseKeys(key, p).leases()
			if !legalKey(ik) || !strings.HasPrefix(ik, "throttlekit:l:") {
				t.Errorf("%v, %q: item key %q", p, key, ik)
			}
		}
	}
	changed := named
	changed.Limit, changed.TTL = 2, time.Hour
	if b.leaseKeys("k", changed).leases() != b.leaseKeys("k", named).leases() {
		t.Error("a named policy's item moved when its Limit and TTL changed")
	}
	if b.leaseKeys("k", throttler.Concurrent(1, time.Minute)).leases() == b.leaseKeys("k", throttler.Concurrent(1, time.Hour)).leases() {
		t.Error("two unnamed policies share an item")
	}
	f.mu.Lock()
	n := len(f.items)
	f.mu.Unlock()
	if n != 2 {
		t.Errorf("%d items, want the bucket's and the leases'", n)
	}
}

// TestLeaseInvalidInput: what ValidateLease rejects is an input error,
// before any server call.
func TestLeaseInvalidInput(t *testing.T) {
	ctx := context.Background()
	f := newFakeClient()
	b := mustNew(t, f, nil)
	for _, tt := range []struct {
		name string
		key  string
		p    throttler.ConcurrencyPolicy
		id   throttler.LeaseID
		want error
	}{
		{"empty key", "", leasePolicy, 1, throttler.ErrInvalidKey},
		{"zero limit", "k", throttler.Concurrent(0, time.Second), 1, throttler.ErrInvalidPolicy},
		{"limit too high", "k", throttler.Concurrent(throttler.MaxConcurrencyLimit+1, time.Second), 1, throttler.ErrInvalidPolicy},
		{"sub-ms TTL", "k", throttler.Concurrent(1, time.Microsecond), 1, throttler.ErrInvalidPolicy},
		{"zero ID", "k", leasePolicy, 0, throttler.ErrInvalidLease},
	} {
		f.callCounts()
		_, aErr := b.Acquire(ctx, tt.key, tt.p, tt.id, t0)
		_, _, rErr := b.Release(ctx, tt.key, tt.p, tt.id, t0)
		if !errors.Is(aErr, tt.want) || !errors.Is(rErr, tt.want) {
			t.Errorf("%s: %v, %v; want %v", tt.name, aErr, rErr, tt.want)
		}
		if calls := f.callCounts(); len(calls) != 0 {
			t.Errorf("%s: calls %v", tt.name, calls)
		}
	}
}

// TestLeaseFailuresBlameTheItemsServer: LeaseStore names the server of the
// pair's item, and a server's failure on a lease call is a StoreFailure
// naming it.
func TestLeaseFailuresBlameTheItemsServer(t *testing.T) {
	sel := twoServers(t)
	f := newFakeClient()
	b := mustNew(t, f, &Options{Selector: sel})
	client := mustNew(t, memcache.New("127.0.0.1:1", "127.0.0.1:2"), nil) // the client's own servers
	seen := map[string]bool{}
	for i := range 40 {
		key := fmt.Sprint("user-", i)
		want := "memcached " + pick(t, sel, b.leaseKeys(key, leasePolicy).leases()).String()
		if got := b.leaseStore(key, leasePolicy); got != want {
			t.Fatalf("%q: LeaseStore %q, want %q", key, got, want)
		}
		if got := client.leaseStore(key, leasePolicy); got != want {
			t.Fatalf("%q: LeaseStore of a memcache.New client %q, want %q", key, got, want)
		}
		seen[want] = true
		f.setBefore(func(op, _ string) error { return memcache.ErrServerError })
		_, err := b.Acquire(context.Background(), key, leasePolicy, 1, t0)
		f.setBefore(nil)
		if !errors.Is(err, throttler.ErrUnavailable) || blamedStore(t, err) != want {
			t.Fatalf("%q: err %v, want a failure of %s", key, err, want)
		}
	}
	if len(seen) != 2 {
		t.Errorf("servers named %v, want both", seen)
	}
	if got := mustNew(t, f, nil).leaseStore("k", leasePolicy); got != "" {
		t.Errorf("a Client whose servers cannot be seen, without a Selector: %q", got)
	}
	// A network error names the server in its address.
	f.setBefore(func(op, _ string) error {
		return &net.OpError{Op: "read", Net: "tcp", Addr: pick(t, sel, "elsewhere"), Err: &timeoutErr{}}
	})
	_, _, err := b.Release(context.Background(), "k", leasePolicy, 1, t0)
	if blamedStore(t, err) != "memcached "+pick(t, sel, "elsewhere").String() {
		t.Errorf("err %v", err)
	}
}

// TestLeaseEncoding: lease sets round trip (in ID order), and a full item
// stays far below Memcached's item limit.
func TestLeaseEncoding(t *testing.T) {
	for _, set := range [][]leaseset.Entry{
		nil,
		{{ID: 5, Expiry: -3}},
		{{ID: math.MaxUint64, Expiry: math.MaxInt64}, {ID: 1, Expiry: math.MinInt64}, {ID: 2, Expiry: 0}},
		{{ID: 9, Expiry: 100}, {ID: 3, Expiry: 100}},
	} {
		want := slices.Clone(set)
		slices.SortFunc(want, func(a, b leaseset.Entry) int { return cmp.Compare(a.ID, b.ID) })
		got, err := decodeLeases(appendLeases(nil, set))
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%v: %v, %v; want %v", set, got, err, want)
		}
	}
	full := fullLeases(t0.UnixMilli(), 24*time.Hour)
	v := appendLeases(nil, full)
	t.Logf("%d leases over a day: %d bytes", len(full), len(v))
	if len(v) > 13*throttler.MaxConcurrencyLimit {
		t.Errorf("%d leases take %d bytes", len(full), len(v))
	}
}

// fullLeases is MaxConcurrencyLimit leases with random IDs, expiring
// spread over ttl from t.
func fullLeases(t int64, ttl time.Duration) []leaseset.Entry {
	set := make([]leaseset.Entry, throttler.MaxConcurrencyLimit)
	for i := range set {
		set[i] = leaseset.Entry{ID: throttler.LeaseID(rand.Uint64() | 1), Expiry: t + 1 + int64(i)*ttl.Milliseconds()/int64(len(set))}
	}
	return set
}

// FuzzDecodeLeases: no value makes the decoder panic, and what decodes is
// a valid set that encodes to a value that decodes to the same set.
func FuzzDecodeLeases(f *testing.F) {
	f.Add(appendLeases(nil, []leaseset.Entry{{ID: 3, Expiry: 1925089445000}, {ID: 1 << 60, Expiry: 1925089446000}}))
	f.Add(appendLeases(nil, nil))
	f.Add([]byte{formatLeases, 0xff, 0xff, 0x0f})
	f.Add([]byte("1925089445000"))
	f.Fuzz(func(t *testing.T, v []byte) {
		set, err := decodeLeases(v)
		if err != nil {
			return
		}
		for i, l := range set {
			if l.ID == 0 || (i > 0 && l.ID <= set[i-1].ID) {
				t.Fatalf("IDs not increasing: %v", set)
			}
		}
		if again, err := decodeLeases(appendLeases(nil, slices.Clone(set))); err != nil || !slices.Equal(again, set) {
			t.Fatalf("%x decodes to %v, which round trips to %v, %v", v, set, again, err)
		}
	})
}

// TestFullLeasesReal: MaxConcurrencyLimit leases fit in one item of a real
// memcached (1 MB default), and are read and written back.
func TestFullLeasesReal(t *testing.T) {
	c := newRealClient(startMemcached(t))
	b := mustNew(t, c, nil)
	ctx := context.Background()
	p := throttler.ConcurrencyPolicy{Name: "full", Limit: throttler.MaxConcurrencyLimit, TTL: 24 * time.Hour}
	full := fullLeases(t0.UnixMilli(), p.TTL)
	ik := b.leaseKeys("k", p).leases()
	if err := c.Set(&memcache.Item{Key: ik, Value: appendLeases(nil, slices.Clone(full[1:]))}); err != nil {
		t.Fatal(err)
	}
	if d, err := b.Acquire(ctx, "k", p, full[0].ID, t0); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("the last slot: %+v, %v", d, err)
	}
	if d, err := b.Acquire(ctx, "k", p, 1, t0); err != nil || d.Allowed {
		t.Fatalf("when full: %+v, %v", d, err)
	}
	if held, d, err := b.Release(ctx, "k", p, full[len(full)/2].ID, t0); err != nil || !held || d.Used != p.Limit-1 {
		t.Fatalf("release: %v, %+v, %v", held, d, err)
	}
	it, err := c.Get(ik)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeLeases(it.Value)
	t.Logf("a full item: %d bytes", len(it.Value))
	if err != nil || len(got) != throttler.MaxConcurrencyLimit-1 {
		t.Fatalf("stored: %d leases, %v", len(got), err)
	}
}

// TestLeaseContentionReal: 64 goroutines acquire and release on one key of
// a real memcached, through one Backend or through 8 (as 8 processes
// would), each checking at every admitted Acquire that no more than Limit
// leases are held; lost rounds per call are logged. Through one Backend no
// call fails (its callers take turns); across 8, a call may run out of
// MaxAttempts and fail with ErrContention, having changed nothing.
func TestLeaseContentionReal(t *testing.T) {
	addr := startMemcached(t)
	for _, backends := range []int{1, 8} {
		t.Run(fmt.Sprintf("%d backends", backends), func(t *testing.T) {
			p := throttler.ConcurrencyPolicy{Name: fmt.Sprint("hot", backends), Limit: 5, TTL: time.Hour}
			var bs []*Backend
			var ccs []*casCounter
			for range backends {
				cc := &casCounter{Client: newRealClient(addr)}
				ccs = append(ccs, cc)
				bs = append(bs, mustNew(t, cc, nil))
			}
			ctx := context.Background()
			var held, admitted, denied, contended atomic.Int64
			var wg sync.WaitGroup
			for g := range 64 {
				wg.Go(func() {
					b := bs[g%backends]
					for range 10 {
						id := throttler.LeaseID(rand.Uint64() | 1)
						d, err := b.Acquire(ctx, "k", p, id, t0)
						if errors.Is(err, ErrContention) && backends > 1 {
							contended.Add(1)
							continue
						}
						if err != nil {
							t.Errorf("acquire: %v", err)
							return
						}
						if !d.Allowed {
							denied.Add(1)
							continue
						}
						admitted.Add(1)
						if h := held.Add(1); h > p.Limit || d.Used > p.Limit {
							t.Errorf("%d leases held (Used %d), Limit %d", h, d.Used, p.Limit)
						}
						held.Add(-1)
						for {
							ok, _, err := b.Release(ctx, "k", p, id, t0)
							if errors.Is(err, ErrContention) && backends > 1 {
								contended.Add(1)
								continue // the lease would otherwise hold its slot for the TTL
							}
							if err != nil || !ok {
								t.Errorf("release: %v, %v", ok, err)
							}
							break
						}
					}
				})
			}
			wg.Wait()
			var lost int64
			for _, cc := range ccs {
				lost += cc.lost.Load()
			}
			calls := 2*admitted.Load() + denied.Load()
			t.Logf("%d backends: %d admitted, %d denied, %d ErrContention, %d lost cas/add: %.2f per call", backends, admitted.Load(), denied.Load(), contended.Load(), lost, float64(lost)/float64(calls))
			if admitted.Load() == 0 || (backends == 1 && contended.Load() != 0) {
				t.Errorf("admitted %d, %d ErrContention", admitted.Load(), contended.Load())
			}
			if _, d, err := bs[0].Release(ctx, "k", p, 1, t0); err != nil || d.Used != 0 {
				t.Errorf("after: %+v, %v; want no lease held", d, err)
			}
		})
	}
}

// TestLeaseConformanceReal runs the lease suite against a real memcached,
// each backend on a client of its own, as processes would be. The suite
// counts any error as a failure, while 4 processes hammering one key can
// make a call lose the default 8 rounds (ErrContention, about once in 20
// runs of its concurrency case on 2 loaded cores; TestLeaseContention
// covers that path): the suite runs with room for more rounds.
func TestLeaseConformanceReal(t *testing.T) {
	addr := startMemcached(t)
	backendtest.RunLeases(t, func(t *testing.T) backendtest.LeaseStore {
		return mustNew(t, newRealClient(addr), &Options{MaxAttempts: 64})
	})
}

// TestLeaseConformanceFake runs the lease suite on the in-process fake, so
// that it runs where memcached is not installed.
func TestLeaseConformanceFake(t *testing.T) {
	f := newFakeClient()
	backendtest.RunLeases(t, func(t *testing.T) backendtest.LeaseStore { return mustNew(t, f, nil) })
}
