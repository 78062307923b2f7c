package httplimit

import (
	"errors"
	"fmt"
	"net"
	"net/http"
)

// KeyFunc names the client a request counts against. An error answers the
// request with 400 (see WriteError) and counts nothing.
type KeyFunc func(*http.Request) (string, error)

// ErrNoKey wraps a KeyFunc's error (unless the KeyFunc wrapped it already):
// the request does not carry what identifies its client, so nothing is
// counted and the request is answered by OnError (400 by default).
var ErrNoKey = errors.New("httplimit: request has no client key")

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

// keyOf is key's answer for r, its error wrapped in ErrNoKey: one prefix,
// as a KeyFunc may wrap ErrNoKey itself.
func keyOf(key KeyFunc, r *http.Request) (string, error) {
	k, err := key(r)
	if err != nil && !errors.Is(err, ErrNoKey) {
		err = fmt.Errorf("%w: %w", ErrNoKey, err)
	}
	return k, err
}
