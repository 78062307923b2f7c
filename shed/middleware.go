package shed

import (
	"context"
	"errors"
	"net/http"

	"github.com/throttlekit/throttlekit/httplimit"
	"github.com/throttlekit/throttlekit/throttler"
)

// HeaderLimiter names, on every refusal by Middleware, which of the four
// limiters refused the request: "worker-shedder", "fleet-shedder",
// "concurrency" or "rate". With the status (503 for the shedders, 429 for
// the limits) it tells a client whether to back off (an overloaded
// service) or slow down (its own limit).
const HeaderLimiter = "X-RateLimit-Limiter"

// The values of HeaderLimiter.
const (
	limiterWorker      = "worker-shedder"
	limiterFleet       = "fleet-shedder"
	limiterConcurrency = "concurrency"
	limiterRate        = "rate"
)

// Options configure Middleware: each limiter is optional (nil: off), but at
// least one must be on. Requests are sorted into priority classes for the
// shedders by Stripe's rules (Critical says which are critical, then
// TestModeHeader marks test-mode traffic, then GET, HEAD, OPTIONS and
// TRACE are Read and every other method Write), or by Classify instead.
type Options struct {
	// Critical reports whether a request is critical, which wins over
	// everything else. default: no request is critical
	Critical func(*http.Request) bool
	// TestModeHeader names the header that marks test-mode traffic when
	// it has any non-empty value; a client can only lower its own
	// priority with it. default: "X-Test-Mode"
	TestModeHeader string
	// Classify, if set, sorts requests into classes instead of Stripe's
	// rules (then Critical and TestModeHeader stay unset): an API-key
	// prefix for test mode, a route table for critical endpoints. It runs
	// on every request before anything else: it must be fast and safe for
	// concurrent use. default: Stripe's rules
	Classify func(*http.Request) Class
	// Worker, if set, sheds when this process is saturated (503). Start
	// its ticks with Worker.Run. default: off
	Worker *Worker
	// Fleet, if set, sheds non-critical traffic beyond its share of the
	// fleet (503). default: off
	Fleet *Fleet
	// Concurrency, if set, limits each client's requests in flight (429):
	// build it with httplimit.Concurrency, whose options answer its own
	// refusals and errors. default: off
	Concurrency func(http.Handler) http.Handler
	// Rate, if set, limits each client's request rate (429): build it with
	// httplimit.Rate, whose options answer its own refusals and errors.
	// default: off
	Rate func(http.Handler) http.Handler
	// OnError answers a request the fleet shedder could not decide (its
	// Throttler failed while failing closed, or the client has gone). err
	// may hold internal detail: log it, never write it to the response.
	// default: httplimit.WriteError, the statuses of every limit's errors
	OnError func(w http.ResponseWriter, r *http.Request, err error)
	// OnReleaseError, if set, is told of a fleet lease whose release failed
	// (it stops counting after its TTL anyway). default: none
	OnReleaseError func(r *http.Request, err error)
}

// Middleware runs Stripe's four limiters in Stripe's order, cheapest and
// most protective first: the worker utilization shedder, the fleet usage
// shedder, the per-client concurrency limit and the per-client request
// rate. The first that refuses answers, with its status, HeaderLimiter and
// its own headers; the request never reaches the ones after it, nor the
// handler:
//
//   - worker shedder: 503;
//   - fleet shedder: 503 and X-RateLimit-Resource (the fleet limit's name);
//   - concurrency and rate: as package httplimit's Concurrency and Rate
//     answer (429 by default, Retry-After and the X-RateLimit-* headers of
//     the limit that refused; Rate sets its headers on every response).
//
// A request one of them could not decide is answered by that limiter's
// OnError (httplimit.WriteError by default), with HeaderLimiter naming it.
// An admitted request counts in the worker shedder, and holds its leases,
// until the handler returns, also when it panics. Middleware returns an
// error, naming what is wrong, for a configuration that cannot work: no
// limiter, a shedder its constructor did not build, or a classification
// that cannot work.
func Middleware(o *Options) (func(http.Handler) http.Handler, error) {
	if o == nil || (o.Worker == nil && o.Fleet == nil && o.Concurrency == nil && o.Rate == nil) {
		return nil, errors.New("shed: Middleware needs at least one of Options.Worker, Fleet, Concurrency or Rate")
	}
	classify, err := classifier(o)
	if err != nil {
		return nil, err
	}
	m := &chain{classify: classify, worker: o.Worker, fleet: o.Fleet, conc: o.Concurrency, rate: o.Rate,
		onError: o.OnError, onReleaseError: o.OnReleaseError}
	if m.onError == nil {
		m.onError = httplimit.WriteError
	}
	if m.worker != nil && m.worker.random == nil {
		return nil, errors.New("shed: Options.Worker was not built by NewWorker")
	}
	if m.fleet != nil && m.fleet.t == nil {
		return nil, errors.New("shed: Options.Fleet was not built by NewFleet")
	}
	return m.wrap, nil
}

// chain is a built Middleware.
type chain struct {
	classify       func(*http.Request) Class
	worker         *Worker
	fleet          *Fleet
	conc, rate     func(http.Handler) http.Handler
	onError        func(http.ResponseWriter, *http.Request, error)
	onReleaseError func(*http.Request, error)
}

func (m *chain) wrap(next http.Handler) http.Handler {
	inner := next
	if m.rate != nil {
		inner = limited(limiterRate, m.rate, inner)
	}
	if m.conc != nil {
		inner = limited(limiterConcurrency, m.conc, inner)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := m.classify(r)
		if m.worker != nil {
			if !m.worker.Admit(c) {
				w.Header().Set(HeaderLimiter, limiterWorker)
				http.Error(w, "service overloaded: request shed, retry later", http.StatusServiceUnavailable)
				return
			}
			defer m.worker.Done()
		}
		if m.fleet != nil {
			l, d, err := m.fleet.Admit(r.Context(), c)
			if err != nil {
				w.Header().Set(HeaderLimiter, limiterFleet)
				m.onError(w, r, err)
				return
			}
			defer m.release(r, l)
			if !d.Allowed {
				w.Header().Set(HeaderLimiter, limiterFleet)
				w.Header().Set("X-RateLimit-Resource", m.fleet.critical.Name)
				http.Error(w, "service overloaded: request shed, retry later", http.StatusServiceUnavailable)
				return
			}
		}
		inner.ServeHTTP(w, r)
	})
}

// limited runs next behind the limit mw, which answers its refusals and
// errors itself: HeaderLimiter names the limit before it runs and is
// removed once it lets the request through, so it stays on exactly the
// responses mw wrote.
func limited(name string, mw func(http.Handler) http.Handler, next http.Handler) http.Handler {
	through := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Del(HeaderLimiter)
		next.ServeHTTP(w, r)
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(HeaderLimiter, name)
		through.ServeHTTP(w, r)
	})
}

// release gives a fleet lease back when the request ends, on a context the
// client's disconnection does not cancel: a lease released late still
// frees its slot long before its TTL.
func (m *chain) release(r *http.Request, l throttler.Lease) {
	if _, _, err := l.Release(context.WithoutCancel(r.Context())); err != nil && m.onReleaseError != nil {
		m.onReleaseError(r, err)
	}
}
