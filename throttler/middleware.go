package throttler

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"
)

// KeyFunc names the client a request counts against. An error answers the
// request with a 4xx and counts nothing.
type KeyFunc func(*http.Request) (string, error)

// ErrNoKey is returned by the provided KeyFuncs when a request does not
// carry what identifies its client.
var ErrNoKey = errors.New("throttler: request has no client key")

// KeyByRemoteIP keys requests by the IP address of the connection's peer.
// Behind a proxy, use a KeyFunc that trusts the proxy's header instead.
func KeyByRemoteIP(r *http.Request) (string, error) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil || host == "" {
		return "", fmt.Errorf("%w: remote address %q", ErrNoKey, r.RemoteAddr)
	}
	return host, nil
}

// KeyByHeader keys requests by the value of a header, such as an API token
// or a user ID set by an authentication layer.
func KeyByHeader(name string) KeyFunc {
	return func(r *http.Request) (string, error) {
		v := r.Header.Get(name)
		if v == "" {
			return "", fmt.Errorf("%w: header %s is empty", ErrNoKey, name)
		}
		return v, nil
	}
}

// MiddlewareOptions configure Middleware. Nil options mean defaults.
type MiddlewareOptions struct {
	// DeniedStatus answers a request over the limit. default: 429
	DeniedStatus int
	// Refundable reports whether a response with this status cost nothing,
	// so its unit is given back. default: status == 304 Not Modified
	Refundable func(status int) bool
	// IETFHeaders also sets the RateLimit-Policy and RateLimit headers of
	// the IETF draft (draft-ietf-httpapi-ratelimit-headers). default: false
	IETFHeaders bool
	// OnError answers a request that could not be decided: the KeyFunc's
	// error or bad input (status 400 by default), or a backend failure when
	// the Throttler fails closed (status 503 by default).
	OnError func(w http.ResponseWriter, r *http.Request, err error)
}

func (o *MiddlewareOptions) withDefaults() MiddlewareOptions {
	var out MiddlewareOptions
	if o != nil {
		out = *o
	}
	if out.DeniedStatus == 0 {
		out.DeniedStatus = http.StatusTooManyRequests
	}
	if out.Refundable == nil {
		out.Refundable = func(status int) bool { return status == http.StatusNotModified }
	}
	if out.OnError == nil {
		out.OnError = defaultOnError
	}
	return out
}

func defaultOnError(w http.ResponseWriter, r *http.Request, err error) {
	status := http.StatusBadRequest
	if errors.Is(err, ErrUnavailable) {
		status = http.StatusServiceUnavailable
		w.Header().Set("Retry-After", "1")
	}
	http.Error(w, err.Error(), status)
}

// Middleware limits every request to p per key. It counts one unit at the
// start of a request, so concurrent requests can never exceed the last
// allowed one, and gives it back when the handler's response is refundable
// (304 Not Modified). Every response carries the X-RateLimit-* headers of
// the single backend call that decided it; a denied request is answered
// with DeniedStatus and Retry-After, and never reaches the handler.
func (t *Throttler) Middleware(p Policy, key KeyFunc, opts *MiddlewareOptions) func(http.Handler) http.Handler {
	o := opts.withDefaults()
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			k, err := key(r)
			if err != nil {
				o.OnError(w, r, fmt.Errorf("throttler: cannot identify the client: %w", err))
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
				http.Error(w, fmt.Sprintf("rate limit exceeded: %d per %v; retry in %ds", d.Limit, p.Window, ceilSeconds(d.RetryAfter)), o.DeniedStatus)
				return
			}
			rw := &refundWriter{ResponseWriter: w, refund: func(status int) {
				if !o.Refundable(status) {
					return
				}
				// The unit goes back before the headers are sent, so they
				// show the count after the refund.
				if d, err := t.Refund(r.Context(), k, p, 1); err == nil {
					t.setHeaders(w.Header(), p, d, o.IETFHeaders)
				}
			}}
			next.ServeHTTP(rw, r)
		})
	}
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
		h.Set("RateLimit-Policy", fmt.Sprintf("%q;q=%d;w=%d", name, d.Limit, ceilSeconds(p.Window)))
		h.Set("RateLimit", fmt.Sprintf("%q;r=%d;t=%d", name, d.Remaining, ceilSeconds(d.ResetAt.Sub(t.opts.Clock()))))
	}
}

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// refundWriter calls refund with the status just before the headers go out.
type refundWriter struct {
	http.ResponseWriter
	refund      func(status int)
	wroteHeader bool
}

func (w *refundWriter) WriteHeader(status int) {
	if !w.wroteHeader && status >= 200 {
		w.wroteHeader = true
		w.refund(status)
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *refundWriter) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer (Flush,
// Hijack, deadlines).
func (w *refundWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
