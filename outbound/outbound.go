// Package outbound limits the calls a program makes to a remote API, across
// every process that shares a store: an http.RoundTripper that waits for
// capacity before sending, and listens to what the remote says.
//
// A Transport wraps a base transport. Each request counts against a key
// and a Policy (per host by default; Options.Route for per-gateway or
// per-merchant keys): the Transport waits until the Throttler admits it
// (Throttler.Wait), or fails fast with a *LimitedError. When a response says
// the remote's limit is spent (a 429 or 503 with Retry-After, or
// RateLimit / X-RateLimit-* headers with nothing remaining and a reset), it
// pauses that key in the store until then, so that every worker of every
// process holds its calls to that key, not only the one that was told.
//
// # How a pause is stored
//
// Only the store's Take, Peek and Refund are used, so a pause works on every
// backend, through a router or a shadow. A pause is a fixed window of the
// policy named Options.PauseName ("outbound-pause"), Limit 1, on the
// request's key: a Take with Window = the pause opens it, ending when the
// remote said; a Peek before sending finds it (Used 1 until ResetAt). A
// window that is already open is not extended: the first report of a pause
// wins, and one that asks for longer while it lasts (from a call already in
// flight) is kept by its own process only.
//
// Cost: each request takes its unit (one call, more while it waits) and
// peeks the pause (one read, which a replica may serve, seeing a new pause
// one replication lag later): two store calls per request. The Peek comes
// after the unit is taken, so a pause that began while the request waited
// for capacity is seen; the unit is then refunded. A pause known in the
// process (learned from a response, or from a Peek) costs no store call
// until it ends. A response that asks for a pause costs one more Take.
//
// # Retries and bodies
//
// A request's body is never sent twice unless it can be rebuilt: by
// default a 429 or 503 is returned to the caller, after its pause was
// recorded. With Options.Retries, a request answered 429 or 503 with a
// pause is sent again once the pause is over, only when that is safe as
// net/http defines it for its own retries: no body or a GetBody to rebuild
// it, and an idempotent method or an Idempotency-Key (X-Idempotency-Key)
// header, which payment APIs use to make a POST safe to repeat.
package outbound

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/throttlekit/throttlekit/internal/nilness"
	"github.com/throttlekit/throttlekit/internal/sleep"
	"github.com/throttlekit/throttlekit/throttler"
)

// LimitedError is the error of a request that a Transport with FailFast did
// not send because it would have to wait; errors.AsType finds it (through
// the *url.Error of an http.Client too):
//
//	if le, ok := errors.AsType[*outbound.LimitedError](err); ok {
//		// retry in le.RetryAfter
//	}
type LimitedError struct {
	// RetryAfter is how long until the request could be sent.
	RetryAfter time.Duration
	// Paused reports that the remote asked to pause, rather than the
	// local limit being spent.
	Paused bool
}

func (e *LimitedError) Error() string {
	if e.Paused {
		return fmt.Sprintf("outbound: rate limited: the remote asked to pause for %v more", e.RetryAfter)
	}
	return fmt.Sprintf("outbound: rate limited: retry in %v", e.RetryAfter)
}

// Route is the limit one request counts against.
type Route struct {
	// Key names the remote limit, for example "gateway:merchant". Keys are
	// opaque to the store (see throttler.MaxKeyLen); hash the ones that are
	// secrets. The empty Key means the default key: the request's host, in
	// lower case, and port, the scheme's default when the URL has none
	// ("api.example.com:443"; a per-host policy needs no key of its own).
	Key string
	// Policy is the limit of Key. The zero Policy means Options.Policy.
	Policy throttler.Policy
}

// Pause is what a Transport learned from a response: every caller of Key
// should wait Duration before calling again.
type Pause struct {
	Key      string
	Status   int           // the response's status
	Duration time.Duration // from the response, at most Options.MaxPause
	// Err says why the pause could not be recorded in the store: then only
	// this process knows it. Nil when it was recorded, or when another
	// pause of the key was already open.
	Err error
}

// Options configure a Transport.
type Options struct {
	// Base sends the requests. default: http.DefaultTransport
	Base http.RoundTripper
	// Policy is the limit of every key that Route does not give one. Give
	// it a little less than the remote allows, for the calls in flight:
	// see docs/outbound.md. default: none; required unless Route gives
	// every request its policy
	Policy throttler.Policy
	// Route maps a request to its key and policy. An error fails the
	// request before anything is sent. default: the request's host and port
	// ("api.example.com:443", as an empty Route.Key) under Policy
	Route func(*http.Request) (Route, error)
	// FailFast returns a *LimitedError at once, instead of waiting, for a
	// request that would have to wait. default: false
	FailFast bool
	// Retries is how many times a request answered 429 or 503 with a pause
	// is sent again once the pause is over, if that is safe (see the
	// package documentation) and the pause ends before the request's
	// deadline; otherwise the response is returned. Never with FailFast.
	// default: 0
	Retries int
	// MaxPause bounds the pause a response can ask for, so that a wrong or
	// hostile header cannot stop a fleet for a day. default: 10m
	MaxPause time.Duration
	// PauseName names the policy that records pauses in the store, beside
	// each key's own: no policy given by Route may have this name.
	// default: "outbound-pause"
	PauseName string
	// OnPause, if set, is called when a response asks to pause a key, from
	// the goroutine of the request: keep it fast. default: none
	OnPause func(Pause)
}

func (o *Options) withDefaults() (Options, error) {
	var out Options
	if o != nil {
		out = *o
	}
	if out.Base == nil {
		out.Base = http.DefaultTransport
	} else if nilness.IsNil(out.Base) {
		return out, fmt.Errorf("outbound: Options.Base is a nil %T", out.Base)
	}
	if out.Route == nil || out.Policy != (throttler.Policy{}) {
		if err := out.Policy.Validate(); err != nil {
			return out, rename("Options.Policy", err)
		}
	}
	switch {
	case out.Retries < 0:
		return out, fmt.Errorf("outbound: Options.Retries must be >= 0, got %d", out.Retries)
	case out.MaxPause < 0:
		return out, fmt.Errorf("outbound: Options.MaxPause must be >= 0, got %v", out.MaxPause)
	case out.MaxPause > 0 && out.MaxPause < time.Millisecond:
		return out, fmt.Errorf("outbound: Options.MaxPause must be at least 1ms, got %v", out.MaxPause)
	}
	if out.MaxPause == 0 {
		out.MaxPause = 10 * time.Minute
	}
	if out.PauseName == "" {
		out.PauseName = "outbound-pause"
	}
	if err := pausePolicy(out.PauseName, time.Millisecond).Validate(); err != nil {
		return out, rename("Options.PauseName", err)
	}
	if named(out.Policy, out.PauseName) {
		return out, fmt.Errorf("outbound: Options.Policy is named %q, as the pauses are (Options.PauseName)", out.PauseName)
	}
	return out, nil
}

// Transport is an http.RoundTripper that waits for capacity before each
// request and pauses a key across the fleet when its remote says so. Build
// it with New; it is safe for concurrent use, and meant to be shared by
// every worker of a process (an http.Client's Transport).
type Transport struct {
	th     *throttler.Throttler
	opts   Options
	pauses pauseCache

	// The world, which tests replace (export_test.go): the clock that
	// pauses and deadlines are measured on, a sleep that a context ends,
	// and the jitter of a pause's end.
	now    func() time.Time
	sleep  func(ctx context.Context, d time.Duration) error
	jitter func(bound time.Duration) time.Duration
}

var _ http.RoundTripper = (*Transport)(nil)

// New returns a Transport that limits requests through th, whose store
// (backend/redis for a fleet) every process calling the same remote must
// share. It returns an error naming the problem for a nil Throttler and for
// options that cannot work: no valid Policy without a Route, a negative
// Retries or MaxPause, an invalid PauseName.
func New(th *throttler.Throttler, opts *Options) (*Transport, error) {
	if th == nil {
		return nil, errors.New("outbound: New needs a Throttler, got nil")
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if o.Policy.Composite() && !th.SupportsComposites() {
		return nil, fmt.Errorf("outbound: Options.Policy is a composite, but the Throttler's backend takes none "+
			"(Throttler.SupportsComposites): %w", throttler.ErrInvalidPolicy)
	}
	return &Transport{th: th, opts: o, pauses: pauseCache{until: map[string]time.Time{}},
		now: time.Now, sleep: sleep.Context, jitter: sleep.UpTo}, nil
}

// RoundTrip sends req once its key has capacity and no pause, and learns
// from the response. Its errors: the Route's; the Throttler's (bad input,
// throttler.ErrUnavailable from one that fails closed while its store is
// down); a *LimitedError with FailFast; the context's, wrapped, when it ends
// while waiting; throttler.ErrWouldExceedDeadline, at once, when the wait
// would outlast the request's deadline, also for a request queued behind
// others waiting for its key (Throttler.WaitN says how it knows); and the
// base transport's.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	r, err := t.route(req)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	ctx := req.Context()
	for retries := 0; ; retries++ {
		if err := t.admit(ctx, r); err != nil {
			closeBody(req)
			return nil, err
		}
		resp, err := t.opts.Base.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		pause, ok := t.learn(ctx, r.Key, resp)
		if !ok || retries >= t.opts.Retries || t.opts.FailFast || !retryable(resp.StatusCode) || !replayable(req) {
			return resp, nil
		}
		if deadline, ok := ctx.Deadline(); ok && !t.now().Add(pause).Before(deadline) {
			return resp, nil // the retry could not be sent in time: the answer is this one
		}
		next, err := rewind(req)
		if err != nil {
			return resp, nil
		}
		discard(resp)
		req = next
	}
}

// CloseIdleConnections closes the base transport's idle connections, if it
// keeps any, as http.Client.CloseIdleConnections expects.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.opts.Base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// route returns req's Route, its Key and Policy filled in.
func (t *Transport) route(req *http.Request) (Route, error) {
	var r Route
	if t.opts.Route != nil {
		var err error
		if r, err = t.opts.Route(req); err != nil {
			return r, fmt.Errorf("outbound: Options.Route: %w", err)
		}
	}
	if r.Key == "" {
		var err error
		if r.Key, err = hostKey(req); err != nil {
			return r, err
		}
	}
	if r.Policy == (throttler.Policy{}) {
		r.Policy = t.opts.Policy
	}
	if named(r.Policy, t.opts.PauseName) {
		return r, fmt.Errorf("outbound: Options.Route gave a policy named %q, as the pauses are (Options.PauseName)", t.opts.PauseName)
	}
	return r, nil
}

// hostKey is the default key of a request: its host, in lower case, and
// port, the scheme's default when the URL has none ("api.example.com:443").
func hostKey(req *http.Request) (string, error) {
	if req.URL == nil {
		return "", errors.New("outbound: request has no URL")
	}
	host := strings.ToLower(req.URL.Hostname())
	if host == "" {
		return "", errors.New("outbound: request URL has no host")
	}
	port := req.URL.Port()
	if port == "" {
		switch strings.ToLower(req.URL.Scheme) {
		case "https":
			port = "443"
		case "http":
			port = "80"
		default:
			return host, nil
		}
	}
	return net.JoinHostPort(host, port), nil
}

// admit returns once r may be sent: no pause known for its key, and a unit
// of its policy taken.
func (t *Transport) admit(ctx context.Context, r Route) error {
	for {
		if left := t.pauses.left(r.Key, t.now()); left > 0 {
			if err := t.waitPause(ctx, left); err != nil {
				return err
			}
			continue
		}
		taken, err := t.take(ctx, r)
		if err != nil {
			return err
		}
		// Checked after the unit was taken, so that a pause that began
		// while this request waited for it is seen.
		left := t.pauses.left(r.Key, t.now())
		if left <= 0 {
			d, err := t.th.Peek(ctx, r.Key, pausePolicy(t.opts.PauseName, time.Millisecond))
			if err != nil {
				t.refund(ctx, r, taken)
				return rename("checking for a pause", err)
			}
			if !d.Allowed && d.RetryAfter > 0 {
				left = d.RetryAfter
				now := t.now()
				t.pauses.extend(r.Key, now.Add(left), now)
			}
		}
		if left <= 0 {
			return nil
		}
		t.refund(ctx, r, taken) // the unit goes back: nothing is sent until the pause ends
	}
}

// take takes one unit of r's policy, waiting for it unless FailFast, and
// returns the decision that took it.
func (t *Transport) take(ctx context.Context, r Route) (throttler.Decision, error) {
	if !t.opts.FailFast {
		d, err := t.th.Wait(ctx, r.Key, r.Policy)
		return d, rename("waiting for capacity", err)
	}
	d, err := t.th.Allow(ctx, r.Key, r.Policy)
	if err != nil {
		return d, rename("taking capacity", err)
	}
	if !d.Allowed {
		return d, &LimitedError{RetryAfter: d.RetryAfter}
	}
	return d, nil
}

// refund gives back a unit taken for a request that is not sent. It is
// best effort: a failure leaves the unit counted, which only errs on the
// side of the remote's limit.
func (t *Transport) refund(ctx context.Context, r Route, taken throttler.Decision) {
	_, _ = t.th.Refund(context.WithoutCancel(ctx), r.Key, r.Policy, 1, taken)
}

// waitPause sleeps until a pause that has left to run is over, plus a
// jitter of up to a tenth of it (1ms to 100ms, as Wait's) so that the fleet
// does not wake at once, or returns why it will not.
func (t *Transport) waitPause(ctx context.Context, left time.Duration) error {
	if t.opts.FailFast {
		return &LimitedError{RetryAfter: left, Paused: true}
	}
	extra := t.jitter(min(max(left/10, time.Millisecond), 100*time.Millisecond))
	if deadline, ok := ctx.Deadline(); ok {
		until := deadline.Sub(t.now())
		if left >= until {
			return fmt.Errorf("outbound: the remote asked to pause for %v more, and the request's deadline is in %v: %w", left, until, throttler.ErrWouldExceedDeadline)
		}
		extra = min(extra, (until-left)/2)
	}
	if err := t.sleep(ctx, left+extra); err != nil {
		return fmt.Errorf("outbound: request ended while its key was paused: %w", err)
	}
	return nil
}

// learn records the pause that resp asks for, if any, in the process and
// in the store, and returns it.
func (t *Transport) learn(ctx context.Context, key string, resp *http.Response) (time.Duration, bool) {
	now := t.now()
	d, ok := pauseFrom(resp.Header, resp.StatusCode, now)
	if !ok {
		return 0, false
	}
	d = min(d, t.opts.MaxPause)
	t.pauses.extend(key, now.Add(d), now)
	// The caller may stop caring once it has its answer; the fleet must
	// still learn the pause. The Throttler bounds the call by its Timeout.
	stored, err := t.th.Allow(context.WithoutCancel(ctx), key, pausePolicy(t.opts.PauseName, d))
	if err == nil && !stored.Allowed && stored.RetryAfter > 0 {
		// A pause was already open, maybe longer: hold until it ends too.
		t.pauses.extend(key, now.Add(stored.RetryAfter), now)
	}
	if t.opts.OnPause != nil {
		if err != nil {
			err = rename("recording a pause", err)
		}
		t.opts.OnPause(Pause{Key: key, Status: resp.StatusCode, Duration: d, Err: err})
	}
	return d, true
}

// pausePolicy is the fixed window that records a pause of d: Limit 1, so
// that the first Take opens it and later ones, denied, read when it ends.
// Named, so that windows of every length share one identity per key.
func pausePolicy(name string, d time.Duration) throttler.Policy {
	return throttler.Policy{Name: name, Limit: 1, Window: ceilMillis(d)}
}

// retryable reports whether a response with status refused the request
// for a pause, without acting on it.
func retryable(status int) bool {
	return status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable
}

// replayable reports whether req may be sent again, as net/http decides for
// its own retries: its body can be rebuilt, and sending it twice does what
// sending it once does.
func replayable(req *http.Request) bool {
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return false
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	_, key := req.Header["Idempotency-Key"]
	_, xkey := req.Header["X-Idempotency-Key"]
	return key || xkey
}

// rewind returns a copy of req to send again, with a fresh body.
func rewind(req *http.Request) (*http.Request, error) {
	next := req.Clone(req.Context())
	if req.Body != nil && req.Body != http.NoBody {
		body, err := req.GetBody()
		if err != nil {
			return nil, err
		}
		next.Body = body
	}
	return next, nil
}

// discard reads a little of a response that will not be returned, so that
// its connection can be reused, and closes it.
func discard(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}

// closeBody closes the body of a request that will not be sent, as a
// RoundTripper must.
func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// rename prefixes an error of package throttler with what the Transport
// was doing, with one package prefix ("outbound: waiting for capacity:
// invalid key: empty"); errors.Is still matches the throttler's sentinels.
func rename(what string, err error) error {
	if err == nil {
		return nil
	}
	return &renamed{msg: "outbound: " + what + ": " + strings.TrimPrefix(err.Error(), "throttler: "), err: err}
}

type renamed struct {
	msg string
	err error
}

func (e *renamed) Error() string { return e.msg }
func (e *renamed) Unwrap() error { return e.err }

// named reports whether p, or a member of the composite p (throttler.All),
// is named name: such a policy would count in the pauses' state.
func named(p throttler.Policy, name string) bool {
	for _, m := range p.Members() {
		if m.Name == name {
			return true
		}
	}
	return p.Name == name
}
