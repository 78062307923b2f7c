package backendtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/backendtest/internal/model"
	"github.com/throttlekit/throttlekit/throttler"
)

// LeaseStore is a backend that holds leases beside rate limits: what
// RunLeases checks, the separation of the two included.
type LeaseStore interface {
	throttler.Backend
	throttler.LeaseBackend
}

// RunLeases runs the lease suite: the lease contract of throttler.LeaseBackend
// in hand-computed tables at fixed instants, the storage identity, bad
// input, random traces against a reference model of the contract, and
// exactness under concurrency.
//
// newBackend may be called several times in one case, and every backend it
// returns in one case must reach one store: the concurrency case acquires
// through several at once, as several processes would (a network store
// returns a backend on a client of its own each call; the memory backend
// returns one backend). Every case uses keys of its own.
func RunLeases(t *testing.T, newBackend func(t *testing.T) LeaseStore) {
	t.Helper()
	run := runID()
	cases := []struct {
		name string
		f    func(t *testing.T, newBackend func(t *testing.T) LeaseStore, key func(string) string)
	}{
		{"Sequences", testLeaseSequences},
		{"IdentityApart", testLeaseIdentity},
		{"KeysWithAnyBytes", testLeaseKeys},
		{"ManyHeld", testLeaseManyHeld},
		{"InvalidInput", testLeaseInvalidInput},
		{"ExactUnderConcurrency", testLeaseConcurrency},
		{"DifferentialTraces", testLeaseTraces},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			key := func(s string) string { return run + "/" + t.Name() + "/" + s }
			c.f(t, newBackend, key)
		})
	}
}

// leaseRow is one call at T0+at and the whole answer it must get.
type leaseRow struct {
	acquire bool // else Release
	id      throttler.LeaseID
	at      time.Duration
	p       throttler.ConcurrencyPolicy
	held    bool // what a Release reports
	allowed bool
	used    int64
	resetAt time.Duration // offset from T0
	why     string
}

func runLeaseRows(t *testing.T, b throttler.LeaseBackend, key string, rows []leaseRow) {
	t.Helper()
	ctx := context.Background()
	for i, r := range rows {
		now := T0.Add(r.at)
		var (
			d    throttler.Decision
			held bool
			err  error
		)
		op := "Release"
		if r.acquire {
			op = "Acquire"
			d, err = b.Acquire(ctx, key, r.p, r.id, now)
		} else {
			held, d, err = b.Release(ctx, key, r.p, r.id, now)
		}
		msg := fmt.Sprintf("row %d: %s of %d at +%v under %v (%s)", i, op, r.id, r.at, r.p, r.why)
		require.NoError(t, err, msg)
		want := throttler.Decision{Allowed: r.allowed, Limit: r.p.Limit, Used: r.used, Remaining: max(0, r.p.Limit-r.used),
			ResetAt: time.UnixMilli(T0.Add(r.resetAt).UnixMilli())}
		if !r.allowed {
			want.RetryAfter = want.ResetAt.Sub(time.UnixMilli(now.UnixMilli()))
		}
		d.ResetAt = time.UnixMilli(d.ResetAt.UnixMilli()) // compare instants, not locations
		require.Equal(t, want, d, msg)
		require.Equal(t, r.held, held, msg)
	}
}

func testLeaseSequences(t *testing.T, newBackend func(t *testing.T) LeaseStore, key func(string) string) {
	b := newBackend(t)
	p := throttler.ConcurrencyPolicy{Name: "cc", Limit: 2, TTL: time.Second}
	lower, higher, longer := p, p, p
	lower.Limit, higher.Limit, longer.TTL = 1, 3, 5*time.Second
	const acq, rel = true, false
	s := time.Second
	tests := []struct {
		name string
		rows []leaseRow
	}{
		{"a lease ends at now == expiry", []leaseRow{
			{acq, 1, 0, p, false, true, 1, s, "expiry now+TTL; ResetAt the earliest expiry"},
			{acq, 2, 100 * ms, p, false, true, 2, s, "two of two"},
			{acq, 3, 200 * ms, p, false, false, 2, s, "full: denied, RetryAfter until lease 1 ends"},
			{acq, 3, s - ms, p, false, false, 2, s, "the last ms of lease 1"},
			{acq, 3, s, p, false, true, 2, 1100 * ms, "lease 1 is not held at its expiry"},
			{rel, 1, s, p, false, false, 2, 1100 * ms, "so releasing it reports false, and nothing frees"},
		}},
		{"a retried acquire refreshes without counting twice", []leaseRow{
			{acq, 1, 0, p, false, true, 1, s, ""},
			{acq, 1, 300 * ms, p, false, true, 1, 1300 * ms, "counted once, expiry moved"},
			{acq, 2, 400 * ms, p, false, true, 2, 1300 * ms, ""},
			{acq, 2, 500 * ms, p, false, true, 2, 1300 * ms, "a held lease is re-admitted when full"},
			{acq, 3, 1299 * ms, p, false, false, 2, 1300 * ms, "lease 1 lives until 1300, not 1000"},
			{acq, 3, 1300 * ms, p, false, true, 2, 1500 * ms, ""},
		}},
		{"release: held, twice, unknown, expired", []leaseRow{
			{acq, 1, 0, p, false, true, 1, s, ""},
			{acq, 2, 10 * ms, p, false, true, 2, s, ""},
			{rel, 1, 20 * ms, p, true, true, 1, 1010 * ms, "held: a slot frees"},
			{rel, 1, 30 * ms, p, false, true, 1, 1010 * ms, "released twice: nothing changes"},
			{rel, 99, 40 * ms, p, false, true, 1, 1010 * ms, "never acquired"},
			{rel, 2, 1010 * ms, p, false, true, 0, 2010 * ms, "expired: not held; nothing held, ResetAt now+TTL"},
			{acq, 3, 1020 * ms, p, false, true, 1, 2020 * ms, ""},
		}},
		{"release of a full key frees one for a new ID", []leaseRow{
			{acq, 1, 0, p, false, true, 1, s, ""},
			{acq, 2, 0, p, false, true, 2, s, ""},
			{rel, 9, ms, p, false, false, 2, s, "an unknown ID frees nothing: Allowed false, RetryAfter"},
			{rel, 2, 2 * ms, p, true, true, 1, s, ""},
			{acq, 3, 3 * ms, p, false, true, 2, s, ""},
		}},
		{"a lowered or raised limit applies at once", []leaseRow{
			{acq, 1, 0, p, false, true, 1, s, ""},
			{acq, 2, 10 * ms, p, false, true, 2, s, ""},
			{acq, 3, 20 * ms, lower, false, false, 2, s, "Used 2 above Limit 1: Remaining 0"},
			{acq, 2, 30 * ms, lower, false, true, 2, s, "a held lease is still re-admitted"},
			{rel, 1, 40 * ms, lower, true, false, 1, 1030 * ms, "1 of 1 held: a new ID would be denied"},
			{acq, 3, 50 * ms, higher, false, true, 2, 1030 * ms, ""},
			{acq, 4, 60 * ms, higher, false, true, 3, 1030 * ms, "three of a raised three"},
		}},
		{"a changed TTL applies to leases acquired from then on", []leaseRow{
			{acq, 1, 0, p, false, true, 1, s, ""},
			{acq, 2, 0, longer, false, true, 2, s, "named: the same leases, the new lease until +5s"},
			{acq, 3, 2 * s, longer, false, true, 2, 5 * s, "lease 1 ended at +1s"},
			{acq, 1, 2 * s, p, false, false, 2, 5 * s, "full"},
			{acq, 3, 3 * s, p, false, true, 2, 4 * s, "a refresh under the old TTL shortens lease 3"},
		}},
		{"a clock behind sees what a later call left", []leaseRow{
			{acq, 1, 0, p, false, true, 1, s, ""},
			{acq, 2, 2 * s, p, false, true, 1, 3 * s, "lease 1 dropped at +2s"},
			{acq, 3, 500 * ms, p, false, true, 2, 1500 * ms, "lease 1 does not come back for a clock behind"},
			{rel, 2, 400 * ms, p, true, true, 1, 1500 * ms, ""},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { runLeaseRows(t, b, key(tc.name), tc.rows) })
	}
}

// testLeaseIdentity: a concurrency policy never shares state with a rate
// policy of the same name on the same key, nor with another concurrency
// policy's, named or not; a named one keeps its leases across a change of
// Limit or TTL; an unnamed one is its whole definition.
func testLeaseIdentity(t *testing.T, newBackend func(t *testing.T) LeaseStore, key func(string) string) {
	b := newBackend(t)
	ctx := context.Background()
	k := key("k")
	acquire := func(p throttler.ConcurrencyPolicy, id throttler.LeaseID, k string) throttler.Decision {
		t.Helper()
		d, err := b.Acquire(ctx, k, p, id, T0)
		require.NoError(t, err)
		return d
	}
	// Spend every rate algorithm's limit under the name "api".
	for a := throttler.FixedWindow; a <= throttler.SlidingWindow; a++ {
		rp := throttler.Policy{Name: "api", Limit: 1, Window: time.Minute, Algorithm: a}
		d, err := b.Take(ctx, k, rp, 1, T0)
		require.NoError(t, err)
		require.True(t, d.Allowed, "%v", rp)
	}
	api := throttler.ConcurrencyPolicy{Name: "api", Limit: 2, TTL: time.Minute}
	require.Equal(t, int64(1), acquire(api, 1, k).Used, "rate state is not leases")
	require.Equal(t, int64(2), acquire(api, 2, k).Used)
	require.False(t, acquire(api, 3, k).Allowed)
	for a := throttler.FixedWindow; a <= throttler.SlidingWindow; a++ {
		rp := throttler.Policy{Name: "api", Limit: 1, Window: time.Minute, Algorithm: a}
		d, err := b.Peek(ctx, k, rp, T0)
		require.NoError(t, err)
		assert.Equal(t, int64(1), d.Used, "%v: leases are not its count", rp)
	}
	// Named: (Name, key). A new Limit or TTL keeps the leases.
	changed := throttler.ConcurrencyPolicy{Name: "api", Limit: 3, TTL: time.Hour}
	d := acquire(changed, 3, k)
	assert.Equal(t, int64(3), d.Used, "a named policy's leases survive a change of Limit and TTL")
	assert.Equal(t, int64(1), acquire(renamed(api, "other"), 1, k).Used, "another name is another limit")
	assert.Equal(t, int64(1), acquire(api, 1, key("other key")).Used, "another key is another limit")
	// Unnamed: the whole definition.
	two := throttler.Concurrent(2, time.Minute)
	assert.Equal(t, int64(1), acquire(two, 1, k).Used, "unnamed is not named")
	assert.Equal(t, int64(2), acquire(throttler.ConcurrencyPolicy{Limit: 2, TTL: time.Minute}, 2, k).Used, "the same definition is the same limit")
	assert.Equal(t, int64(1), acquire(throttler.Concurrent(3, time.Minute), 1, k).Used, "another Limit is another unnamed limit")
	assert.Equal(t, int64(1), acquire(throttler.Concurrent(2, time.Hour), 1, k).Used, "another TTL is another unnamed limit")
	// Unnamed leases are not an unnamed rate policy's count.
	rd, err := b.Peek(ctx, k, throttler.Policy{Limit: 2, Window: time.Minute}, T0)
	require.NoError(t, err)
	assert.Zero(t, rd.Used)
	// Names and keys that would collide under naive concatenation.
	x := throttler.ConcurrencyPolicy{Name: "x", Limit: 1, TTL: time.Minute}
	assert.True(t, acquire(x, 1, "y:"+key("z")).Allowed)
	assert.True(t, acquire(renamed(x, "x:y"), 1, key("z")).Allowed, `("x", "y:k") and ("x:y", "k") must be apart`)
}

func testLeaseKeys(t *testing.T, newBackend func(t *testing.T) LeaseStore, key func(string) string) {
	b := newBackend(t)
	ctx := context.Background()
	p := throttler.ConcurrencyPolicy{Name: "bytes", Limit: 1, TTL: time.Minute}
	long := strings.Repeat("k", 1024)
	for _, raw := range []string{"with space", "nul\x00byte", "ünïcødé 鍵 🔑", "{braces}", "{", "a:b:c", "\xff\xfe", long, long + "x"} {
		k := key("") + raw
		d, err := b.Acquire(ctx, k, p, 1, T0)
		require.NoError(t, err, "key %q", raw)
		require.True(t, d.Allowed, "key %q got leases another key holds", raw)
		d, err = b.Acquire(ctx, k, p, 2, T0)
		require.NoError(t, err, "key %q", raw)
		require.False(t, d.Allowed, "key %q: its lease was not kept", raw)
	}
	k := key("") + strings.Repeat("k", throttler.MaxKeyLen-len(key("")))
	d, err := b.Acquire(ctx, k, p, 1, T0)
	require.NoError(t, err, "a key of MaxKeyLen bytes")
	require.True(t, d.Allowed)
	held, _, err := b.Release(ctx, k, p, 1, T0)
	require.NoError(t, err)
	require.True(t, held)
}

// testLeaseManyHeld fills a key of a larger limit with leases acquired a
// millisecond apart: the earliest expiry answers, then each release and
// expiry frees exactly one.
func testLeaseManyHeld(t *testing.T, newBackend func(t *testing.T) LeaseStore, key func(string) string) {
	b := newBackend(t)
	ctx := context.Background()
	k := key("k")
	const n = 200
	p := throttler.ConcurrencyPolicy{Name: "many", Limit: n, TTL: time.Minute}
	for i := 0; i < n; i++ {
		d, err := b.Acquire(ctx, k, p, throttler.LeaseID(i+1), T0.Add(time.Duration(i)*ms))
		require.NoError(t, err)
		require.True(t, d.Allowed, "lease %d", i+1)
		require.Equal(t, int64(i+1), d.Used)
		require.Equal(t, T0.Add(time.Minute).UnixMilli(), d.ResetAt.UnixMilli())
	}
	at := T0.Add(n * ms)
	d, err := b.Acquire(ctx, k, p, n+1, at)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, T0.Add(time.Minute).Sub(at), d.RetryAfter)
	held, d, err := b.Release(ctx, k, p, 1, at)
	require.NoError(t, err)
	require.True(t, held)
	assert.Equal(t, T0.Add(time.Minute+ms).UnixMilli(), d.ResetAt.UnixMilli(), "lease 2 is now the earliest")
	// At +1m+10ms, leases 2..11 (acquired at +1..+10 ms) have expired.
	at = T0.Add(time.Minute + 10*ms)
	d, err = b.Acquire(ctx, k, p, n+1, at)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	assert.Equal(t, int64(n-1-10+1), d.Used, "200, less 1 released and 10 expired, plus this one")
	assert.Equal(t, T0.Add(time.Minute+11*ms).UnixMilli(), d.ResetAt.UnixMilli(), "lease 12 is the earliest")
}

func testLeaseInvalidInput(t *testing.T, newBackend func(t *testing.T) LeaseStore, key func(string) string) {
	b := newBackend(t)
	ctx := context.Background()
	good := throttler.ConcurrencyPolicy{Name: "ok", Limit: 1, TTL: time.Second}
	for _, tc := range []struct {
		name string
		key  string
		p    throttler.ConcurrencyPolicy
		id   throttler.LeaseID
		want error
	}{
		{"empty key", "", good, 1, throttler.ErrInvalidKey},
		{"key too long", strings.Repeat("k", throttler.MaxKeyLen+1), good, 1, throttler.ErrInvalidKey},
		{"zero lease ID", key("k"), good, 0, throttler.ErrInvalidLease},
		{"zero limit", key("k"), throttler.ConcurrencyPolicy{TTL: time.Second}, 1, throttler.ErrInvalidPolicy},
		{"negative limit", key("k"), throttler.Concurrent(-1, time.Second), 1, throttler.ErrInvalidPolicy},
		{"limit above MaxConcurrencyLimit", key("k"), throttler.Concurrent(throttler.MaxConcurrencyLimit+1, time.Second), 1, throttler.ErrInvalidPolicy},
		{"zero TTL", key("k"), throttler.Concurrent(1, 0), 1, throttler.ErrInvalidPolicy},
		{"TTL below a ms", key("k"), throttler.Concurrent(1, time.Microsecond), 1, throttler.ErrInvalidPolicy},
		{"TTL not whole ms", key("k"), throttler.Concurrent(1, 1500*time.Microsecond), 1, throttler.ErrInvalidPolicy},
		{"name with space", key("k"), renamed(good, "a b"), 1, throttler.ErrInvalidPolicy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := b.Acquire(ctx, tc.key, tc.p, tc.id, T0)
			assert.True(t, errors.Is(err, tc.want), "Acquire: %v is not %v", err, tc.want)
			_, _, err = b.Release(ctx, tc.key, tc.p, tc.id, T0)
			assert.True(t, errors.Is(err, tc.want), "Release: %v is not %v", err, tc.want)
		})
	}
	// Nothing was stored by the refused calls.
	d, err := b.Acquire(ctx, key("k"), good, 1, T0)
	require.NoError(t, err)
	assert.Equal(t, int64(1), d.Used)
}

// testLeaseConcurrency: 64 goroutines over several clients of one store.
// On one key, with no release, exactly Limit acquires are admitted. On
// another, goroutines acquire and release in a loop: the test counts the
// leases it holds, adding one after an admitted Acquire returns and taking
// it away before the Release is sent, so its count never exceeds the
// store's, and checks at every acquire that it is at most Limit.
func testLeaseConcurrency(t *testing.T, newBackend func(t *testing.T) LeaseStore, key func(string) string) {
	const goroutines, clients = 64, 4
	bs := make([]LeaseStore, clients)
	for i := range bs {
		bs[i] = newBackend(t)
	}
	ctx := context.Background()
	p := throttler.ConcurrencyPolicy{Name: "race", Limit: 10, TTL: time.Hour}
	var ids atomic.Uint64
	run := func(f func(b LeaseStore) error) {
		t.Helper()
		errs := make(chan error, goroutines)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func(b LeaseStore) {
				defer wg.Done()
				<-start
				if err := f(b); err != nil {
					errs <- err
				}
			}(bs[g%clients])
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}

	hot := key("no release")
	var admitted atomic.Int64
	run(func(b LeaseStore) error {
		for i := 0; i < 3; i++ {
			d, err := b.Acquire(ctx, hot, p, throttler.LeaseID(ids.Add(1)), T0)
			if err != nil {
				return err
			}
			if d.Allowed {
				admitted.Add(1)
			}
		}
		return nil
	})
	assert.Equal(t, p.Limit, admitted.Load(), "64 goroutines x 3 acquires with no release admit exactly Limit")

	churn := key("churn")
	var held, peak, granted atomic.Int64
	run(func(b LeaseStore) error {
		for i := 0; i < 20; i++ {
			id := throttler.LeaseID(ids.Add(1))
			now := T0.Add(time.Duration(i) * ms)
			d, err := b.Acquire(ctx, churn, p, id, now)
			if err != nil {
				return err
			}
			if !d.Allowed {
				continue
			}
			granted.Add(1)
			n := held.Add(1)
			for {
				if m := peak.Load(); n <= m || peak.CompareAndSwap(m, n) {
					break
				}
			}
			if n > p.Limit || d.Used > p.Limit {
				return fmt.Errorf("%d leases held by the test, the store says %d: more than Limit %d", n, d.Used, p.Limit)
			}
			held.Add(-1)
			ok, _, err := b.Release(ctx, churn, p, id, now)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("lease %d was not held at its release", id)
			}
		}
		return nil
	})
	t.Logf("churn: %d leases granted, at most %d held at once", granted.Load(), peak.Load())
	assert.Positive(t, granted.Load())
	_, d, err := bs[0].Release(ctx, churn, p, throttler.LeaseID(ids.Add(1)), T0.Add(time.Second))
	require.NoError(t, err)
	assert.Zero(t, d.Used, "every lease was released")
}

// testLeaseTraces runs random Acquires and Releases of a few IDs on a few
// keys, under policies that share a name with another Limit and TTL, the
// clock going forward, back and jumping ahead, and requires every answer to
// equal LeaseModel's. A backend may have dropped a key's leases once all of
// them expired by the latest now it was given; a difference is accepted
// only if the model, dropping them too, gives the backend's answer.
func testLeaseTraces(t *testing.T, newBackend func(t *testing.T) LeaseStore, key func(string) string) {
	b := newBackend(t)
	steps := 3000
	if testing.Short() {
		steps = 500
	}
	policies := []throttler.ConcurrencyPolicy{
		{Name: "d", Limit: 3, TTL: 40 * ms},
		{Name: "d", Limit: 5, TTL: 90 * ms}, // the same leases as the one above
		{Name: "e", Limit: 1, TTL: 7 * ms},
		{Limit: 2, TTL: 30 * ms},
		{Limit: 4, TTL: 300 * ms},
	}
	keys := []string{key("a"), key("b"), key("c")}
	ctx := context.Background()
	for seed := uint64(1); seed <= 2; seed++ {
		rng := rand.New(rand.NewPCG(seed, 13))
		m := model.NewLeaseModel()
		now := T0.UnixMilli() + int64(seed)*1_000_000 // traces apart in time
		latest := now
		for i := 0; i < steps; i++ {
			k, p := keys[rng.IntN(len(keys))], policies[rng.IntN(len(policies))]
			switch r := rng.IntN(20); {
			case r < 13:
				now += int64(rng.IntN(6))
			case r < 17:
				now -= int64(rng.IntN(40))
			default:
				now += int64(rng.IntN(300))
			}
			latest = max(latest, now)
			id := throttler.LeaseID(1 + rng.IntN(8))
			acquire := rng.IntN(3) < 2
			var (
				got     throttler.Decision
				gotHeld bool
				err     error
			)
			if acquire {
				got, err = b.Acquire(ctx, k, p, id, time.UnixMilli(now))
			} else {
				gotHeld, got, err = b.Release(ctx, k, p, id, time.UnixMilli(now))
			}
			require.NoError(t, err)
			got.ResetAt = time.UnixMilli(got.ResetAt.UnixMilli())
			msg := fmt.Sprintf("seed %d step %d: acquire %v of %d on %q under %v at %d", seed, i, acquire, id, k, p, now)
			held, want, commit := m.Try(acquire, k, p, id, now, false)
			if got != want || gotHeld != held {
				if end, ok := m.End(k, p); ok && end <= latest {
					held, want, commit = m.Try(acquire, k, p, id, now, true)
				}
			}
			require.Equal(t, want, got, msg)
			require.Equal(t, held, gotHeld, msg)
			commit()
		}
	}
}

// renamed is p under another name.
func renamed(p throttler.ConcurrencyPolicy, name string) throttler.ConcurrencyPolicy {
	p.Name = name
	return p
}
