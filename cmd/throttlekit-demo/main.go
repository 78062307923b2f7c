// Command throttlekit-demo serves a small HTTP API limited by throttlekit on
// the embedded memory backend, to explore the headers, 429s and 304 refunds
// with curl, a login under two limits at once (all or nothing), and Stripe's
// four limiters (worker and fleet load shedders, concurrency, rate) on
// /exports and /charges.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/httplimit"
	"github.com/throttlekit/throttlekit/throttler"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on")
	limit := flag.Int64("limit", 5, "requests per window for each client, on each endpoint but /login")
	window := flag.Duration("window", time.Minute, "window length")
	burst := flag.Int64("burst", 0, "capacity of /search's token bucket (default: twice -limit)")
	sh := defaultShedding(0, 0)
	flag.IntVar(&sh.workers, "workers", sh.workers, "the worker shedder's requests at once at utilization 1")
	flag.Int64Var(&sh.fleet, "fleet", sh.fleet, "the fleet shedder's capacity: requests at once, every class together")
	flag.Float64Var(&sh.share, "share", sh.share, "the part of -fleet non-critical traffic may hold")
	flag.Int64Var(&sh.inflight, "inflight", sh.inflight, "exports in flight per client")
	flag.DurationVar(&sh.work, "work", sh.work, "how long an export takes")
	flag.DurationVar(&sh.delay, "shed-delay", sh.delay, "how long saturation lasts before the worker shedder sheds")
	flag.DurationVar(&sh.ramp, "shed-ramp", sh.ramp, "how long the worker shedder then takes to shed all but critical traffic")
	flag.Parse()
	def := defaultShedding(*limit, *window)
	sh.rate, sh.charges = def.rate, def.charges
	if err := run(*addr, endpoints(*limit, *window, *burst), sh, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// endpoint is one limited route of the demo API and its policy.
type endpoint struct {
	method, path string
	p            throttler.Policy
	what         string // for the usage: what the algorithm is for
}

// endpoints are the demo's limits, for every client: one algorithm each at
// limit per window, GitHub's fixed window on /repos, Stripe's token bucket
// on /search (a burst of burst, 0 meaning twice limit, refilled at limit per
// window), and a sliding log on /deliveries, as Circles limits its calls to
// partners; and on POST /login the README's composite, 1 a second and 100
// an hour, whose Take counts in both or in neither (a login refused by
// either spends nothing from the other). A value no policy can take is
// refused by newHandler.
func endpoints(limit int64, window time.Duration, burst int64) []endpoint {
	if burst == 0 {
		burst = 2 * limit
	}
	login := throttler.All(throttler.PerSecond(1).Named("login-s"), throttler.PerHour(100).Named("login-h"))
	return []endpoint{
		{"GET", "/repos", throttler.Policy{Name: "core", Limit: limit, Window: window}, "a window that resets at a stored instant (GitHub)"},
		{"GET", "/search", throttler.Policy{Name: "search", Limit: limit, Window: window}.WithBurst(burst), "a steady rate with bursts (Stripe)"},
		{"GET", "/deliveries", throttler.Policy{Name: "deliveries", Limit: limit, Window: window}.WithAlgorithm(throttler.SlidingLog), "at most the limit in any window (Circles' outbound calls)"},
		{"POST", "/login", login, "both limits, all or nothing: a refused login counts in neither"},
	}
}

func run(addr string, eps []endpoint, sh shedding, out io.Writer) error {
	h, err := newHandler(eps, sh, nil, log.Default())
	if err != nil {
		return err // before listening: a bad -limit, -window, -burst or shedding flag stops here
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	printUsage(out, "http://"+ln.Addr().String(), eps, sh)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go h.shed.worker.Run(ctx) // ends with ctx
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(shutdown); err != nil {
			return err
		}
		if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
}

// handler is the demo API, and its Stripe part (whose worker shedder needs
// its ticks).
type handler struct {
	http.Handler
	shed *shedAPI
}

// newHandler is the demo API: each endpoint is limited by its policy;
// /repos answers 304 to a matching If-None-Match (refunded), and
// /rate_limit reports every limit without counting, as GitHub's does; the
// Stripe part (addShedding) beside them. clock is the limits' source of
// time (nil: the real one; tests set instants). A policy that cannot work
// is an error here.
func newHandler(eps []endpoint, sh shedding, clock func() time.Time, logger *log.Logger) (*handler, error) {
	if len(eps) == 0 {
		return nil, errors.New("demo: no endpoints")
	}
	store, err := memory.New(&memory.Options{MaxKeys: 1_000_000})
	if err != nil {
		return nil, err
	}
	th, err := throttler.New(store, &throttler.Options{
		Clock: clock,
		Observe: func(o throttler.Observation) {
			if o.Err != nil && !throttler.IsInputError(o.Err) {
				// Errors may hold the client's key: fine in the server's
				// log, never in a response.
				logger.Printf("rate limiter degraded (%v): %v", o.Source, o.Err)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	const etag = `"repos-v1"`
	bodies := map[string]http.HandlerFunc{
		"/repos": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("ETag", etag)
			if r.Header.Get("If-None-Match") == etag {
				w.WriteHeader(http.StatusNotModified)
				return
			}
			writeJSON(w, []map[string]string{{"name": "throttlekit"}, {"name": "hello-world"}})
		},
		"/search": func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, map[string]any{"total_count": 1, "items": []map[string]string{{"name": "throttlekit"}}})
		},
		"/deliveries": func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, map[string]any{"delivered": true})
		},
		"/login": func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, map[string]any{"logged_in": true}) // a pretend login: any client may
		},
	}
	mux := http.NewServeMux()
	for _, e := range eps {
		body, ok := bodies[e.path]
		if !ok {
			return nil, fmt.Errorf("demo: no handler for %s", e.path)
		}
		limited, err := httplimit.Rate(th, e.p, clientKey, &httplimit.Options{IETFHeaders: true})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", e.path, err)
		}
		mux.Handle(e.method+" "+e.path, limited(body))
	}
	mux.HandleFunc("GET /rate_limit", func(w http.ResponseWriter, r *http.Request) {
		k, err := clientKey(r)
		if err != nil {
			http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
			return
		}
		resources := map[string]any{}
		for _, e := range eps {
			for _, p := range limits(e.p) {
				d, err := th.Peek(r.Context(), k, p)
				if err != nil { // a key the store refuses (400), a store down while failing closed (503)
					httplimit.WriteError(w, r, err)
					return
				}
				resources[p.Name] = map[string]any{
					"limit": d.Limit, "used": d.Used, "remaining": d.Remaining, "reset": unixCeil(d.ResetAt),
				}
			}
		}
		// GitHub's shape: every resource, and "rate" for core.
		writeJSON(w, map[string]any{"resources": resources, "rate": resources[eps[0].p.Name]})
	})
	api, err := addShedding(mux, th, sh)
	if err != nil {
		return nil, err
	}
	return &handler{Handler: mux, shed: api}, nil
}

// limits are the policies /rate_limit reports for p: a composite's members,
// each a resource of its own (a member's windows are those it has when
// taken alone, so its Peek is its count), or p itself.
func limits(p throttler.Policy) []throttler.Policy {
	if !p.Composite() {
		return []throttler.Policy{p}
	}
	var ms []throttler.Policy
	for _, m := range p.Members() {
		ms = append(ms, m)
	}
	return ms
}

// unixCeil is t in Unix seconds, rounded up, as X-RateLimit-Reset is: a
// client waiting until that second is never early.
func unixCeil(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// clientKey names the client by its token ("Authorization: token X"), or by
// its IP address when it sends none. A real service would hash a token
// before it reaches a store (see httplimit's ExampleKeyFunc_hashed).
func clientKey(r *http.Request) (string, error) {
	if auth := r.Header.Get("Authorization"); auth != "" {
		tok, ok := strings.CutPrefix(auth, "token ")
		if !ok || tok == "" {
			return "", errors.New(`the Authorization header must be "token <value>"`)
		}
		return "token:" + tok, nil
	}
	ip, err := httplimit.KeyByRemoteIP(r)
	return "ip:" + ip, err
}

// tryStep is one command the demo prints: a request (repeated times times,
// after a pause of sleep) and the status its last response gets when the
// commands run in order, with the Retry-After it carries within [retryMin,
// retryMax] seconds when retryMax is set, and, for /rate_limit, the used
// count of the resources in used.
type tryStep struct {
	note   string
	method string // "" for GET
	header string // "Name: value", or ""
	path   string
	times  int64
	// together sends the times requests in one curl, its URL repeated: at
	// once, and each answer shown whole, where a loop shows statuses.
	together           bool
	sleep              time.Duration
	want               int
	retryMin, retryMax int64
	used               map[string]int64
}

// trySteps are the commands to try, in an order in which each does what its
// note says for any limit: the 304 comes before a request that could spend
// a limit of 1, and the loops that spend a limit come last, on a client of
// their own, each followed by the 429 that shows its Retry-After; then the
// login, whose limits no flag changes. eps are endpoints' (core, search,
// deliveries, login).
func trySteps(eps []endpoint) []tryStep {
	core, search, deliveries, login := eps[0].p, eps[1].p, eps[2].p, eps[3].p
	token := search.Window / time.Duration(search.Limit) // a token bucket's refill of one
	const alice = "Authorization: token alice"
	spend := func(path, what string, n int64, until string, retryMax time.Duration, more string) []tryStep {
		return []tryStep{
			{note: fmt.Sprintf("%s: %d x 200", what, n), header: alice, path: path, times: n, want: http.StatusOK},
			{note: fmt.Sprintf("429 until %s (Retry-After at most %d)%s", until, ceilSeconds(retryMax), more),
				header: alice, path: path, times: 1, want: http.StatusTooManyRequests, retryMin: 1, retryMax: ceilSeconds(retryMax)},
		}
	}
	steps := []tryStep{
		{note: fmt.Sprintf("304: the unit is refunded, X-RateLimit-Remaining stays %d", core.Limit), header: `If-None-Match: "repos-v1"`, path: "/repos", times: 1, want: http.StatusNotModified},
		{note: fmt.Sprintf("200: X-RateLimit-Remaining falls to %d", core.Limit-1), path: "/repos", times: 1, want: http.StatusOK},
		{note: "every limit, not counted", path: "/rate_limit", times: 1, want: http.StatusOK},
		{note: "400: a malformed key is the client's error", header: "Authorization: Basic xyz", path: "/repos", times: 1, want: http.StatusBadRequest},
	}
	steps = append(steps, spend("/repos", "another client, its own window", core.Limit,
		"the window ends", core.Window, "")...)
	steps = append(steps, spend("/search", "search, a token bucket: its whole burst", search.Capacity(),
		fmt.Sprintf("a token refills, one every %v", token), token,
		"; X-RateLimit-Limit is the burst, X-RateLimit-Reset when the bucket is full again")...)
	steps = append(steps, spend("/deliveries", "deliveries, a sliding log", deliveries.Limit,
		fmt.Sprintf("the first of them is %v old", deliveries.Window), deliveries.Window, "")...)
	return append(steps, loginSteps(login, alice)...)
}

// loginSteps show the composite login, of a per-second member s and a
// per-hour member h, for the client of header: two logins at once are a 200
// that leaves s nothing and a 429 with s's Retry-After, which h never
// counts; after that wait a login passes again.
func loginSteps(login throttler.Policy, header string) []tryStep {
	var s, h throttler.Policy
	for i, m := range login.Members() {
		if i == 0 {
			s = m
		} else {
			h = m
		}
	}
	wait := ceilSeconds(s.Window)
	return []tryStep{
		{note: fmt.Sprintf("login: two at once are 200, then 429 with Retry-After %d from %s; "+
			"X-RateLimit-* are %s's (the binding limit), RateLimit-Policy lists %s and %s", wait, s.Name, s.Name, s.Name, h.Name),
			method: http.MethodPost, header: header, path: "/login", times: 2, together: true,
			want: http.StatusTooManyRequests, retryMin: wait, retryMax: wait},
		{note: fmt.Sprintf("%s used 1, not 2: the refused login counted in neither limit", h.Name),
			header: header, path: "/rate_limit", times: 1, want: http.StatusOK, used: map[string]int64{s.Name: 1, h.Name: 1}},
		{note: "after the Retry-After, a login passes again",
			method: http.MethodPost, header: header, path: "/login", times: 1, sleep: s.Window, want: http.StatusOK},
	}
}

// ceilSeconds is d in whole seconds, rounded up, as Retry-After says it.
func ceilSeconds(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }

// command renders s as a shell command against base.
func (s tryStep) command(base string) string {
	h, pause := "", ""
	if s.method != "" && s.method != http.MethodGet {
		h = "-X " + s.method + " "
	}
	if s.header != "" {
		h += "-H '" + s.header + "' "
	}
	if s.sleep > 0 {
		pause = fmt.Sprintf("sleep %d; ", ceilSeconds(s.sleep))
	}
	switch {
	case s.times > 1 && s.together:
		return fmt.Sprintf("%scurl -i %s%s", pause, h, strings.TrimSpace(strings.Repeat(base+s.path+" ", int(s.times))))
	case s.times > 1:
		return fmt.Sprintf(`%sfor i in $(seq %d); do curl -s -o /dev/null -w '%%{http_code}\n' %s%s%s; done`, pause, s.times, h, base, s.path)
	}
	return fmt.Sprintf("%scurl -i %s%s%s", pause, h, base, s.path)
}

func printUsage(w io.Writer, base string, eps []endpoint, sh shedding) {
	fmt.Fprintf(w, "throttlekit demo listening on %s (memory backend)\n\nLimits, per client:\n", base)
	for _, e := range eps {
		fmt.Fprintf(w, "  %-16s %v\n  %16s %s\n", e.method+" "+e.path, e.p, "", e.what)
	}
	fmt.Fprintf(w, "\nTry it, in this order:\n")
	for _, s := range trySteps(eps) {
		fmt.Fprintf(w, "  # %s\n  %s\n", s.note, s.command(base))
	}
	printShedding(w, base, sh)
	fmt.Fprintln(w, "\nCtrl-C stops it.")
}
