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
// Every response carries the X-RateLimit-* headers of
// the single backend call that decided it; a denied request is answered
// with DeniedStatus and Retry-After, and never reaches the handler.
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
			d, err := t.Allow(r.Context(), k, p)
			if err != nil {
				o.OnError(w, r, err)
				return
			}
			t.setHeaders(w.Header(), p, d, o.IETFHeaders)
			if !d.Allowed {
				w.Header().Set("Retry-After", strconv.FormatInt(ceilSeconds(d.RetryAfter), 10))
				http.Error(w, fmt.Sprintf("rate limit exceeded: %s; retry in %ds", rate(p), ceilSeconds(d.RetryAfter)), o.DeniedStatus)
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
				if d, err := t.Refund(context.WithoutCancel(r.Context()), k, p, 1, d); err == nil {
					t.setHeaders(w.Header(), p, d, o.IETFHeaders)
				}
			}), r)
		})
	}, nil
}

// setHeaders writes GitHub's X-RateLimit-* headers (and optionally the IETF
// draft's) from one decision. A degraded decision with no known count sets
// only the limit: the headers never claim what no store said.
func (t *Throttler) setHeaders(h http.Header, p Policy, d Decision, ietf bool) {
	h.Set("X-RateLimit-Limit", strconv.FormatInt(d.Limit, 10))
	if p.Name != "" {
		h.Set("X-RateLimit-Resource", p.Name)
	}
	if !d.Known() {
		h.Del("X-RateLimit-Remaining")
		h.Del("X-RateLimit-Used")
		h.Del("X-RateLimit-Reset")
		return
	}
	h.Set("X-RateLimit-Remaining", strconv.FormatInt(d.Remaining, 10))
	h.Set("X-RateLimit-Used", strconv.FormatInt(d.Used, 10))
	// Rounded up: a client that waits until this second is never early.
	h.Set("X-RateLimit-Reset", strconv.FormatInt(d.ResetUnix(), 10))
	if ietf {
		name := p.Name
		if name == "" {
			name = "default"
		}
		// q and w are the policy's rate, for a token bucket too: its
		// burst is no quota per window (r may then exceed q, up to Burst).
		h.Set("RateLimit-Policy", fmt.Sprintf("%q;q=%d;w=%d", name, p.Limit, ceilSeconds(p.Window)))
		h.Set("RateLimit", fmt.Sprintf("%q;r=%d;t=%d", name, d.Remaining, ceilSeconds(d.ResetAt.Sub(t.opts.Clock()))))
	}
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

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
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
