package unleash

import (
	"net"
	"strconv"
	"testing"
	"time"

	unleashsdk "github.com/Unleash/unleash-client-go/v4"
	ucontext "github.com/Unleash/unleash-client-go/v4/context"

	"github.com/throttlekit/throttlekit/flags"
)

func TestNewErrors(t *testing.T) {
	f := newFakeUnleash(t)
	c, _ := f.client(t, time.Hour)
	tests := []struct {
		name    string
		c       *unleashsdk.Client
		feature string
		opts    *Options
		want    string
	}{
		{"nil client", nil, "feat", nil, "unleash: client is nil"},
		{"empty feature", c, "", nil, "unleash: feature name is empty"},
		{"mirror is the feature", c, "feat", &Options{MirrorFeature: "feat"},
			`unleash: Options.MirrorFeature is "feat", the rollout's own feature; name a separate on/off feature`},
		{"negative recheck", c, "feat", &Options{Recheck: -time.Millisecond},
			"unleash: Options.Recheck is -1ms; want 0 (default 100ms) or more"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(tt.c, tt.feature, tt.opts)
			if s != nil || err == nil || err.Error() != tt.want {
				t.Fatalf("New = %v, %v; want error %q", s, err, tt.want)
			}
		})
	}
	s := source(t, c, "feat", &Options{})
	if s.recheck != int64(100*time.Millisecond) {
		t.Errorf("zero Recheck became %v, want the default 100ms", time.Duration(s.recheck))
	}
}

// TestBucketMatchesClient finds each key's bucket through the real Unleash
// client's evaluation of flexibleRollout (a binary search over features
// rolled out to 1..100%) and compares it with flags.Bucket.
func TestBucketMatchesClient(t *testing.T) {
	const group = "ratelimit-redis"
	f := newFakeUnleash(t)
	features := make([]map[string]any, 0, 101)
	for p := 0; p <= 100; p++ {
		features = append(features, flexible("p"+strconv.Itoa(p), group, p))
	}
	f.set(features...)
	c, wait := f.client(t, time.Hour)
	wait()
	enabled := func(p int, key string) bool {
		return c.IsEnabled("p"+strconv.Itoa(p), unleashsdk.WithContext(ucontext.Context{UserId: key}))
	}
	keys := testKeys(10000)
	hist := make([]int, 101)
	for _, key := range keys {
		// The smallest p for which the client says yes is the bucket.
		lo, hi := 1, 100
		for lo < hi {
			mid := (lo + hi) / 2
			if enabled(mid, key) {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		if got := flags.Bucket(group, key); got != lo {
			t.Fatalf("Bucket(%q, %q) = %d, Unleash client puts it in %d", group, key, got, lo)
		}
		if enabled(0, key) {
			t.Fatalf("client enables %q at 0%%", key)
		}
		hist[lo]++
	}
	// Every bucket is used: the search above is not trivially satisfied.
	for b := 1; b <= 100; b++ {
		if hist[b] == 0 {
			t.Errorf("no key in bucket %d", b)
		}
	}
}

// TestPercentMatchesClient: flags.Percent routes as the client's
// flexibleRollout of the same group and percentage.
func TestPercentMatchesClient(t *testing.T) {
	const group = "g1"
	percents := []int{0, 1, 10, 25, 50, 75, 99, 100}
	f := newFakeUnleash(t)
	var features []map[string]any
	for _, p := range percents {
		features = append(features, flexible("p"+strconv.Itoa(p), group, p))
	}
	f.set(features...)
	c, wait := f.client(t, time.Hour)
	wait()
	keys := testKeys(10000)
	for _, p := range percents {
		t.Run(strconv.Itoa(p), func(t *testing.T) {
			s, err := flags.NewPercentFor(group, p)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, key := range keys {
				want := c.IsEnabled("p"+strconv.Itoa(p), unleashsdk.WithContext(ucontext.Context{UserId: key}))
				if got := s.UseNew(key); got != want {
					t.Fatalf("UseNew(%q) at %d%% = %v, Unleash client says %v", key, p, got, want)
				}
				if want {
					n++
				}
			}
			if share := n * 100 / len(keys); share < p-2 || share > p+2 {
				t.Errorf("%d%% rollout routes %d%% of keys", p, share)
			}
		})
	}
}

// clientSays is the client's own answer for key; a panic (the client
// asserts parameter types) counts as "old", as the source promises.
func clientSays(c *unleashsdk.Client, feature, key string) (on bool) {
	defer func() {
		if recover() != nil {
			on = false
		}
	}()
	return c.IsEnabled(feature, unleashsdk.WithContext(ucontext.Context{UserId: key}))
}

func strategy(name string, params map[string]any, extra map[string]any) map[string]any {
	s := map[string]any{"name": name, "parameters": params}
	for k, v := range extra {
		s[k] = v
	}
	return s
}

func feature(enabled bool, strategies ...map[string]any) map[string]any {
	return map[string]any{"name": "feat", "enabled": enabled, "strategies": strategies}
}

// TestUnleashMatchesClient compares the source's own evaluation (and its
// fallback to the client) with the client's IsEnabled, key by key.
func TestUnleashMatchesClient(t *testing.T) {
	roll := func(group string, p any, stick string) map[string]any {
		return strategy("flexibleRollout", map[string]any{"rollout": p, "stickiness": stick, "groupId": group}, nil)
	}
	tests := []struct {
		name     string
		feature  map[string]any // nil: not defined at all
		wantSome bool           // some keys new and some old
		byClient bool
	}{
		{"unknown", nil, false, false},
		{"25 percent", feature(true, roll("feat", "25", "userId")), true, false},
		{"numeric rollout", feature(true, roll("feat", 40.0, "userId")), true, false},
		{"default stickiness", feature(true, roll("other", "60", "default")), true, false},
		{"zero", feature(true, roll("feat", "0", "userId")), false, false},
		{"hundred", feature(true, roll("feat", "100", "userId")), false, false},
		{"disabled", feature(false, roll("feat", "50", "userId")), false, false},
		{"no strategies", feature(true), false, false},
		{"two groups", feature(true, roll("a", "10", "userId"), roll("b", "20", "userId")), true, false},
		{"sessionId stickiness", feature(true, roll("feat", "50", "sessionId")), false, true},
		{"constraint", feature(true, strategy("flexibleRollout",
			map[string]any{"rollout": "50", "stickiness": "userId", "groupId": "feat"},
			map[string]any{"constraints": []any{map[string]any{"contextName": "userId", "operator": "STR_STARTS_WITH", "values": []string{"user-"}}}})), true, true},
		{"userWithId", feature(true, strategy("userWithId", map[string]any{"userIds": "user-0,user-4"}, nil)), true, true},
		{"missing stickiness", feature(true, strategy("flexibleRollout", map[string]any{"rollout": "50", "groupId": "feat"}, nil)), false, true},
		{"non-string groupId", feature(true, roll("feat", "50", "userId")), true, false},
		{"bad rollout", feature(true, roll("feat", "lots", "userId")), false, true},
		{"default strategy", feature(true, strategy("default", map[string]any{}, nil)), false, false},
	}
	// groupId given as a number: the client panics on it; the source must not.
	tests[len(tests)-2].feature = feature(true, strategy("flexibleRollout", map[string]any{"rollout": "50", "stickiness": "userId", "groupId": 7}, nil))
	tests[len(tests)-2].wantSome = false
	tests[len(tests)-2].byClient = true

	keys := testKeys(10000)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeUnleash(t)
			if tt.feature != nil {
				f.set(tt.feature)
			} else {
				f.set(flexible("another", "another", 100))
			}
			c, wait := f.client(t, time.Hour)
			wait()
			u := source(t, c, "feat", nil)
			if got := u.current().byClient; got != tt.byClient {
				t.Errorf("evaluated by client = %v, want %v", got, tt.byClient)
			}
			n := keys
			if tt.byClient {
				n = keys[:2000] // each call goes through the slow client path
			}
			news := 0
			for _, k := range n {
				want := clientSays(c, "feat", k)
				if got := u.UseNew(k); got != want {
					t.Fatalf("UseNew(%q) = %v, client says %v", k, got, want)
				}
				if want {
					news++
				}
			}
			if some := news > 0 && news < len(n); some != tt.wantSome {
				t.Errorf("%d of %d keys new; want a mix: %v", news, len(n), tt.wantSome)
			}
		})
	}
}

// TestUnleashFollowsChanges ramps 25 -> 50 -> 0 on the server: keys only join
// while rising, and all leave at 0. The mirror feature follows too.
func TestUnleashFollowsChanges(t *testing.T) {
	f := newFakeUnleash(t)
	mirror := map[string]any{"name": "mirror", "enabled": true, "strategies": []any{}}
	f.set(flexible("feat", "feat", 25), mirror)
	c, wait := f.client(t, 5*time.Millisecond)
	wait()
	u := source(t, c, "feat", &Options{MirrorFeature: "mirror", Recheck: time.Nanosecond})
	keys := testKeys(10000)
	count := func() (n int, isNew []bool) {
		isNew = make([]bool, len(keys))
		for i, k := range keys {
			if isNew[i] = u.UseNew(k); isNew[i] {
				n++
			}
		}
		return n, isNew
	}
	n25, at25 := count()
	if n25 < 2300 || n25 > 2700 {
		t.Fatalf("25%%: %d of %d keys new", n25, len(keys))
	}
	if !u.Mirroring() {
		t.Error("mirror feature on, Mirroring() = false")
	}

	f.set(flexible("feat", "feat", 50), mirror)
	wait()
	n50, at50 := count()
	if n50 < 4800 || n50 > 5200 {
		t.Fatalf("50%%: %d of %d keys new", n50, len(keys))
	}
	for i := range keys {
		if at25[i] && !at50[i] {
			t.Fatalf("key %q left the new backend when the rollout rose", keys[i])
		}
	}

	f.set(flexible("feat", "feat", 0), map[string]any{"name": "mirror", "enabled": false, "strategies": []any{}})
	wait()
	if n0, _ := count(); n0 != 0 {
		t.Errorf("0%%: %d keys still new", n0)
	}
	if u.Mirroring() {
		t.Error("mirror feature off, Mirroring() = true")
	}
}

// TestUnleashNeverAnswered: a client whose server never answers, with no
// backup file, routes every key old, and nothing waits for it.
func TestUnleashNeverAnswered(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	c, err := unleashsdk.NewClient(
		unleashsdk.WithUrl("http://"+addr+"/api"),
		unleashsdk.WithAppName("flags-unleash-test"),
		unleashsdk.WithBackupPath(t.TempDir()),
		unleashsdk.WithListener(&readyListener{updated: make(chan struct{}, 1)}),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, u := range []*Rollout{
		source(t, c, "feat", &Options{MirrorFeature: "m", Recheck: time.Nanosecond}),
		source(t, c, "feat", nil),
	} {
		for _, k := range testKeys(1000) {
			if u.UseNew(k) {
				t.Fatalf("key %q new without any definition", k)
			}
		}
		if u.Mirroring() {
			t.Error("mirroring without any definition")
		}
	}
}

func TestUnleashMirroring(t *testing.T) {
	toggle := func(enabled bool, strategies ...map[string]any) map[string]any {
		return map[string]any{"name": "mirror", "enabled": enabled, "strategies": strategies}
	}
	tests := []struct {
		name   string
		mirror map[string]any
		want   bool
	}{
		{"no strategies", toggle(true), true},
		{"default strategy", toggle(true, strategy("default", map[string]any{}, nil)), true},
		// What Unleash 6 gives a feature enabled without a strategy.
		{"100% rollout", toggle(true, strategy("flexibleRollout", map[string]any{"rollout": "100", "stickiness": "default", "groupId": "mirror"}, nil)), true},
		{"disabled", toggle(false), false},
		{"partial rollout", toggle(true, strategy("flexibleRollout", map[string]any{"rollout": "50", "stickiness": "default", "groupId": "mirror"}, nil)), false},
		{"constrained", toggle(true, strategy("default", map[string]any{}, map[string]any{"constraints": []any{map[string]any{"contextName": "appName", "operator": "IN", "values": []string{"x"}}}})), false},
		{"unknown", map[string]any{"name": "other", "enabled": true}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeUnleash(t)
			f.set(flexible("feat", "feat", 10), tt.mirror)
			c, wait := f.client(t, time.Hour)
			wait()
			if got := source(t, c, "feat", &Options{MirrorFeature: "mirror"}).Mirroring(); got != tt.want {
				t.Errorf("Mirroring() = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestUnleashFromBackup: a client that cannot reach Unleash starts from the
// backup file an earlier client wrote, and routes as it did.
func TestUnleashFromBackup(t *testing.T) {
	backup := t.TempDir()
	f := newFakeUnleash(t)
	f.set(flexible("feat", "feat", 25))
	l := &readyListener{updated: make(chan struct{}, 1)}
	first, err := unleashsdk.NewClient(unleashsdk.WithUrl(f.srv.URL+"/api"), unleashsdk.WithAppName("flags-backup"),
		unleashsdk.WithBackupPath(backup), unleashsdk.WithDisableMetrics(true), unleashsdk.WithListener(l))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.updated:
	case <-time.After(10 * time.Second):
		t.Fatal("no fetch within 10s")
	}
	first.Close() // persists the backup

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	second, err := unleashsdk.NewClient(unleashsdk.WithUrl("http://"+addr+"/api"), unleashsdk.WithAppName("flags-backup"),
		unleashsdk.WithBackupPath(backup), unleashsdk.WithDisableMetrics(true), unleashsdk.WithListener(&readyListener{updated: make(chan struct{}, 1)}))
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	u := source(t, second, "feat", nil)
	want, err := flags.NewPercentFor("feat", 25)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, k := range testKeys(10000) {
		if u.UseNew(k) != want.UseNew(k) {
			t.Fatalf("key %q: routed unlike the 25%% in the backup", k)
		}
		if want.UseNew(k) {
			n++
		}
	}
	if n == 0 {
		t.Fatal("the backup routed no key new")
	}
}

// TestUnleashClosedClient: after the client is closed the source still
// answers (from the last definitions) instead of blocking.
func TestUnleashClosedClient(t *testing.T) {
	f := newFakeUnleash(t)
	f.set(flexible("feat", "feat", 40), map[string]any{"name": "mirror", "enabled": true})
	l := &readyListener{updated: make(chan struct{}, 1)}
	// Metrics on: that is what makes IsEnabled block once the client is closed.
	c, err := unleashsdk.NewClient(unleashsdk.WithUrl(f.srv.URL+"/api"), unleashsdk.WithAppName("flags-closed"),
		unleashsdk.WithBackupPath(t.TempDir()), unleashsdk.WithListener(l))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.updated:
	case <-time.After(10 * time.Second):
		t.Fatal("no fetch within 10s")
	}
	u := source(t, c, "feat", &Options{MirrorFeature: "mirror", Recheck: time.Nanosecond})
	c.Close()
	done := make(chan bool)
	go func() {
		n := 0
		for _, k := range testKeys(1000) {
			if u.UseNew(k) {
				n++
			}
		}
		done <- n > 0 && u.Mirroring()
	}()
	select {
	case ok := <-done:
		if !ok {
			t.Error("a closed client lost the last definitions")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the source blocked on a closed client")
	}
}
