package integration

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	unleashsdk "github.com/Unleash/unleash-client-go/v4"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/flags/unleash"
	"github.com/throttlekit/throttlekit/throttler"
)

// unleashListener counts what the client reports; it also keeps the
// client's channels drained.
type unleashListener struct {
	errors, fetches atomic.Int64
}

func (l *unleashListener) OnError(error)   { l.errors.Add(1) }
func (l *unleashListener) OnWarning(error) {}
func (l *unleashListener) OnReady()        { l.fetches.Add(1) }
func (l *unleashListener) OnUpdate()       { l.fetches.Add(1) }

// unleashClient returns a client of url with an empty backup directory, so
// it knows only what it fetches itself. Its HTTP client has a timeout:
// unleash.NewClient registers the instance synchronously (with metrics on),
// so with the default client a server that accepts and never answers would
// hang NewClient itself.
func unleashClient(t *testing.T, url string, refresh time.Duration, l *unleashListener) *unleashsdk.Client {
	t.Helper()
	c, err := unleashsdk.NewClient(
		unleashsdk.WithUrl(url+"/api/"),
		unleashsdk.WithAppName("throttlekit-integration"),
		unleashsdk.WithRefreshInterval(refresh),
		unleashsdk.WithMetricsInterval(refresh),
		unleashsdk.WithCustomHeaders(http.Header{"Authorization": {unleashClientToken}}),
		unleashsdk.WithBackupPath(t.TempDir()),
		unleashsdk.WithListener(l),
		unleashsdk.WithHttpClient(&http.Client{Timeout: unleashHTTPTimeout}),
	)
	if err != nil {
		t.Fatalf("unleash client: %v", err)
	}
	t.Cleanup(func() { unleashCloseBounded(t, c) })
	return c
}

const unleashHTTPTimeout = time.Second

// unleashCloseBounded closes c and fails the test if that hangs.
func unleashCloseBounded(t *testing.T, c *unleashsdk.Client) {
	done := make(chan struct{})
	go func() { c.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Error("unleash client Close hung for 10s")
	}
}

// unleashRouted is a Router and the Unleash source that ramps it.
type unleashRouted struct {
	*flags.Router
	src *unleash.Rollout
}

// UseNew reports where the router sends key now: where its source says.
func (u unleashRouted) UseNew(key string) bool { return u.src.UseNew(key) }

// unleashRouter is a Router between two memory backends, ramped by an
// Unleash source over feature.
func unleashRouter(t *testing.T, c *unleashsdk.Client, feature string, recheck time.Duration) unleashRouted {
	t.Helper()
	src, err := unleash.New(c, feature, &unleash.Options{Recheck: recheck})
	if err != nil {
		t.Fatal(err)
	}
	old, err := memory.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	nu, err := memory.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := flags.NewRouter(old, nu, src, nil)
	if err != nil {
		t.Fatal(err)
	}
	return unleashRouted{r, src}
}

// unleashPollEvery is how often the tests look again for what Unleash
// changes: timings are taken to within it.
const unleashPollEvery = 10 * time.Millisecond

func unleashKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("client-%d", i)
	}
	return keys
}

// unleashRoutes returns which keys the router sends to the new backend.
func unleashRoutes(r flags.Rollout, keys []string) (isNew []bool, n int) {
	isNew = make([]bool, len(keys))
	for i, k := range keys {
		if isNew[i] = r.UseNew(k); isNew[i] {
			n++
		}
	}
	return isNew, n
}

// unleashExpected is how many keys a rollout of percent puts on new, by the
// bucketing Unleash documents.
func unleashExpected(group string, keys []string, percent int) int {
	n := 0
	for _, k := range keys {
		if flags.Bucket(group, k) <= percent {
			n++
		}
	}
	return n
}

// TestUnleashRouter drives the router from a real Unleash server: ramp,
// rollback (timed), the server going away, and a router started while it is
// away. The subtests share one server, started once, and run in order.
func TestUnleashRouter(t *testing.T) {
	srv := unleashStart(t)
	const (
		feature = "throttlekit-router"
		refresh = time.Second
		recheck = 50 * time.Millisecond
	)
	keys := unleashKeys(10000)
	rollout := srv.unleashCreateRollout(t, feature, 25)
	l := &unleashListener{}
	c := unleashClient(t, srv.URL, refresh, l)
	router := unleashRouter(t, c, feature, recheck)

	var at25 []bool
	if !t.Run("25 percent", func(t *testing.T) {
		want := unleashExpected(feature, keys, 25)
		if _, ok := poll(30*time.Second, unleashPollEvery, func(context.Context) bool { _, n := unleashRoutes(router, keys); return n == want }); !ok {
			_, n := unleashRoutes(router, keys)
			t.Fatalf("%d keys new after 30s, want %d (the client fetched %d times, %d errors)", n, want, l.fetches.Load(), l.errors.Load())
		}
		var n int
		at25, n = unleashRoutes(router, keys)
		if share := float64(n) * 100 / float64(len(keys)); share < 23 || share > 27 {
			t.Errorf("25%% rollout routes %.1f%% of keys new", share)
		}
		// Every key's calls land where UseNew says.
		ctx, now := context.Background(), time.Now()
		before := router.Stats()
		for _, k := range keys {
			if _, err := router.Take(ctx, k, throttler.PerHour(100), 1, now); err != nil {
				t.Fatal(err)
			}
		}
		if got := router.Stats(); got.New-before.New != uint64(n) || got.Old-before.Old != uint64(len(keys)-n) {
			t.Errorf("calls: %+v -> %+v, want %d new and %d old", before, got, n, len(keys)-n)
		}
	}) {
		return
	}

	if !t.Run("50 percent keeps the new keys", func(t *testing.T) {
		rollout.set(t, 50)
		want := unleashExpected(feature, keys, 50)
		if _, ok := poll(10*refresh, unleashPollEvery, func(context.Context) bool { _, n := unleashRoutes(router, keys); return n == want }); !ok {
			t.Fatalf("the 50%% rollout did not arrive within %v", 10*refresh)
		}
		at50, _ := unleashRoutes(router, keys)
		for i, k := range keys {
			if at25[i] && !at50[i] {
				t.Fatalf("key %q left the new backend when the rollout rose to 50%%", k)
			}
		}
	}) {
		return
	}

	if !t.Run("rollback to 0", func(t *testing.T) {
		start := time.Now()
		rollout.set(t, 0)
		// The server publishes a change when its revision job next runs
		// (every second); the client then fetches it within its refresh
		// interval. Time both.
		published := make(chan time.Duration, 1)
		go func() {
			poll(10*refresh, unleashPollEvery, func(context.Context) bool { p, err := srv.unleashPublished(feature); return err == nil && p == 0 })
			published <- time.Since(start)
		}()
		_, ok := poll(10*refresh, unleashPollEvery, func(context.Context) bool { _, n := unleashRoutes(router, keys); return n == 0 })
		took := time.Since(start)
		pub := <-published
		if !ok {
			t.Fatalf("keys still new %v after the rollback", took)
		}
		t.Logf("rollback: Admin API call -> server publishes 0%%: %v; -> every key old: %v (client refresh %v, recheck %v)",
			pub.Round(time.Millisecond), took.Round(time.Millisecond), refresh, recheck)
		if took-pub > 2*refresh {
			t.Errorf("every key old %v after the server published 0%%: more than two refresh intervals (%v)", took-pub, 2*refresh)
		}
	}) {
		return
	}

	if !t.Run("server stopped: last state holds", func(t *testing.T) {
		rollout.set(t, 30)
		want := unleashExpected(feature, keys, 30)
		if _, ok := poll(10*refresh, unleashPollEvery, func(context.Context) bool { _, n := unleashRoutes(router, keys); return n == want }); !ok {
			t.Fatalf("the 30%% rollout did not arrive")
		}
		before, _ := unleashRoutes(router, keys)
		stop := 10 * time.Second
		if err := srv.container.Stop(context.Background(), &stop); err != nil {
			t.Fatalf("stopping unleash: %v", err)
		}
		errs := l.errors.Load()
		// The client must have tried, and failed, at least twice.
		if _, ok := poll(10*refresh, unleashPollEvery, func(context.Context) bool { return l.errors.Load() >= errs+2 }); !ok {
			t.Fatalf("the client reported no failed fetches after the server stopped")
		}
		after, _ := unleashRoutes(router, keys)
		for i, k := range keys {
			if before[i] != after[i] {
				t.Fatalf("key %q changed sides while Unleash was down", k)
			}
		}
	}) {
		return
	}

	t.Run("started while unreachable", func(t *testing.T) {
		// The stopped server's address refuses connections; a listener that
		// accepts and never answers stands for one that hangs.
		hang, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var conns []net.Conn
		accepted := make(chan struct{})
		go func() {
			defer close(accepted)
			for {
				conn, err := hang.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				conns = append(conns, conn)
				mu.Unlock()
			}
		}()
		t.Cleanup(func() {
			hang.Close()
			<-accepted
			mu.Lock()
			defer mu.Unlock()
			for _, c := range conns {
				c.Close()
			}
		})
		for _, tc := range []struct{ name, url string }{
			{"refused", srv.URL},
			{"hanging", "http://" + hang.Addr().String()},
		} {
			t.Run(tc.name, func(t *testing.T) {
				start := time.Now()
				l := &unleashListener{}
				c := unleashClient(t, tc.url, refresh, l)
				r := unleashRouter(t, c, feature, recheck)
				ctx, now := context.Background(), time.Now()
				for _, k := range keys {
					if _, err := r.Take(ctx, k, throttler.PerHour(100), 1, now); err != nil {
						t.Fatal(err)
					}
				}
				// At most the HTTP timeout for NewClient's registration.
				if took := time.Since(start); took > unleashHTTPTimeout+2*time.Second {
					t.Errorf("starting and serving %d keys took %v", len(keys), took)
				}
				if st := r.Stats(); st.New != 0 || st.Old != uint64(len(keys)) {
					t.Errorf("Stats() = %+v, want every call old", st)
				}
				// Two refresh intervals later it still knows nothing.
				time.Sleep(2*refresh + recheck)
				if _, n := unleashRoutes(r, keys); n != 0 || l.fetches.Load() != 0 {
					t.Errorf("%d keys new, %d fetches, with Unleash unreachable", n, l.fetches.Load())
				}
			})
		}
	})
}
