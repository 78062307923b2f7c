package memcached

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strconv"
	"strings"
	"unsafe"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/throttlekit/throttlekit/internal/nilness"
	"github.com/throttlekit/throttlekit/throttler"
)

// What can be known of the servers before the first call, and Check.

// clientSelector returns the ServerSelector a *memcache.Client picks its
// servers with; known is false for any other Client. gomemcache keeps it
// unexported, and every method that reaches it also dials, so it is read
// here through reflect: the only way to name the server of each call (a
// breaker per server) for the client the package doc builds, and to refuse,
// when the backend is built, a client that has no server (memcache.New()
// with none, or with addresses that ServerList.SetServers could not
// resolve, an error memcache.New drops), which would fail every call. A
// gomemcache release that renames the field is an error here: the fix,
// Options.Selector, is named, rather than every server silently sharing one
// breaker.
func clientSelector(c Client) (sel memcache.ServerSelector, known bool, err error) {
	mc, ok := c.(*memcache.Client)
	if !ok {
		return nil, false, nil
	}
	f := reflect.ValueOf(mc).Elem().FieldByName("selector")
	if !f.IsValid() || f.Type() != reflect.TypeFor[memcache.ServerSelector]() {
		return nil, false, errors.New("memcached: cannot see the servers of this *memcache.Client (its gomemcache version keeps them elsewhere): " +
			"build it with memcache.NewFromSelector(sel) and pass sel as Options.Selector, so that each server has its own breaker")
	}
	// Read once, at construction; nothing writes the field after
	// memcache.NewFromSelector.
	sel, _ = reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Interface().(memcache.ServerSelector)
	return sel, true, nil
}

// knownServers returns the selector of the client's servers (Options.Selector,
// else the one inside a *memcache.Client), nil when it cannot be seen (a
// Client of another type), or an error matching memcache.ErrNoServers when
// it lists no server.
func knownServers(c Client, sel memcache.ServerSelector) (memcache.ServerSelector, error) {
	what := "Options.Selector"
	if sel == nil {
		var known bool
		var err error
		if sel, known, err = clientSelector(c); !known {
			return nil, err
		}
		what = "the Client"
		if err := nilness.Check("memcached: the Client's ServerSelector", sel); err != nil {
			return nil, fmt.Errorf("%w (memcache.NewFromSelector(nil)): %w", err, memcache.ErrNoServers)
		}
	}
	n := 0
	_ = sel.Each(func(net.Addr) error { n++; return nil })
	if n == 0 {
		return nil, fmt.Errorf("memcached: %s lists no servers (memcache.New with none, or with addresses ServerList.SetServers could not resolve): every call would fail: %w", what, memcache.ErrNoServers)
	}
	return sel, nil
}

// Check reports whether every server answers: it reads one probe item
// (under the Prefix; nothing stores it) from each server of the client's
// ServerSelector (Options.Selector, or the one inside a *memcache.Client),
// or, for a Client whose servers it cannot see, from the server of one
// key. It returns nil when all answered, else the first failure, naming
// the server ("memcached 10.0.0.2:11211: check: dial tcp 10.0.0.2:11211:
// connect: connection refused") and matching throttler.ErrUnavailable.
// Call it at start-up, so that a wrong address stops the program instead
// of making every call fail (and a Throttler fail open). gomemcache takes
// no context: ctx is checked before each server, and the client's Timeout
// bounds each read.
func (b *Backend) Check(ctx context.Context) error {
	for _, key := range b.probeKeys() {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("memcached: check: %w", err)
		}
		_, err := b.c.Get(key)
		if err == nil || errors.Is(err, memcache.ErrCacheMiss) {
			continue
		}
		err = fmt.Errorf("memcached: check: %w", err)
		if !serverFailure(err) {
			// An answer that is not an item (a client error): the server
			// answered, but not as Memcached does; still a failure of the
			// server, not of a key.
			err = fmt.Errorf("%w (not a Memcached reply)", err)
		}
		return b.storeFailure(func() string { return key }, err)
	}
	return nil
}

// probeKeys returns one key per known server (every server a key can
// reach), or one key when the servers cannot be seen.
func (b *Backend) probeKeys() []string {
	base := b.opts.Prefix + "check:"
	if b.servers == nil {
		return []string{base + "0"}
	}
	left := map[string]bool{}
	_ = b.servers.Each(func(a net.Addr) error { left[a.String()] = true; return nil })
	var keys []string
	// gomemcache's ServerList spreads keys by a hash: 64 tries per server
	// miss one with a chance of about e^-64.
	for i := 0; len(left) > 0 && i < 64*max(1, len(left)+len(keys)); i++ {
		key := base + strconv.Itoa(i)
		addr, err := b.servers.PickServer(key)
		if err != nil {
			// No server: let the read fail as a call would.
			return append(keys, key)
		}
		if left[addr.String()] {
			delete(left, addr.String())
			keys = append(keys, key)
		}
	}
	return keys
}

// storeFailure marks err, from a call whose first item home names, as the
// failure of the server it came from (see classifyAt).
func (b *Backend) storeFailure(home func() string, err error) error {
	store := b.failedServer(home, err)
	name := store
	if name == "" {
		if addr := errAddr(err); addr != nil {
			name = b.serverName(addr.String())
		}
	}
	if name != "" {
		err = &namedError{server: name, err: err}
	}
	return throttler.StoreFailure(store, err)
}

// namedError puts the server that failed in place of the package's
// "memcached:" prefix, so that an error, and what a Throttler's Observe
// sees, says which server failed and why: "memcached 10.0.0.2:11211: get
// window of ...: dial tcp ...: connection refused".
type namedError struct {
	server string
	err    error
}

func (e *namedError) Error() string {
	msg := e.err.Error()
	if rest, ok := strings.CutPrefix(msg, "memcached:"); ok {
		return e.server + ":" + rest
	}
	return e.server + ": " + msg
}

func (e *namedError) Unwrap() error { return e.err }
