package migration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// failingStore names its store and fails every Take as that store's failure.
type failingStore struct {
	throttler.Backend
	name string
}

func (s failingStore) Traits() throttler.Traits {
	return throttler.Traits{Store: func(throttler.Op, string, throttler.Policy) string { return s.name }}
}

func (s failingStore) Take(context.Context, string, throttler.Policy, int64, time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, throttler.StoreFailure("", fmt.Errorf("%s: connection refused", s.name))
}

// A Migration names the store a key's calls reach through the router and
// its shadow: the serving store's name, or "new" for a store that names
// none. With the old store down, keys already on the new one keep being
// limited exactly.
func TestStoreFollowsTheRoutedShadowsControl(t *testing.T) {
	old := failingStore{Backend: mem(t), name: "memcached 10.0.0.2:11211"}
	pct := percent(t, 50)
	m := newMigration(t, old, mem(t), pct, nil)
	p := throttler.PerMinute(3).Named("api")

	th, err := throttler.New(m, &throttler.Options{Clock: func() time.Time { return time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC) }, BreakerThreshold: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	onNew := 0
	for i := range 100 {
		key := fmt.Sprint("user-", i)
		want := "memcached 10.0.0.2:11211"
		if pct.UseNew(key) {
			want = "new"
		}
		if got := m.Traits().Store(throttler.OpTake, key, p); got != want {
			t.Fatalf("%q: Store %q, want %q", key, got, want)
		}
		if want != "new" {
			continue
		}
		onNew++
		admitted := 0
		for range 5 {
			d, err := th.Allow(ctx, key, p)
			if err != nil || d.Degraded {
				t.Fatalf("%q on the healthy store: %+v, %v", key, d, err)
			}
			if d.Allowed {
				admitted++
			}
		}
		if admitted != 3 {
			t.Errorf("%q: %d admitted, want 3", key, admitted)
		}
		// A key on the failing store between two on the healthy one.
		if _, err := th.Allow(ctx, fmt.Sprint("old-", i), p); err != nil {
			t.Fatal(err)
		}
	}
	if onNew == 0 {
		t.Fatal("no key on the new store")
	}
}
