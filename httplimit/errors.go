package httplimit

import (
	"context"
	"errors"
	"net/http"

	"github.com/throttlekit/throttlekit/throttler"
)

// statusClientClosedRequest is nginx's 499, which no RFC defines: the client
// went away before its answer.
const statusClientClosedRequest = 499

// WriteError answers a request that a middleware could not decide, with a
// status and its text alone: err may hold the client's key (often an API
// token or an e-mail address) and internal detail, which never belong in a
// response, so log it in an OnError of your own and then call WriteError.
// It is the default Options.OnError, and package shed answers its shedders'
// errors with it. The status says whose the failure is:
//
//   - 400 Bad Request: the request names no client (ErrNoKey) or a key the
//     store refuses (throttler.IsInputError: empty, too long); a retry of
//     the same request fails alike;
//   - 499 Client Closed Request (nginx's): the request's context was
//     cancelled, the client has gone. Nobody reads the answer; logs and
//     metrics see neither a server fault nor a bad request (and net/http
//     would otherwise log a 200 for a handler that writes nothing);
//   - 503 Service Unavailable with Retry-After: 1: the store failed and the
//     Throttler fails closed (throttler.ErrUnavailable, its Timeout
//     included), or the request's own deadline passed before the store
//     answered. The server could not decide in time; a retry may succeed;
//   - 500 Internal Server Error: any other error, which a Throttler does
//     not return.
//
// A client error is checked first (a bad key stays 400 whatever else
// happened), then the client's departure.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	status := statusOf(r, err)
	text := http.StatusText(status)
	switch status {
	case statusClientClosedRequest:
		text = "Client Closed Request"
	case http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", "1")
	}
	http.Error(w, text, status)
}

// statusOf is WriteError's status for err, met while deciding r.
func statusOf(r *http.Request, err error) int {
	switch ctxErr := r.Context().Err(); {
	case errors.Is(err, ErrNoKey) || throttler.IsInputError(err):
		return http.StatusBadRequest
	case errors.Is(ctxErr, context.Canceled):
		return statusClientClosedRequest
	case errors.Is(err, throttler.ErrUnavailable) || errors.Is(ctxErr, context.DeadlineExceeded):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}
