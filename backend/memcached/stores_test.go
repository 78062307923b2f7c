package memcached

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/throttlekit/throttlekit/throttler"
)

// twoServers is the selector of a client over two servers; nothing dials
// them.
func twoServers(t *testing.T) *memcache.ServerList {
	t.Helper()
	sel := new(memcache.ServerList)
	if err := sel.SetServers("127.0.0.1:1", "127.0.0.1:2"); err != nil {
		t.Fatal(err)
	}
	return sel
}

// pick is the address the selector gives an item.
func pick(t *testing.T, sel memcache.ServerSelector, item string) net.Addr {
	t.Helper()
	addr, err := sel.PickServer(item)
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// Store names the server of the item every call on the key reads first:
// the head of a fixed window, the state item of the other algorithms. The
// client's own servers name it when the Options give no Selector, so that
// the client of the package doc gets a breaker per server.
func TestStoreNamesTheServerOfTheKeysItems(t *testing.T) {
	sel := twoServers(t)
	servers := []string{"127.0.0.1:1", "127.0.0.1:2"}
	for name, b := range map[string]*Backend{
		"Options.Selector": mustNew(t, newFakeClient(), &Options{Selector: sel}),
		"memcache.New":     mustNew(t, memcache.New(servers...), nil),
	} {
		t.Run(name, func(t *testing.T) { assertStoresNamed(t, b, sel) })
	}
	if got := mustNew(t, newFakeClient(), nil).store(throttler.OpTake, "k", throttler.PerMinute(1)); got != "" {
		t.Errorf("a Client whose servers cannot be seen, without a Selector: Store %q, want one store", got)
	}
}

// assertStoresNamed checks that b names, for each key, the server sel picks
// for the key's first item, and that both servers are named.
func assertStoresNamed(t *testing.T, b *Backend, sel memcache.ServerSelector) {
	t.Helper()
	seen := map[string]bool{}
	for _, alg := range []throttler.Algorithm{throttler.FixedWindow, throttler.TokenBucket} {
		p := throttler.Policy{Name: "api", Limit: 3, Window: time.Minute, Algorithm: alg}
		for i := range 50 {
			key := fmt.Sprint("user-", i)
			k := newItemKeys(b.opts.Prefix, p, key)
			item := k.head()
			if alg != throttler.FixedWindow {
				item = k.state()
			}
			want := "memcached " + pick(t, sel, item).String()
			if got := b.store(throttler.OpTake, key, p); got != want {
				t.Fatalf("%v %q: Store %q, want %q", alg, key, got, want)
			}
			seen[want] = true
		}
	}
	if len(seen) != 2 {
		t.Errorf("servers named %v, want both", seen)
	}
}

func TestSelectorMustNotBeANilPointer(t *testing.T) {
	var sel *memcache.ServerList
	_, err := New(newFakeClient(), &Options{Selector: sel})
	if err == nil || err.Error() != "memcached: Options.Selector is a nil *memcache.ServerList" {
		t.Errorf("err %v", err)
	}
}

// Each failure says whose it is: a server's (throttler.ErrUnavailable,
// naming the server), the key's (throttler.ErrKeyState: a corrupt item or a
// key Memcached refuses to count, which must never open a breaker for
// every key), or neither.
func TestFailuresAreClassified(t *testing.T) {
	p := throttler.Policy{Name: "api", Limit: 3, Window: time.Minute}
	ctx := context.Background()
	const store, key, neither = "store", "key", ""
	timeout := func(addr string) error {
		a, _ := net.ResolveTCPAddr("tcp", addr)
		return &net.OpError{Op: "read", Net: "tcp", Addr: a, Err: &timeoutErr{}}
	}
	tests := []struct {
		name string
		err  error // returned by the client's first get
		want string
	}{
		{"read timeout", timeout("127.0.0.1:1"), store},
		{"refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, store},
		{"connect timeout", &memcache.ConnectTimeoutError{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2}}, store},
		{"server error", memcache.ErrServerError, store},
		{"SERVER_ERROR reply", fmt.Errorf("memcache: unexpected response line from %q: %q", "add", "SERVER_ERROR out of memory storing object\r\n"), store},
		{"SERVER_ERROR read as a number", &strconv.NumError{Func: "ParseUint", Num: "SERVER_ERROR out of memory", Err: strconv.ErrSyntax}, store},
		{"broken reply", errors.New("memcache: corrupt get result read"), store},
		{"no servers", memcache.ErrNoServers, store},
		{"CLIENT_ERROR", errors.New("memcache: client error: cannot increment or decrement non-numeric value"), key},
		{"malformed key", memcache.ErrMalformedKey, neither},
		{"deadline", context.DeadlineExceeded, neither},
		{"something else", errors.New("boom"), neither},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, sel := range []memcache.ServerSelector{nil, twoServers(t)} {
				f := newFakeClient()
				b := mustNew(t, f, &Options{Selector: sel, NoCache: true})
				f.setBefore(func(op, _ string) error { return tt.err })
				_, err := b.Take(ctx, "k", p, 1, t0)
				if !errors.Is(err, tt.err) || !strings.HasPrefix(err.Error(), "memcached") || !strings.HasSuffix(err.Error(), tt.err.Error()) {
					t.Fatalf("err %v, want memcached… %v", err, tt.err)
				}
				if got := errors.Is(err, throttler.ErrUnavailable); got != (tt.want == store) {
					t.Errorf("store failure %v, want %v (%v)", got, tt.want == store, err)
				}
				if got := errors.Is(err, throttler.ErrKeyState); got != (tt.want == key) {
					t.Errorf("key failure %v, want %v (%v)", got, tt.want == key, err)
				}
				if tt.want != store {
					continue
				}
				want := ""
				if sel != nil {
					want = b.store(throttler.OpTake, "k", p)
					if tt.name == "read timeout" {
						want = "memcached 127.0.0.1:1" // the address in the error
					}
					if tt.name == "connect timeout" {
						want = "memcached 127.0.0.1:2"
					}
				}
				if got := blamedStore(t, err); got != want {
					t.Errorf("blamed %q, want %q", got, want)
				}
				// The message names the server, when anything tells it, in
				// place of the package's prefix.
				prefix := want
				switch {
				case prefix != "":
				case tt.name == "read timeout":
					prefix = "memcached 127.0.0.1:1"
				case tt.name == "connect timeout":
					prefix = "memcached 127.0.0.1:2"
				default:
					prefix = "memcached"
				}
				if !strings.HasPrefix(err.Error(), prefix+": get window of ") {
					t.Errorf("err %q, want it to start with %q", err, prefix+": get window of ")
				}
			}
		})
	}
}

type timeoutErr struct{}

func (*timeoutErr) Error() string   { return "i/o timeout" }
func (*timeoutErr) Timeout() bool   { return true }
func (*timeoutErr) Temporary() bool { return true }

// A corrupt item is the key's failure, whatever its key spells: text the
// key puts in an error never makes it a server's.
func TestCorruptItemsAreTheKeysFailures(t *testing.T) {
	p := throttler.Policy{Name: "api", Limit: 3, Window: time.Minute}
	ctx := context.Background()
	resetMs := t0.Add(time.Minute).UnixMilli()
	for _, name := range []string{"k", "SERVER_ERROR", "memcache:_unexpected"} {
		b, f := newTestBackend(t)
		k := newItemKeys(b.opts.Prefix, p, name)
		for _, corrupt := range []struct{ head, counter string }{{"soon", ""}, {strconv.FormatInt(resetMs, 10), "many"}} {
			f.set(k.head(), corrupt.head)
			f.evict(k.counter(resetMs))
			if corrupt.counter != "" {
				f.set(k.counter(resetMs), corrupt.counter)
			}
			for op, call := range map[string]func() error{
				"take":   func() error { _, err := b.Take(ctx, name, p, 1, t0); return err },
				"peek":   func() error { _, err := b.Peek(ctx, name, p, t0); return err },
				"refund": func() error { _, err := b.Refund(ctx, name, p, 1, t0.Add(p.Window), t0); return err },
			} {
				err := call()
				if !errors.Is(err, throttler.ErrKeyState) || errors.Is(err, throttler.ErrUnavailable) {
					t.Errorf("%q, %+v, %s: %v, want only a key failure", name, corrupt, op, err)
				}
			}
		}
	}
}

// A window's counter may live on another server than its head: a failure
// there is blamed on the counter's server, which the error's address names.
func TestCounterFailureBlamesTheCountersServer(t *testing.T) {
	sel := twoServers(t)
	p := throttler.Policy{Name: "api", Limit: 3, Window: time.Minute}
	resetMs := t0.Add(time.Minute).UnixMilli()
	var key string
	for i := 0; key == ""; i++ {
		k := newItemKeys("throttlekit:", p, fmt.Sprint("user-", i))
		if pick(t, sel, k.head()).String() != pick(t, sel, k.counter(resetMs)).String() {
			key = fmt.Sprint("user-", i)
		}
	}
	f := newFakeClient()
	b := mustNew(t, f, &Options{Selector: sel})
	counter := newItemKeys(b.opts.Prefix, p, key).counter(resetMs)
	f.setBefore(func(op, item string) error {
		if item == counter {
			return &net.OpError{Op: "read", Net: "tcp", Addr: pick(t, sel, counter), Err: &timeoutErr{}}
		}
		return nil
	})
	_, err := b.Take(context.Background(), key, p, 1, t0)
	if want := "memcached " + pick(t, sel, counter).String(); blamedStore(t, err) != want || b.store(throttler.OpTake, key, p) == want {
		t.Errorf("err %v blamed on %q, want the counter's server %q, not the head's %q", err, blamedStore(t, err), want, b.store(throttler.OpTake, key, p))
	}
}
