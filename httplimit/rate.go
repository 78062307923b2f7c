package httplimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/felixge/httpsnoop"

	"github.com/throttlekit/throttlekit/throttler"
)

// Rate limits every request to p per key, through th. It counts one unit
// at the start of a request, so concurrent requests can never exceed the
// last allowed one, and gives it back when the handler's response is
// refundable (Options.Refundable: 304 Not Modified), also when the client
// has gone: the refund runs without the request's cancellation, bounded by
// the Throttler's Timeout. Every response carries the X-RateLimit-* headers
// of the single backend call that decided it (see the package doc); a
// denied request is answered with DeniedStatus, Retry-After and a body
// stating the rate, and never reaches the handler. A key that p runs in dry
// run (throttler.Policy.EnforcedBy) is never refused, and gets no
// X-RateLimit-* headers unless Options.DryRunHeaders asks for them. A request that could
// not be decided is answered by OnError (WriteError by default).
//
// It returns an error, naming what is wrong, for a nil Throttler, an
// invalid policy, a nil key function or bad options: a server
// misconfiguration fails when the server is built, never as a client error
// on every request. (A zero Throttler, which throttler.New did not build,
// fails every call with an error, which OnError answers: 500 by default,
// never an admission.) The writer the handler gets
// keeps every optional interface of the server's (http.Flusher,
// http.Hijacker, io.ReaderFrom, ...), so streaming works.
func Rate(th *throttler.Throttler, p throttler.Policy, key KeyFunc, opts *Options) (func(http.Handler) http.Handler, error) {
	if th == nil {
		return nil, errors.New("httplimit: Rate needs a Throttler built by throttler.New, got nil")
	}
	o, err := checked("Rate", p.Validate(), key, opts)
	if err != nil {
		return nil, err
	}
	if p.Composite() && !th.SupportsComposites() {
		return nil, errNoComposites
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			k, err := keyOf(key, r)
			if err != nil {
				o.OnError(w, r, err)
				return
			}
			d, err := th.Allow(r.Context(), k, p)
			if err != nil {
				o.OnError(w, r, err)
				return
			}
			// A key the policy does not enforce (dry run) is told
			// nothing of it, unless Options.DryRunHeaders asks.
			headers := o.DryRunHeaders || enforced(p, k, d)
			shown := audience{key: k, dryRun: o.DryRunHeaders}
			if headers {
				setRateHeaders(w.Header(), p, d, o.IETFHeaders, shown)
			}
			if !d.Allowed {
				refuse(w, o.DeniedStatus, d.RetryAfter, "rate limit exceeded: "+rate(bindingOf(p, d)))
				return
			}
			next.ServeHTTP(refundOnce(w, func(status int) {
				if !o.Refundable(status) {
					return
				}
				// The unit goes back before the headers are sent, so they
				// show the count after the refund. A client that has gone
				// (its context cancelled) still gets its unit back: the
				// refund runs without the cancellation, bounded by the
				// Throttler's Timeout, as a lease's Release does.
				if d, err := th.Refund(context.WithoutCancel(r.Context()), k, p, 1, d); err == nil && headers {
					setRateHeaders(w.Header(), p, d, o.IETFHeaders, shown)
				}
			}), r)
		})
	}, nil
}

// audience is who reads a response's headers: the client of key, and
// whether Options.DryRunHeaders shows it what runs in dry run for it.
type audience struct {
	key    string
	dryRun bool
}

// shown reports whether the headers show member m of a composite: not when
// it is in dry run for the key (its numbers are not in the composite's
// Decision either, see throttler.Decision.Binding), unless DryRunHeaders.
func (a audience) shown(m throttler.Policy) bool {
	return a.dryRun || enforcedFor(m, a.key)
}

// enforced reports whether p is enforced for key k, whose decision is d:
// a denial is, a would-be denial is not, and an admission asks
// p's Enforcer (the Throttler asks it only of denials). A composite whose
// members have their own enforcement is enforced when any member is.
func enforced(p throttler.Policy, k string, d throttler.Decision) bool {
	switch {
	case !d.Allowed:
		return true
	case p.Composite() && p.Enforcer() == nil:
		// Its members may have their own: enforced if any is.
		for _, m := range p.Members() {
			if enforcedFor(m, k) {
				return true
			}
		}
		return false
	case d.WouldDeny:
		return false
	}
	return enforcedFor(p, k)
}

// enforcedFor reports whether p's own Enforcer, if it has one, enforces k.
func enforcedFor(p throttler.Policy, k string) bool {
	e := p.Enforcer()
	return e == nil || e.Enforced(k)
}

// setRateHeaders writes the headers of a rate decision at the instant it
// was made (d.At, the Throttler's reading of its clock for it), so that the
// clock is read once per decision. A degraded decision with no known count
// sets only the limit.
func setRateHeaders(h http.Header, p throttler.Policy, d throttler.Decision, ietf bool, shown audience) {
	if p.Composite() {
		setCompositeHeaders(h, p, d, ietf, shown)
		return
	}
	reset := resetOf(p, d)
	setHeaders(h, p.Name, d, reset)
	if ietf && !reset.IsZero() {
		setIETF(h, p, d, reset)
	}
}

// rate describes p for a person: "2 per 1h0m0s", and a token bucket's
// burst when it differs from Limit ("2 per 1h0m0s, burst 5"), so that a
// capacity is never presented as a quota per window.
func rate(p throttler.Policy) string {
	if p.Algorithm == throttler.TokenBucket && p.Capacity() != p.Limit {
		return fmt.Sprintf("%d per %v, burst %d", p.Limit, p.Window, p.Capacity())
	}
	return fmt.Sprintf("%d per %v", p.Limit, p.Window)
}

// refundOnce wraps w so that refund runs with the response's status just
// before its headers go out, whichever method sends them first (WriteHeader,
// Write, ReadFrom, Flush). httpsnoop keeps every optional interface that w
// has, and only those, so a streaming handler still finds its Flusher.
func refundOnce(w http.ResponseWriter, refund func(status int)) http.ResponseWriter {
	sent := false
	before := func(status int) {
		if !sent {
			sent = true
			refund(status)
		}
	}
	return httpsnoop.Wrap(w, httpsnoop.Hooks{
		WriteHeader: func(next httpsnoop.WriteHeaderFunc) httpsnoop.WriteHeaderFunc {
			return func(status int) {
				if status >= 200 { // 1xx informational responses are not the answer
					before(status)
				}
				next(status)
			}
		},
		Write: func(next httpsnoop.WriteFunc) httpsnoop.WriteFunc {
			return func(b []byte) (int, error) { before(http.StatusOK); return next(b) }
		},
		WriteString: func(next httpsnoop.WriteStringFunc) httpsnoop.WriteStringFunc {
			return func(s string) (int, error) { before(http.StatusOK); return next(s) }
		},
		ReadFrom: func(next httpsnoop.ReadFromFunc) httpsnoop.ReadFromFunc {
			return func(src io.Reader) (int64, error) { before(http.StatusOK); return next(src) }
		},
		Flush: func(next httpsnoop.FlushFunc) httpsnoop.FlushFunc {
			return func() { before(http.StatusOK); next() }
		},
		FlushError: func(next httpsnoop.FlushErrorFunc) httpsnoop.FlushErrorFunc {
			return func() error { before(http.StatusOK); return next() }
		},
	})
}
