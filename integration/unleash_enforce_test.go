package integration

import (
	"context"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/flags/unleash"
	"github.com/throttlekit/throttlekit/throttler"
)

// enforceAtLimit returns a Throttler on b whose clock stays at now, and a
// policy of one call an hour enforced by e, with every key at its limit: its
// next call is a denial, or in dry run a would-be denial, which counts
// nothing, so every later call of the test is one too.
func enforceAtLimit(t *testing.T, b throttler.Backend, e throttler.Enforcer, keys []string, now time.Time) (*throttler.Throttler, throttler.Policy) {
	t.Helper()
	th, err := throttler.New(b, &throttler.Options{Clock: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	p := throttler.PerHour(1).Named("enforce-it").EnforcedBy(e)
	for _, k := range keys {
		if d, err := th.Allow(context.Background(), k, p); err != nil || !d.Allowed || d.WouldDeny {
			t.Fatalf("first call of %q: %+v, %v", k, d, err)
		}
	}
	return th, p
}

// enforceRefused makes one Allow for each key, every key at its limit, and
// returns which were refused and how many; a call that is not refused
// must be a would-be denial (dry run), or the test fails.
func enforceRefused(t *testing.T, th *throttler.Throttler, p throttler.Policy, keys []string) ([]bool, int) {
	t.Helper()
	refused, n := make([]bool, len(keys)), 0
	for i, k := range keys {
		d, err := th.Allow(context.Background(), k, p)
		switch {
		case err != nil:
			t.Fatalf("key %q: %v", k, err)
		case d.Allowed && !d.WouldDeny:
			t.Fatalf("key %q, at its limit, admitted without a would-be denial: %+v", k, d)
		case !d.Allowed && d.WouldDeny:
			t.Fatalf("key %q refused and reported as a would-be denial: %+v", k, d)
		}
		if refused[i] = !d.Allowed; refused[i] {
			n++
		}
	}
	return refused, n
}

// TestUnleashEnforcement drives a policy's enforcement from a real Unleash
// server through a Throttler: flags.Enforcement over the feature's
// flexibleRollout, ramped 0 -> 10 -> 50 -> 100 and rolled back to 0 through
// the Admin API. At every step the keys refused are exactly those the
// bucketing puts within the percentage (each key is at its limit, so an
// enforced key is refused and the others are would-be denials), a step up
// never releases a refused key, not even while the change arrives, and the
// rollback refuses none once the client has fetched it.
func TestUnleashEnforcement(t *testing.T) {
	srv := unleashStart(t)
	const (
		feature = "throttlekit-enforce"
		refresh = time.Second
		recheck = 50 * time.Millisecond
	)
	keys := unleashKeys(5000)
	rollout := srv.unleashCreateRollout(t, feature, 0)
	l := &unleashListener{}
	c := unleashClient(t, srv.URL, refresh, l)
	src, err := unleash.New(c, feature, &unleash.Options{Recheck: recheck})
	if err != nil {
		t.Fatal(err)
	}
	enforce, err := flags.Enforcement(src)
	if err != nil {
		t.Fatal(err)
	}
	m, err := memory.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	th, p := enforceAtLimit(t, m, enforce, keys, time.Date(2031, 6, 1, 12, 0, 0, 0, time.UTC))

	// Before the client has fetched the feature every key is in dry run
	// anyway: wait until it has, so that 0% is Unleash's.
	if _, ok := poll(30*time.Second, unleashPollEvery, func(context.Context) bool { return l.fetches.Load() > 0 }); !ok {
		t.Fatalf("the client did not fetch the features within 30s (%d errors)", l.errors.Load())
	}
	if src.Percent() != 0 {
		t.Fatalf("the source reads %d%%, want the feature's 0%%", src.Percent())
	}

	prev, prevPct := make([]bool, len(keys)), 0 // refused at the previous step
	for _, pct := range []int{0, 10, 50, 100, 0} {
		start := time.Now()
		rollout.set(t, pct)
		// The server publishes a change when its revision job next runs
		// (every second); the client fetches it within its refresh
		// interval. Time both.
		published := make(chan time.Duration, 1)
		go func() {
			poll(10*refresh, unleashPollEvery, func(context.Context) bool { v, err := srv.unleashPublished(feature); return err == nil && v == pct })
			published <- time.Since(start)
		}()
		want := make([]bool, len(keys))
		wantN := 0
		for i, k := range keys {
			if want[i] = flags.Bucket(feature, k) <= pct; want[i] {
				wantN++
			}
		}
		raising := pct > prevPct
		var released string
		var got []bool
		var n int
		took, ok := poll(10*refresh, unleashPollEvery, func(context.Context) bool {
			got, n = enforceRefused(t, th, p, keys)
			for i := range keys {
				if raising && prev[i] && !got[i] && released == "" {
					released = keys[i]
				}
			}
			return n == wantN
		})
		pub := <-published
		if released != "" {
			t.Fatalf("raising enforcement to %d%%: key %q, refused before, was admitted", pct, released)
		}
		if !ok {
			t.Fatalf("at %d%%: %d keys refused after %v, want %d (the client fetched %d times, %d errors)",
				pct, n, took, wantN, l.fetches.Load(), l.errors.Load())
		}
		for i, k := range keys {
			if got[i] != want[i] {
				t.Fatalf("at %d%%: key %q refused %v, its bucket (%d) says %v", pct, k, got[i], flags.Bucket(feature, k), want[i])
			}
		}
		// The exact sets agree; this only guards the expectation itself
		// against a bucketing that puts nearly every key on one side.
		if pct > 0 && pct < 100 {
			if share := float64(n) * 100 / float64(len(keys)); share < float64(pct)-3 || share > float64(pct)+3 {
				t.Errorf("at %d%%: %.1f%% of keys refused", pct, share)
			}
		}
		t.Logf("%d%%: %d of %d keys refused; Admin API call -> server publishes: %v; -> every key as bucketed: %v (client refresh %v, recheck %v)",
			pct, n, len(keys), pub.Round(time.Millisecond), took.Round(time.Millisecond), refresh, recheck)
		if took-pub > 2*refresh {
			t.Errorf("at %d%%: the keys followed %v after the server published the change: more than two refresh intervals (%v)", pct, took-pub, 2*refresh)
		}
		prev, prevPct = got, pct
	}
}
