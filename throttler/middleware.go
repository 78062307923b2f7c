package throttler

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/felixge/httpsnoop"

	"github.com/throttlekit/throttlekit/internal/httpheaders"
)

// KeyFunc names the client a request counts against. An error answers the
// request with a 4xx and counts nothing.
type KeyFunc func(*http.Request) (string, error)

// ErrNoKey wraps a KeyFunc's error (unless the KeyFunc wrapped it already):
// the request does not carry what identifies its client, so nothing is
// counted and the request is answered by OnError (400 by default).
var ErrNoKey = errors.New("throttler: request has no client key")

// KeyByRemoteIP keys requests by the IP address of the connection's peer.
// Behind a proxy, use a KeyFunc that trusts the proxy's header instead.
func KeyByRemoteIP(r *http.Request) (string, error) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil || host == "" {
		return "", fmt.Errorf("remote address %q has no host", r.RemoteAddr)
	}
	return host, nil
}

// KeyByHeader keys requests by the value of a header, such as an API token
// or a user ID set by an authentication layer.
func KeyByHeader(name string) KeyFunc {
	return func(r *http.Request) (string, error) {
		v := r.Header.Get(name)
		if v == "" {
			return "", fmt.Errorf("header %s is empty", name)
		}
		return v, nil
	}
}

// MiddlewareOptions configure Middleware. Nil options mean defaults.
type MiddlewareOptions struct {
	// DeniedStatus answers a request over the limit: a 4xx or 5xx status.
	// default: 429
	DeniedStatus int
	// Refundable reports whether a response with this status cost nothing,
	// so its unit is given back. default: status == 304 Not Modified
	Refundable func(status int) bool
	// IETFHeaders also sets the RateLimit-Policy and RateLimit headers of
	// the IETF draft (draft-ietf-httpapi-ratelimit-headers). default: false
	IETFHeaders bool
	// OnError answers a request that could not be decided: the KeyFunc's
	// error or a key the backend refuses (the default answers 400), or a
	// backend failure when the Throttler fails closed (err matches
	// ErrUnavailable; the default answers 503 with Retry-After: 1). err may
	// hold the client's key: log it, never write it to the response. The
	// default writes only the status text. default: as described
	OnError func(w http.ResponseWriter, r *http.Request, err error)
}

func (o *MiddlewareOptions) withDefaults() (MiddlewareOptions, error) {
	var out MiddlewareOptions
	if o != nil {
		out = *o
	}
	if out.DeniedStatus == 0 {
		out.DeniedStatus = http.StatusTooManyRequests
	}
	if out.DeniedStatus < 400 || out.DeniedStatus > 599 {
		return out, fmt.Errorf("throttler: MiddlewareOptions.DeniedStatus must be a 4xx or 5xx status, got %d", out.DeniedStatus)
	}
	if out.Refundable == nil {
		out.Refundable = func(status int) bool { return status == http.StatusNotModified }
	}
	if out.OnError == nil {
		out.OnError = defaultOnError
	}
	return out, nil
}

// defaultOnError answers with a status and its text alone: errors carry
// client keys (often API tokens or e-mail addresses) and internal detail,
// which never belong in a response. Observe (on the Throttler) and a custom
// OnError see the error itself.
func defaultOnError(w http.ResponseWriter, r *http.Request, err error) {
	status := http.StatusBadRequest
	if errors.Is(err, ErrUnavailable) {
		status = http.StatusServiceUnavailable
		w.Header().Set("Retry-After", "1")
	}
	http.Error(w, http.StatusText(status), status)
}

// Middleware limits every request to p per key. It counts one unit at the
// start of a request, so concurrent requests can never exceed the last
// allowed one, and gives it back when the handler's response is refundable
// (304 Not Modified), also when the client has gone: the refund runs
// without the request's cancellation, bounded by the Throttler's Timeout.
// Every response carries the X-RateLimit-* headers of the single backend
// call that decided it; a denied request is answered with DeniedStatus and
// Retry-After, and never reaches the handler.
//
// X-RateLimit-Reset (and the IETF RateLimit's t) names an instant at which a
// client that returns is admitted if nobody else spent in between, on every
// algorithm: a denied answer's is never earlier than its Retry-After, and an
// answer with nothing remaining names when one unit fits again. It is the
// Decision's ResetAt except where that comes earlier: a sliding-window
// counter's ResetAt is the end of the current window, while the previous
// window's count may still weigh after it.
//
// It returns an error, naming what is wrong, for an invalid policy, a nil
// key function or bad options: a server misconfiguration fails when the
// server is built, never as a client error on every request. The writer
// the handler gets keeps every optional interface of the server's
// (http.Flusher, http.Hijacker, io.ReaderFrom, ...), so streaming works.
func (t *Throttler) Middleware(p Policy, key KeyFunc, opts *MiddlewareOptions) (func(http.Handler) http.Handler, error) {
	if t == nil || t.backend == nil {
		return nil, errors.New("throttler: Middleware called on a Throttler that New did not build")
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if key == nil {
		return nil, errors.New("throttler: Middleware needs a KeyFunc, got nil")
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			k, err := key(r)
			if err != nil {
				if !errors.Is(err, ErrNoKey) { // one prefix: a KeyFunc may wrap ErrNoKey itself
					err = fmt.Errorf("%w: %w", ErrNoKey, err)
				}
				o.OnError(w, r, err)
				return
			}
			d, now, err := t.takeOne(r.Context(), k, p)
			if err != nil {
				o.OnError(w, r, err)
				return
			}
			setHeaders(w.Header(), p, d, now, o.IETFHeaders)
			if !d.Allowed {
				retry := httpheaders.CeilSeconds(d.RetryAfter)
				w.Header().Set("Retry-After", strconv.FormatInt(retry, 10))
				http.Error(w, fmt.Sprintf("rate limit exceeded: %s; retry in %ds", rate(p), retry), o.DeniedStatus)
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
				if d, now, err := t.refund(context.WithoutCancel(r.Context()), k, p, 1, d); err == nil {
					setHeaders(w.Header(), p, d, now, o.IETFHeaders)
				}
			}), r)
		})
	}, nil
}

// setHeaders writes GitHub's X-RateLimit-* headers (and optionally the IETF
// draft's) from one decision, made at now: the instant the Throttler read
// for it, so that the clock is read once per decision. A degraded decision
// with no known count sets only the limit: the headers never claim what no
// store said. The reset they name is resetOf's.
func setHeaders(h http.Header, p Policy, d Decision, now time.Time, ietf bool) {
	if p.Name != "" {
		h.Set("X-RateLimit-Resource", p.Name)
	}
	reset := resetOf(p, d, now)
	httpheaders.SetCounts(h, d.Limit, d.Remaining, d.Used, reset)
	if ietf && !reset.IsZero() {
		name := p.Name
		if name == "" {
			name = "default"
		}
		// q and w are the policy's rate, for a token bucket too: its
		// burst is no quota per window (r may then exceed q, up to Burst).
		h.Set("RateLimit-Policy", fmt.Sprintf("%q;q=%d;w=%d", name, p.Limit, httpheaders.CeilSeconds(p.Window)))
		h.Set("RateLimit", fmt.Sprintf("%q;r=%d;t=%d", name, d.Remaining, httpheaders.CeilSeconds(reset.Sub(now))))
	}
}

// resetOf is the instant that X-RateLimit-Reset and the IETF RateLimit's t
// name for d, made at now under p (zero when d knows no count). A client
// that returns then is admitted if nobody else spent in between, on every
// algorithm, and a denied answer's reset is never before its Retry-After:
//   - a denied answer names ResetAt, or its earliest admission (the ms of
//     the call plus RetryAfter) when that is later: a sliding-window
//     counter's ResetAt is the end of the current window (the same on
//     every backend), and its wait may reach past it while the previous
//     window still weighs;
//   - a sliding-window counter's admission that leaves nothing names
//     ResetAt plus ceil(w/Limit) ms: at ResetAt the window now current
//     becomes the previous one and weighs its whole count (at most Limit),
//     and one unit fits once that weight is down to Limit - 1;
//   - any other answer names ResetAt: when the fixed window ends, the
//     bucket is full again, the log's newest entry ends.
func resetOf(p Policy, d Decision, now time.Time) time.Time {
	switch {
	case !d.Known():
		return time.Time{}
	case !d.Allowed:
		// The store counted from now's ms, truncated: the admission is an
		// instant that does not wobble with the sub-ms part of now.
		if at := time.UnixMilli(now.UnixMilli()).Add(d.RetryAfter); at.After(d.ResetAt) {
			return at
		}
	case p.Algorithm == SlidingWindow && d.Remaining == 0:
		w, l := p.Window.Milliseconds(), p.Limit
		return d.ResetAt.Add(time.Duration((w+l-1)/l) * time.Millisecond)
	}
	return d.ResetAt
}

// rate describes p for a person: "2 per 1h0m0s", and a token bucket's
// burst when it differs from Limit ("2 per 1h0m0s, burst 5"), so that a
// capacity is never presented as a quota per window.
func rate(p Policy) string {
	if p.Algorithm == TokenBucket && p.Capacity() != p.Limit {
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
