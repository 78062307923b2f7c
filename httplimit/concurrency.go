package httplimit

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/throttlekit/throttlekit/throttler"
)

// Concurrency limits every key to p.Limit requests in flight at once
// (Stripe's concurrent requests limiter), through th's leases
// (throttler.Throttler.Acquire). A request holds a lease while the handler
// runs and gives it back when the handler returns, also when it panics or
// the client has gone: the release runs without the request's
// cancellation, and a lease never released stops counting after p.TTL. A
// release that fails is told to Options.OnReleaseError.
//
// A refused request never reaches the handler: it is answered with
// DeniedStatus, Retry-After (when the earliest held lease expires) and the
// X-RateLimit-* headers of the concurrency limit (-Resource, the policy's
// Name, if any), naming in -Reset the instant Retry-After does. An
// admitted request gets no header from Concurrency: the X-RateLimit-*
// headers of a success are those of a Rate after it. A request that could
// not be decided is answered by OnError (WriteError by default).
//
// It returns an error, naming what is wrong, for a Throttler whose backend
// holds no leases (throttler.Throttler.SupportsLeases; one New did not
// build holds none), an invalid policy, a nil key function or bad options.
func Concurrency(th *throttler.Throttler, p throttler.ConcurrencyPolicy, key KeyFunc, opts *Options) (func(http.Handler) http.Handler, error) {
	if !th.SupportsLeases() {
		return nil, errors.New("httplimit: Concurrency needs a Throttler, built by throttler.New, whose backend holds leases (Throttler.SupportsLeases)")
	}
	o, err := checked("Concurrency", p.Validate(), key, opts)
	if err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			k, err := keyOf(key, r)
			if err != nil {
				o.OnError(w, r, err)
				return
			}
			l, d, err := th.Acquire(r.Context(), k, p)
			if err != nil {
				o.OnError(w, r, err)
				return
			}
			if !d.Allowed {
				// A lease's RetryAfter is ResetAt - now (when the earliest
				// held lease expires), so the Reset names the instant
				// Retry-After does, never an earlier one.
				setHeaders(w.Header(), p.Name, d, d.ResetAt)
				refuse(w, o.DeniedStatus, d.RetryAfter, fmt.Sprintf("too many concurrent requests: at most %d in flight", d.Limit))
				return
			}
			defer release(r, l, o.OnReleaseError)
			next.ServeHTTP(w, r)
		})
	}, nil
}

// release gives l back when its request ends. Lease.Release runs without
// the cancellation of a client that has gone: a lease released late still
// frees its slot long before its TTL. A failure goes to onErr, if set.
func release(r *http.Request, l throttler.Lease, onErr func(*http.Request, error)) {
	if _, _, err := l.Release(r.Context()); err != nil && onErr != nil {
		onErr(r, err)
	}
}
