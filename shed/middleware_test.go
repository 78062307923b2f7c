package shed_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/httplimit"
	"github.com/throttlekit/throttlekit/shed"
	"github.com/throttlekit/throttlekit/throttler"
)

// rig is the four limiters over one lease store: a worker shedder whose
// utilization the test sets, a fleet of capacity 2 (1 for non-critical
// traffic), 1 request in flight per client and 2 requests a minute per
// client, clients named by the Client header.
type rig struct {
	store  *leaseStore
	th     *throttler.Throttler
	worker *shed.Worker
	util   *utilization
	fleet  *shed.Fleet
	conc   throttler.ConcurrencyPolicy
	rate   throttler.Policy
	opts   shed.Options
	// inHandler is called inside the handler.
	inHandler func(w http.ResponseWriter, r *http.Request)
	reached   int
}

func newRig(t *testing.T, mode bool) *rig {
	t.Helper()
	g := &rig{store: newLeaseStore(t)}
	g.th = newThrottler(t, g.store, mode)
	g.worker, g.util = newWorker(t, shed.WorkerOptions{})
	var err error
	if g.fleet, err = shed.NewFleet(g.th, &shed.FleetOptions{Capacity: 2, Share: 0.5, TTL: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	g.conc = throttler.ConcurrencyPolicy{Name: "inflight", Limit: 1, TTL: 10 * time.Second}
	g.rate = throttler.PerMinute(2).Named("core")
	g.opts = shed.Options{
		Worker:      g.worker,
		Fleet:       g.fleet,
		Concurrency: g.concurrency(t, nil),
		Rate:        g.rateLimit(t, nil),
	}
	return g
}

// concurrency is httplimit's Concurrency over the rig's limit.
func (g *rig) concurrency(t *testing.T, o *httplimit.Options) func(http.Handler) http.Handler {
	t.Helper()
	mw, err := httplimit.Concurrency(g.th, g.conc, httplimit.KeyByHeader("Client"), o)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// rateLimit is httplimit's Rate over the rig's limit.
func (g *rig) rateLimit(t *testing.T, o *httplimit.Options) func(http.Handler) http.Handler {
	t.Helper()
	mw, err := httplimit.Rate(g.th, g.rate, httplimit.KeyByHeader("Client"), o)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// shedAll brings the worker shedder to shed every shed-able request.
func (g *rig) shedAll() {
	g.util.set(1)
	g.worker.Update(at(0))
	for s := 1; s <= 148; s++ {
		g.worker.Update(at(s))
	}
}

func (g *rig) handler(t *testing.T) http.Handler {
	t.Helper()
	mw, err := shed.Middleware(&g.opts)
	if err != nil {
		t.Fatal(err)
	}
	return mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.reached++
		if g.inHandler != nil {
			g.inHandler(w, r)
		}
		fmt.Fprint(w, "ok")
	}))
}

func (g *rig) serve(h http.Handler, method, client string, header ...string) *httptest.ResponseRecorder {
	r := newRequest(method, "/v1/things", header...)
	if client != "" {
		r.Header.Set("Client", client)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// rateUsed is how many units the client's rate window counted.
func (g *rig) rateUsed(t *testing.T, client string) int64 {
	t.Helper()
	d, err := g.th.Peek(context.Background(), client, g.rate)
	if err != nil {
		t.Fatal(err)
	}
	return d.Used
}

func checkHeaders(t *testing.T, what string, w *httptest.ResponseRecorder, status int, want map[string]string) {
	t.Helper()
	if w.Code != status {
		t.Errorf("%s: status %d, want %d (%s)", what, w.Code, status, w.Body)
	}
	for k, v := range want {
		if got := w.Header().Get(k); got != v {
			t.Errorf("%s: %s = %q, want %q", what, k, got, v)
		}
	}
}

// TestMiddlewareEachRefusal makes each of the four refuse in turn and checks
// its status and headers, that the request reached neither the limiters
// after it nor the handler, and that nothing stays held.
func TestMiddlewareEachRefusal(t *testing.T) {
	ctx := context.Background()
	g := newRig(t, failOpen)
	h := g.handler(t)

	// Admitted: 200, the rate limit's headers, no HeaderLimiter; while
	// the handler runs it counts in the worker and holds both leases.
	g.inHandler = func(http.ResponseWriter, *http.Request) {
		if g.worker.Stats().InFlight != 1 || g.store.held("fleet", "fleet") != 1 || g.store.held("alice", "inflight") != 1 {
			t.Errorf("in the handler: in flight %d, fleet leases %d, alice's leases %d; want 1 each",
				g.worker.Stats().InFlight, g.store.held("fleet", "fleet"), g.store.held("alice", "inflight"))
		}
	}
	w := g.serve(h, "GET", "alice")
	checkHeaders(t, "admitted", w, 200, map[string]string{shed.HeaderLimiter: "", "X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "1", "X-RateLimit-Resource": "core"})
	g.inHandler = nil
	if g.reached != 1 || g.worker.Stats().InFlight != 0 || g.store.held("fleet", "fleet") != 0 || g.store.held("alice", "inflight") != 0 {
		t.Fatalf("after the request: reached %d, in flight %d, fleet leases %d, alice's leases %d; want 1, 0, 0, 0",
			g.reached, g.worker.Stats().InFlight, g.store.held("fleet", "fleet"), g.store.held("alice", "inflight"))
	}

	// Rate: alice's second request of the minute passes, her third is
	// refused by the rate limit.
	g.serve(h, "GET", "alice")
	w = g.serve(h, "GET", "alice")
	checkHeaders(t, "rate", w, 429, map[string]string{shed.HeaderLimiter: "rate", "X-RateLimit-Resource": "core", "X-RateLimit-Remaining": "0", "Retry-After": "60"})

	// Concurrency: bob holds a lease already; his request is refused
	// before the rate limit counts it.
	bobs, _, err := g.th.Acquire(ctx, "bob", g.conc)
	if err != nil || bobs == (throttler.Lease{}) {
		t.Fatal(err)
	}
	w = g.serve(h, "GET", "bob")
	checkHeaders(t, "concurrency", w, 429, map[string]string{
		shed.HeaderLimiter: "concurrency", "X-RateLimit-Resource": "inflight", "X-RateLimit-Limit": "1",
		"X-RateLimit-Remaining": "0", "X-RateLimit-Used": "1", "Retry-After": "10",
		"X-RateLimit-Reset": fmt.Sprint(t0.Add(10 * time.Second).Unix()),
	})
	if used := g.rateUsed(t, "bob"); used != 0 {
		t.Errorf("the rate limit counted %d of bob's refused request", used)
	}
	if _, _, err := bobs.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Fleet: one non-critical request in flight fills the share; the next
	// is shed before the concurrency limit takes a lease. Critical traffic
	// still passes.
	held, d, err := g.fleet.Admit(ctx, shed.Read)
	if err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	w = g.serve(h, "POST", "carol")
	checkHeaders(t, "fleet", w, 503, map[string]string{shed.HeaderLimiter: "fleet-shedder", "X-RateLimit-Resource": "fleet", "Retry-After": ""})
	if g.store.held("carol", "inflight") != 0 || g.rateUsed(t, "carol") != 0 {
		t.Error("a request the fleet shed reached the limiters after it")
	}
	g.opts.Critical = func(r *http.Request) bool { return r.Header.Get("Critical") != "" }
	hc := g.handler(t)
	w = g.serve(hc, "POST", "carol", "Critical", "1")
	checkHeaders(t, "critical at the fleet's share", w, 200, map[string]string{shed.HeaderLimiter: ""})
	if _, _, err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Worker: shedding everything shed-able; the request is refused
	// before the fleet is asked. Critical traffic still passes.
	g.shedAll()
	w = g.serve(hc, "GET", "dave")
	checkHeaders(t, "worker", w, 503, map[string]string{shed.HeaderLimiter: "worker-shedder", "Retry-After": ""})
	if g.rateUsed(t, "dave") != 0 || g.worker.Stats().InFlight != 0 {
		t.Error("a request the worker shed reached the limiters after it")
	}
	w = g.serve(hc, "GET", "dave", "Critical", "1")
	checkHeaders(t, "critical while shedding everything", w, 200, map[string]string{shed.HeaderLimiter: ""})

	if g.reached != 4 {
		t.Errorf("the handler ran %d times, want 4 (alice twice, carol and dave critical)", g.reached)
	}
	if g.store.held("fleet", "fleet") != 0 || g.worker.Stats().InFlight != 0 {
		t.Errorf("left held: %d fleet leases, %d in flight", g.store.held("fleet", "fleet"), g.worker.Stats().InFlight)
	}
}

// TestMiddlewareReleasesOnPanic: a handler that panics still releases its
// leases and leaves the worker's in-flight count, and the panic goes on up
// to the server.
func TestMiddlewareReleasesOnPanic(t *testing.T) {
	g := newRig(t, failOpen)
	g.inHandler = func(http.ResponseWriter, *http.Request) { panic("handler bug") }
	h := g.handler(t)
	func() {
		defer func() {
			if p := recover(); p != "handler bug" {
				t.Errorf("recovered %v, want the handler's panic", p)
			}
		}()
		g.serve(h, "POST", "alice")
	}()
	if g.reached != 1 || g.worker.Stats().InFlight != 0 || g.store.held("fleet", "fleet") != 0 || g.store.held("alice", "inflight") != 0 {
		t.Fatalf("after a panic: reached %d, in flight %d, fleet leases %d, alice's leases %d; want 1, 0, 0, 0",
			g.reached, g.worker.Stats().InFlight, g.store.held("fleet", "fleet"), g.store.held("alice", "inflight"))
	}
}

// TestMiddlewareErrors: a request without a client key is answered 400 by
// the concurrency limit; a failing store with a Throttler that fails
// closed is answered 503 with Retry-After: 1 by the first limiter that asks
// it, and never with the error's text; a limit's own OnError answers its
// errors, under HeaderLimiter.
func TestMiddlewareErrors(t *testing.T) {
	g := newRig(t, failClosed)
	h := g.handler(t)
	w := g.serve(h, "GET", "")
	checkHeaders(t, "no key", w, 400, map[string]string{shed.HeaderLimiter: "concurrency"})

	g.store.setFail(errors.New("store down: secret-key-alice"))
	w = g.serve(h, "GET", "alice")
	checkHeaders(t, "store down", w, 503, map[string]string{shed.HeaderLimiter: "fleet-shedder", "Retry-After": "1"})
	if strings.Contains(w.Body.String(), "secret") {
		t.Errorf("the response holds the error: %q", w.Body)
	}

	g.opts.Fleet = nil
	h = g.handler(t)
	w = g.serve(h, "GET", "alice")
	checkHeaders(t, "store down, no fleet", w, 503, map[string]string{shed.HeaderLimiter: "concurrency", "Retry-After": "1"})

	var got []error
	onError := func(w http.ResponseWriter, r *http.Request, err error) {
		got = append(got, err)
		w.WriteHeader(599)
	}
	g.opts.Concurrency = nil
	g.opts.Rate = g.rateLimit(t, &httplimit.Options{OnError: onError})
	h = g.handler(t)
	w = g.serve(h, "GET", "") // the rate limit's own KeyFunc error reaches its OnError
	checkHeaders(t, "custom OnError", w, 599, map[string]string{shed.HeaderLimiter: "rate"})
	if len(got) != 1 || !errors.Is(got[0], httplimit.ErrNoKey) {
		t.Errorf("OnError got %v, want one ErrNoKey", got)
	}
	if g.reached != 0 {
		t.Errorf("the handler ran %d times", g.reached)
	}
}

// TestMiddlewareClientGone: a request whose client has gone while its store
// call ran is answered 499 by whichever limiter asked the store, the fleet
// shedder as the limits: one mapping (httplimit.WriteError) for all, where
// the chain used to answer 503 and the rate limit 400.
func TestMiddlewareClientGone(t *testing.T) {
	g := newRig(t, failClosed)
	g.store.setFail(context.Canceled) // what a network store returns for a cancelled call
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		limiter string
		edit    func()
	}{
		{"fleet-shedder", func() {}},
		{"concurrency", func() { g.opts.Fleet = nil }},
	} {
		tc.edit()
		r := newRequest("GET", "/v1/things").WithContext(ctx)
		r.Header.Set("Client", "alice")
		w := httptest.NewRecorder()
		g.handler(t).ServeHTTP(w, r)
		checkHeaders(t, tc.limiter, w, 499, map[string]string{shed.HeaderLimiter: tc.limiter, "Retry-After": ""})
	}
	if g.reached != 0 {
		t.Errorf("the handler ran %d times", g.reached)
	}
}

// TestMiddlewareReleaseError: a release that fails is reported to
// OnReleaseError. Under FailClosed: a Throttler that fails open answers a
// failed Release with (false, nil), reporting the failure only to its
// Observe, as it does every failure it answers.
func TestMiddlewareReleaseError(t *testing.T) {
	g := newRig(t, failClosed)
	g.opts.Fleet, g.opts.Rate, g.opts.Worker = nil, nil, nil
	var released []error
	g.opts.Concurrency = g.concurrency(t, &httplimit.Options{OnReleaseError: func(r *http.Request, err error) { released = append(released, err) }})
	g.inHandler = func(http.ResponseWriter, *http.Request) { g.store.setFail(errors.New("store down")) }
	w := g.serve(g.handler(t), "GET", "alice")
	if w.Code != 200 || len(released) != 1 {
		t.Fatalf("status %d, release errors %v; want 200 and one error", w.Code, released)
	}
}

func TestMiddlewareBuildErrors(t *testing.T) {
	pass := func(next http.Handler) http.Handler { return next }
	for _, tc := range []struct {
		name string
		o    *shed.Options
		want string
	}{
		{"nil", nil, "needs at least one"},
		{"none", &shed.Options{TestModeHeader: "X-Test"}, "needs at least one"},
		{"Classify beside Critical", &shed.Options{Rate: pass, Classify: func(*http.Request) shed.Class { return shed.Read },
			Critical: func(*http.Request) bool { return true }}, "Options.Classify replaces Critical and TestModeHeader"},
		{"bad TestModeHeader", &shed.Options{Rate: pass, TestModeHeader: "X Test"}, `Options.TestModeHeader "X Test" is not a header name`},
		{"zero worker", &shed.Options{Worker: &shed.Worker{}}, "Options.Worker was not built by NewWorker"},
		{"zero fleet", &shed.Options{Fleet: &shed.Fleet{}}, "Options.Fleet was not built by NewFleet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mw, err := shed.Middleware(tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "shed: ") || strings.Contains(err.Error(), "throttler:") {
				t.Fatalf("Middleware: %v, %v; want an error containing %q", mw != nil, err, tc.want)
			}
		})
	}
}

// TestMiddlewareRateResetAgreesWithRetryAfter: a sliding-window counter's
// refusal names in X-RateLimit-Reset the instant its Retry-After does, not
// the end of the current window (30s earlier here, while the previous
// window's count still weighs), and a client returning then is admitted.
func TestMiddlewareRateResetAgreesWithRetryAfter(t *testing.T) {
	now := t0.Add(30 * time.Second) // halfway through an epoch-aligned minute
	serve := rateLimited(t, throttler.PerMinute(2).WithAlgorithm(throttler.SlidingWindow), func() time.Time { return now })
	serve()
	serve()
	w := serve()
	checkHeaders(t, "refused", w, 429, map[string]string{
		shed.HeaderLimiter: "rate", "Retry-After": "60",
		"X-RateLimit-Reset": fmt.Sprint(now.Add(time.Minute).Unix()),
	})
	now = now.Add(time.Minute)
	checkHeaders(t, "returning at the reset", serve(), 200, nil)
}

// TestMiddlewareRateComposite: a login's 2 a minute and 3 an hour as one
// composite in shed's rate slot. The refusal is the rate's, names the
// binding member, and spends nothing: the hour, refused by the minute,
// still has room when the minute comes back.
func TestMiddlewareRateComposite(t *testing.T) {
	now := t0
	login := throttler.All(throttler.PerMinute(2).Named("login-m"), throttler.PerHour(3).Named("login-h"))
	serve := rateLimited(t, login, func() time.Time { return now })
	checkHeaders(t, "first", serve(), 200, map[string]string{"X-RateLimit-Remaining": "1", "X-RateLimit-Resource": "login-m"})
	checkHeaders(t, "second", serve(), 200, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Resource": "login-m"})
	for range 3 {
		checkHeaders(t, "over the minute", serve(), 429, map[string]string{
			shed.HeaderLimiter: "rate", "X-RateLimit-Resource": "login-m", "Retry-After": "60"})
	}
	now = now.Add(time.Minute)
	checkHeaders(t, "the hour's last", serve(), 200, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Resource": "login-h"})
	checkHeaders(t, "over the hour", serve(), 429, map[string]string{
		shed.HeaderLimiter: "rate", "X-RateLimit-Resource": "login-h", "Retry-After": "3540"})
}

// rateLimited is shed's Middleware with only a rate limit, p per client on a
// memory store read at clock, and a function that serves alice's next
// request through it.
func rateLimited(t *testing.T, p throttler.Policy, clock func() time.Time) func() *httptest.ResponseRecorder {
	t.Helper()
	store, err := memory.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	th, err := throttler.New(store, &throttler.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	rate, err := httplimit.Rate(th, p, httplimit.KeyByHeader("Client"), nil)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := shed.Middleware(&shed.Options{Rate: rate})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	return func() *httptest.ResponseRecorder {
		r := newRequest("GET", "/v1/things")
		r.Header.Set("Client", "alice")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
}
