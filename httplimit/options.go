package httplimit

import (
	"fmt"
	"net/http"
)

// Options configure Rate and Concurrency. Nil options mean defaults.
type Options struct {
	// DeniedStatus answers a request over the limit: a 4xx or 5xx status.
	// default: 429
	DeniedStatus int
	// Refundable reports whether a response with this status cost nothing,
	// so that Rate gives its unit back. default: status == 304 Not Modified
	Refundable func(status int) bool
	// IETFHeaders makes Rate also set the RateLimit-Policy and RateLimit
	// headers of the IETF draft (draft-ietf-httpapi-ratelimit-headers).
	// default: false
	IETFHeaders bool
	// DryRunHeaders makes Rate set its headers also for a key that its
	// policy runs in dry run (throttler.Policy.EnforcedBy), which it otherwise
	// leaves without any: a client sees no sign of a limit not enforced on
	// it. Such a key never gets a denial's status or Retry-After.
	// default: false
	DryRunHeaders bool
	// OnError answers a request that could not be decided: a KeyFunc's
	// error, a key the store refuses, a failing store when the Throttler
	// fails closed, a client that has gone. err may hold the client's key:
	// log it, never write it to the response. default: WriteError, which maps
	// each to its status
	OnError func(w http.ResponseWriter, r *http.Request, err error)
	// OnReleaseError, if set, is told of a Concurrency lease whose release
	// failed (it stops counting after its TTL anyway). default: none
	OnReleaseError func(r *http.Request, err error)
}

// checked is what Rate and Concurrency (named by what) check alike: the
// policy's validity (valid), the key function and the options, with the
// options' defaults applied.
func checked(what string, valid error, key KeyFunc, o *Options) (Options, error) {
	if valid != nil {
		return Options{}, valid
	}
	if key == nil {
		return Options{}, fmt.Errorf("httplimit: %s needs a KeyFunc, got nil", what)
	}
	return o.withDefaults()
}

func (o *Options) withDefaults() (Options, error) {
	var out Options
	if o != nil {
		out = *o
	}
	if out.DeniedStatus == 0 {
		out.DeniedStatus = http.StatusTooManyRequests
	}
	if out.DeniedStatus < 400 || out.DeniedStatus > 599 {
		return out, fmt.Errorf("httplimit: Options.DeniedStatus must be a 4xx or 5xx status, got %d", out.DeniedStatus)
	}
	if out.Refundable == nil {
		out.Refundable = func(status int) bool { return status == http.StatusNotModified }
	}
	if out.OnError == nil {
		out.OnError = WriteError
	}
	return out, nil
}
