package httplimit_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/httplimit"
	"github.com/throttlekit/throttlekit/throttler"
)

// A rate limit and a concurrency limit on one route: at most 1 request of
// a user in flight and 2 a minute (the README's "Embed it", at a fixed
// clock). The concurrency limit goes first, so that a request refused for
// being one too many in flight is not counted against the rate.
func Example() {
	store, err := memory.New(nil) // or backend/redis, backend/memcached
	if err != nil {
		log.Fatal(err)
	}
	now := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC) // a fixed clock, for the output below
	th, err := throttler.New(store, &throttler.Options{Clock: func() time.Time { return now }})
	if err != nil {
		log.Fatal(err)
	}
	user := httplimit.KeyByHeader("X-User-ID")
	inflight, err := httplimit.Concurrency(th, throttler.ConcurrencyPolicy{Name: "inflight", Limit: 1, TTL: time.Minute}, user, nil)
	if err != nil {
		log.Fatal(err) // a bad policy, a nil KeyFunc, a store without leases: caught at start-up
	}
	perMinute, err := httplimit.Rate(th, throttler.PerMinute(2).Named("api"), user, nil)
	if err != nil {
		log.Fatal(err)
	}
	var api http.Handler
	api = inflight(perMinute(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/slow" {
			// While this request is in flight, another of the same user
			// is refused by the concurrency limit.
			fmt.Println("meanwhile /api/fast", describe(api, "/api/fast"))
		}
		fmt.Fprintln(w, "hello")
	})))
	for _, path := range []string{"/api/slow", "/api/fast", "/api/fast"} {
		fmt.Println(path, describe(api, path))
	}
	// Output:
	// meanwhile /api/fast 429 too many concurrent requests: at most 1 in flight; retry in 60s resource=inflight remaining=0 retry-after="60"
	// /api/slow 200 hello resource=api remaining=1 retry-after=""
	// /api/fast 200 hello resource=api remaining=0 retry-after=""
	// /api/fast 429 rate limit exceeded: 2 per 1m0s; retry in 60s resource=api remaining=0 retry-after="60"
}

// describe sends GET path as user 42 and describes the answer.
func describe(h http.Handler, path string) string {
	r := httptest.NewRequest(http.MethodGet, path, nil)
	r.Header.Set("X-User-ID", "42")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return fmt.Sprintf("%d %s resource=%s remaining=%s retry-after=%q", w.Code, strings.TrimSpace(w.Body.String()),
		w.Header().Get("X-RateLimit-Resource"), w.Header().Get("X-RateLimit-Remaining"), w.Header().Get("Retry-After"))
}

// A rate limit of 2 requests a minute per user, at a fixed clock: every
// answer carries the X-RateLimit-* headers, and the third is refused.
func ExampleRate() {
	store, err := memory.New(nil) // or backend/redis, backend/memcached
	if err != nil {
		log.Fatal(err)
	}
	now := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC) // a fixed clock, for the output below
	th, err := throttler.New(store, &throttler.Options{Clock: func() time.Time { return now }})
	if err != nil {
		log.Fatal(err)
	}
	mw, err := httplimit.Rate(th, throttler.PerMinute(2).Named("api"), httplimit.KeyByHeader("X-User-ID"), nil)
	if err != nil {
		log.Fatal(err)
	}
	api := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") }))

	for range 3 {
		r := httptest.NewRequest(http.MethodGet, "/api/", nil)
		r.Header.Set("X-User-ID", "42")
		w := httptest.NewRecorder()
		api.ServeHTTP(w, r)
		h := w.Header()
		fmt.Printf("%d %s limit=%s remaining=%s used=%s reset=%s resource=%s retry-after=%q\n",
			w.Code, strings.TrimSpace(w.Body.String()), h.Get("X-RateLimit-Limit"), h.Get("X-RateLimit-Remaining"),
			h.Get("X-RateLimit-Used"), h.Get("X-RateLimit-Reset"), h.Get("X-RateLimit-Resource"), h.Get("Retry-After"))
	}
	// Output:
	// 200 hello limit=2 remaining=1 used=1 reset=1925089505 resource=api retry-after=""
	// 200 hello limit=2 remaining=0 used=2 reset=1925089505 resource=api retry-after=""
	// 429 rate limit exceeded: 2 per 1m0s; retry in 60s limit=2 remaining=0 used=2 reset=1925089505 resource=api retry-after="60"
}

// The IETF draft's headers, opt-in; and a configuration that cannot work,
// refused when the middleware is built.
func ExampleRate_ietf() {
	store, err := memory.New(nil)
	if err != nil {
		log.Fatal(err)
	}
	th, err := throttler.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	mw, err := httplimit.Rate(th, throttler.PerHour(1).Named("core"), httplimit.KeyByHeader("Authorization"),
		&httplimit.Options{IETFHeaders: true}) // also RateLimit-Policy and RateLimit
	if err != nil {
		log.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") }))

	for range 2 {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("Authorization", "token abc")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%d remaining=%s retry-after=%q policy=%s\n", w.Code, w.Header().Get("X-RateLimit-Remaining"), w.Header().Get("Retry-After"), w.Header().Get("RateLimit-Policy"))
	}

	// A configuration that cannot work fails here, not on every request.
	_, err = httplimit.Rate(th, throttler.Policy{}, httplimit.KeyByRemoteIP, nil)
	fmt.Println(err)
	// Output:
	// 200 remaining=0 retry-after="" policy="core";q=1;w=3600
	// 429 remaining=0 retry-after="3600" policy="core";q=1;w=3600
	// throttler: invalid policy: limit must be between 1 and 2^48, got 0
}

// Keys that are secrets (API tokens) are best hashed before they reach a
// store, where anyone reading the store, its logs or its metrics would see
// them.
func ExampleKeyFunc_hashed() {
	var hashed httplimit.KeyFunc = func(r *http.Request) (string, error) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || tok == "" {
			return "", fmt.Errorf("no bearer token")
		}
		sum := sha256.Sum256([]byte(tok))
		return "tok:" + hex.EncodeToString(sum[:16]), nil
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Bearer s3cr3t")
	key, _ := hashed(r)
	fmt.Println(key)
	// Output:
	// tok:4e738ca5563c06cfd0018299933d58db
}

// An OnError of your own logs what went wrong, which may hold the key,
// and answers with WriteError, which writes the status alone.
func ExampleWriteError() {
	store, err := memory.New(nil)
	if err != nil {
		log.Fatal(err)
	}
	th, err := throttler.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	logAndAnswer := func(w http.ResponseWriter, r *http.Request, err error) {
		fmt.Println("log:", err) // your logger
		httplimit.WriteError(w, r, err)
	}
	mw, err := httplimit.Rate(th, throttler.PerDay(1000), httplimit.KeyByHeader("X-User-ID"), &httplimit.Options{OnError: logAndAnswer})
	if err != nil {
		log.Fatal(err)
	}
	w := httptest.NewRecorder()
	mw(http.NotFoundHandler()).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil)) // no X-User-ID
	fmt.Print(w.Code, " ", w.Body.String())
	// Output:
	// log: httplimit: request has no client key: header X-User-ID is empty
	// 400 Bad Request
}

// The README's "Embed it", run as it is written there (TestReadmeEmbedIt
// keeps the two the same): a concurrency limit and a rate limit on one
// route, and a limit asked directly.
func Example_embed() {
	ctx := context.Background()
	mux := http.NewServeMux()
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })
	loginHandler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "welcome") })

	store, err := memory.New(nil) // or backend/redis, backend/memcached for a fleet
	if err != nil {
		log.Fatal(err)
	}
	th, err := throttler.New(store, nil) // nil options: real clock, 100ms timeout, fail open
	if err != nil {
		log.Fatal(err)
	}
	// A policy is a limit and the algorithm that counts it (docs/algorithms.md).
	core := throttler.PerHour(5000).Named("core")                                            // fixed window, GitHub's
	partner := throttler.PerSecond(100).WithAlgorithm(throttler.SlidingLog).Named("partner") // at most 100 in any second
	inflight := throttler.ConcurrencyPolicy{Name: "inflight", Limit: 2, TTL: time.Minute}    // 2 at once; a lease lasts 1m at most

	// HTTP middleware: at most 2 requests of a user in flight, then 5000 an hour, counted when a
	// request starts and refunded for a 304. A refusal is a 429 with Retry-After.
	user := httplimit.KeyByHeader("X-User-ID")
	concurrent, err := httplimit.Concurrency(th, inflight, user, nil)
	if err != nil {
		log.Fatal(err) // an invalid policy, a nil KeyFunc, a store without leases: caught at start-up
	}
	hourly, err := httplimit.Rate(th, core, user, nil)
	if err != nil {
		log.Fatal(err)
	}
	mux.Handle("/api/", concurrent(hourly(api))) // mux: your *http.ServeMux

	// Several limits as one, all or nothing (on a store whose Traits say Composites: memory today):
	// a login attempt counts in both or in neither.
	login := throttler.All(throttler.PerSecond(1).Named("login-s"), throttler.PerHour(100).Named("login-h"))
	logins, err := httplimit.Rate(th, login, user, nil)
	if err != nil {
		log.Fatal(err)
	}
	mux.Handle("/login", logins(loginHandler))

	// Or directly.
	d, err := th.Allow(ctx, "acct:7", partner) // before each call to the partner's API
	if err == nil && !d.Allowed {
		// over the limit: retry after d.RetryAfter
	}

	r := httptest.NewRequest(http.MethodGet, "/api/things", nil)
	r.Header.Set("X-User-ID", "42")
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, r)
	fmt.Println(w.Code, strings.TrimSpace(w.Body.String()), "remaining:", w.Header().Get("X-RateLimit-Remaining"))
	fmt.Println("partner allowed:", d.Allowed, "remaining:", d.Remaining)
	for range 2 {
		r := httptest.NewRequest(http.MethodPost, "/login", nil)
		r.Header.Set("X-User-ID", "42")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		fmt.Println("login:", w.Code, w.Header().Get("X-RateLimit-Resource"), "remaining:", w.Header().Get("X-RateLimit-Remaining"))
	}
	// Output:
	// 200 hello remaining: 4999
	// partner allowed: true remaining: 99
	// login: 200 login-s remaining: 0
	// login: 429 login-s remaining: 0
}
