package shed

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/throttlekit/throttlekit/internal/httpheaders"
	"github.com/throttlekit/throttlekit/throttler"
)

// HeaderLimiter names, on every refusal by Middleware, which of the four
// limiters refused the request: LimiterWorker, LimiterFleet,
// LimiterConcurrency or LimiterRate. With the status (503 for the shedders,
// 429 for the limits) it tells a client whether to back off (an overloaded
// service) or slow down (its own limit).
const HeaderLimiter = "X-RateLimit-Limiter"

// The values of HeaderLimiter.
const (
	LimiterWorker      = "worker-shedder"
	LimiterFleet       = "fleet-shedder"
	LimiterConcurrency = "concurrency"
	LimiterRate        = "rate"
)

// Concurrency is a per-client concurrency limit (Stripe's concurrent
// requests limiter): at most Policy.Limit requests of one key in flight.
type Concurrency struct {
	// Throttler acquires the leases; its backend must hold leases.
	Throttler *throttler.Throttler
	// Policy is the limit; name it, so that refusals name it in
	// X-RateLimit-Resource.
	Policy throttler.ConcurrencyPolicy
	// Key names the client a request counts against.
	Key throttler.KeyFunc
}

// Rate is a per-client request rate limit: the throttler's Middleware, with
// its headers and 304 refunds.
type Rate struct {
	Throttler *throttler.Throttler
	Policy    throttler.Policy
	Key       throttler.KeyFunc
	// Options configure the throttler's Middleware; a nil OnError there
	// becomes this chain's OnError. default: the throttler's defaults
	Options *throttler.MiddlewareOptions
}

// Options configure Middleware: each limiter is optional (nil: off), but at
// least one must be on.
type Options struct {
	// Classify sorts requests into priority classes for the shedders.
	// default: DefaultClassifier
	Classify Classifier
	// Worker, if set, sheds when this process is saturated (503). Start
	// its ticks with Worker.Run. default: off
	Worker *Worker
	// Fleet, if set, sheds non-critical traffic beyond its share of the
	// fleet (503). default: off
	Fleet *Fleet
	// Concurrency, if set, limits each client's requests in flight (429).
	// default: off
	Concurrency *Concurrency
	// Rate, if set, limits each client's request rate (429). default: off
	Rate *Rate
	// OnError answers a request that could not be decided: a KeyFunc's
	// error or a key the store refuses (the default answers 400), or a
	// failing store when the Throttler fails closed (the default answers
	// 503 with Retry-After: 1). err may hold the client's key: log it,
	// never write it to the response. default: as described
	OnError func(w http.ResponseWriter, r *http.Request, err error)
	// OnReleaseError, if set, is told of a lease whose release failed (it
	// stops counting after its TTL anyway). default: none
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
//   - concurrency: 429, Retry-After, X-RateLimit-Resource (the policy's
//     name, if any) and X-RateLimit-Limit, -Remaining, -Used and -Reset of
//     the concurrency limit;
//   - rate: as the throttler's Middleware answers (429, Retry-After and
//     the X-RateLimit-* headers it sets on every response).
//
// An admitted request counts in the worker shedder, and holds its leases,
// until the handler returns, also when it panics. Middleware returns an
// error, naming what is wrong, for a configuration that cannot work: no
// limiter, a shedder its constructor did not build, a Throttler whose
// backend does not hold leases for Concurrency, an invalid policy, a nil
// KeyFunc.
func Middleware(o *Options) (func(http.Handler) http.Handler, error) {
	if o == nil || (o.Worker == nil && o.Fleet == nil && o.Concurrency == nil && o.Rate == nil) {
		return nil, errors.New("shed: Middleware needs at least one of Options.Worker, Fleet, Concurrency or Rate")
	}
	m := &chain{classify: o.Classify, worker: o.Worker, fleet: o.Fleet, onError: o.OnError, onReleaseError: o.OnReleaseError}
	if m.classify == nil {
		m.classify = DefaultClassifier
	}
	if m.onError == nil {
		m.onError = defaultOnError
	}
	if m.worker != nil && m.worker.random == nil {
		return nil, errors.New("shed: Options.Worker was not built by NewWorker")
	}
	if m.fleet != nil && m.fleet.t == nil {
		return nil, errors.New("shed: Options.Fleet was not built by NewFleet")
	}
	if c := o.Concurrency; c != nil {
		switch {
		case c.Throttler == nil:
			return nil, errors.New("shed: Options.Concurrency.Throttler is nil")
		case !c.Throttler.SupportsLeases():
			return nil, errors.New("shed: Options.Concurrency.Throttler's backend does not hold leases (Throttler.SupportsLeases)")
		case c.Key == nil:
			return nil, errors.New("shed: Options.Concurrency.Key is nil")
		}
		if err := c.Policy.Validate(); err != nil {
			return nil, reword("Options.Concurrency.Policy", err)
		}
		m.conc = c
	}
	if r := o.Rate; r != nil {
		if r.Throttler == nil {
			return nil, errors.New("shed: Options.Rate.Throttler is nil")
		}
		var ro throttler.MiddlewareOptions
		if r.Options != nil {
			ro = *r.Options
		}
		if ro.OnError == nil {
			ro.OnError = m.onError
		}
		mw, err := r.Throttler.Middleware(r.Policy, r.Key, &ro)
		if err != nil {
			return nil, reword("Options.Rate", err)
		}
		m.rate = mw
	}
	return m.wrap, nil
}

// chain is a built Middleware.
type chain struct {
	classify       Classifier
	worker         *Worker
	fleet          *Fleet
	conc           *Concurrency
	rate           func(http.Handler) http.Handler
	onError        func(http.ResponseWriter, *http.Request, error)
	onReleaseError func(*http.Request, error)
}

func (m *chain) wrap(next http.Handler) http.Handler {
	inner := next
	if m.rate != nil {
		// The rate middleware answers its refusals itself: HeaderLimiter
		// is set before it runs and removed once it lets the request
		// through, so it stays on exactly the responses it wrote.
		inner = m.rate(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Del(HeaderLimiter)
			next.ServeHTTP(w, r)
		}))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := m.classify(r)
		if m.worker != nil {
			if !m.worker.Admit(c) {
				w.Header().Set(HeaderLimiter, LimiterWorker)
				http.Error(w, "service overloaded: request shed, retry later", http.StatusServiceUnavailable)
				return
			}
			defer m.worker.Done()
		}
		if m.fleet != nil {
			a, err := m.fleet.Admit(r.Context(), c)
			if err != nil {
				w.Header().Set(HeaderLimiter, LimiterFleet)
				m.onError(w, r, err)
				return
			}
			defer m.release(r, a.Lease)
			if !a.Allowed {
				w.Header().Set(HeaderLimiter, LimiterFleet)
				w.Header().Set("X-RateLimit-Resource", m.fleet.Name())
				http.Error(w, "service overloaded: request shed, retry later", http.StatusServiceUnavailable)
				return
			}
		}
		if m.conc != nil {
			lease, ok := m.acquire(w, r)
			defer m.release(r, lease)
			if !ok {
				return
			}
		}
		if m.rate != nil {
			w.Header().Set(HeaderLimiter, LimiterRate)
		}
		inner.ServeHTTP(w, r)
	})
}

// acquire takes the request's concurrency lease, or answers the request
// and reports false.
func (m *chain) acquire(w http.ResponseWriter, r *http.Request) (throttler.Lease, bool) {
	h := w.Header()
	k, err := m.conc.Key(r)
	if err != nil {
		if !errors.Is(err, throttler.ErrNoKey) {
			err = fmt.Errorf("%w: %w", throttler.ErrNoKey, err)
		}
		h.Set(HeaderLimiter, LimiterConcurrency)
		m.onError(w, r, err)
		return throttler.Lease{}, false
	}
	l, d, err := m.conc.Throttler.Acquire(r.Context(), k, m.conc.Policy)
	if err != nil {
		h.Set(HeaderLimiter, LimiterConcurrency)
		m.onError(w, r, err)
		return l, false
	}
	if d.Allowed {
		return l, true
	}
	h.Set(HeaderLimiter, LimiterConcurrency)
	if m.conc.Policy.Name != "" {
		h.Set("X-RateLimit-Resource", m.conc.Policy.Name)
	}
	// A lease's RetryAfter is ResetAt - now (when the earliest held lease
	// expires), so the Reset names the instant Retry-After does, never an
	// earlier one, as the rate limit's headers do.
	httpheaders.SetCounts(h, d.Limit, d.Remaining, d.Used, d.ResetAt)
	retry := httpheaders.CeilSeconds(d.RetryAfter)
	h.Set("Retry-After", strconv.FormatInt(retry, 10))
	http.Error(w, fmt.Sprintf("too many concurrent requests: at most %d in flight; retry in %ds", d.Limit, retry), http.StatusTooManyRequests)
	return l, false
}

// release gives a lease back when the request ends, on a context the
// client's disconnection does not cancel: a lease released late still
// frees its slot long before its TTL.
func (m *chain) release(r *http.Request, l throttler.Lease) {
	if l.ID() == 0 {
		return
	}
	if _, err := l.Release(context.WithoutCancel(r.Context())); err != nil && m.onReleaseError != nil {
		m.onReleaseError(r, err)
	}
}

// defaultOnError answers with a status and its text alone, never the error
// (which may hold a client's key): 400 for a request that names no valid
// client, 503 with Retry-After: 1 for anything else (a failing store).
func defaultOnError(w http.ResponseWriter, r *http.Request, err error) {
	status := http.StatusServiceUnavailable
	if errors.Is(err, throttler.ErrNoKey) || throttler.IsInputError(err) {
		status = http.StatusBadRequest
	} else {
		w.Header().Set("Retry-After", "1")
	}
	http.Error(w, http.StatusText(status), status)
}
