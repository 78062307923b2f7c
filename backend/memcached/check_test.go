package memcached

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/throttlekit/throttlekit/throttler"
)

// A client with no server constructed, and every call then failed with
// memcache.ErrNoServers, which was not even a store failure: a Throttler
// failed open, silently, for good. New refuses it when it can see the
// servers; nothing is dialled.
func TestNoServersRefused(t *testing.T) {
	for _, tt := range []struct {
		name string
		c    Client
		sel  memcache.ServerSelector
		want string // "" for no error
	}{
		{"memcache.New()", memcache.New(), nil, "memcached: the Client lists no servers"},
		{"an address that does not resolve", memcache.New("127.0.0.1:no-such-port"), nil, "memcached: the Client lists no servers"},
		{"NewFromSelector(nil)", memcache.NewFromSelector(nil), nil, "memcached: the Client's ServerSelector is nil"},
		{"NewFromSelector(nil *ServerList)", memcache.NewFromSelector((*memcache.ServerList)(nil)), nil, "memcached: the Client's ServerSelector is a nil *memcache.ServerList"},
		{"an empty ServerList", memcache.NewFromSelector(new(memcache.ServerList)), nil, "memcached: the Client lists no servers"},
		{"an empty Options.Selector", newFakeClient(), new(memcache.ServerList), "memcached: Options.Selector lists no servers"},
		{"one server", memcache.New("127.0.0.1:1"), nil, ""},
		{"a client whose servers cannot be seen", newFakeClient(), nil, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.c, &Options{Selector: tt.sel})
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("New: %v", err)
			case tt.want == "":
			case err == nil || !strings.HasPrefix(err.Error(), tt.want) || !errors.Is(err, memcache.ErrNoServers):
				t.Fatalf("New = %v, want %q… matching memcache.ErrNoServers", err, tt.want)
			}
		})
	}
}

// A failure names the server and its cause, in the error and in what a
// Throttler's Observe sees, without a Selector: the address comes from the
// network error.
func TestFailureNamesTheServer(t *testing.T) {
	c := memcache.New("127.0.0.1:1") // nothing listens on port 1
	c.Timeout = time.Second
	b := mustNew(t, c, nil)
	var seen error
	th, err := throttler.New(b, &throttler.Options{
		Clock: func() time.Time { return t0 }, Timeout: 2 * time.Second,
		Observe: func(o throttler.Observation) { seen = o.Err },
	})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = th.Allow(context.Background(), "k", throttler.PerMinute(5))
	for _, err := range []error{seen, b.Check(context.Background())} {
		if err == nil || !strings.HasPrefix(err.Error(), "memcached 127.0.0.1:1: ") ||
			!strings.Contains(err.Error(), "connection refused") || !errors.Is(err, throttler.ErrUnavailable) {
			t.Errorf("err %v, want \"memcached 127.0.0.1:1: …connection refused\" matching ErrUnavailable", err)
		}
	}
}

// Check reads from every server and names the first that does not answer.
func TestCheck(t *testing.T) {
	ctx := context.Background()
	live := startMemcached(t)
	for _, tt := range []struct {
		name    string
		servers []string
		sel     bool // pass the selector as Options.Selector
		want    string
	}{
		{"one live server", []string{live}, false, ""},
		{"a dead server after a live one", []string{live, "127.0.0.1:1"}, false, "memcached 127.0.0.1:1: check: dial tcp 127.0.0.1:1: connect: connection refused"},
		{"a dead server first, with Options.Selector", []string{"127.0.0.1:1", live}, true, "memcached 127.0.0.1:1: check: dial tcp 127.0.0.1:1: connect: connection refused"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sel := new(memcache.ServerList)
			if err := sel.SetServers(tt.servers...); err != nil {
				t.Fatal(err)
			}
			c := memcache.NewFromSelector(sel)
			c.Timeout = time.Second
			o := &Options{}
			if tt.sel {
				o.Selector = sel
			}
			err := mustNew(t, c, o).Check(ctx)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			if err == nil || err.Error() != tt.want || !errors.Is(err, throttler.ErrUnavailable) {
				t.Fatalf("Check = %v, want %q matching ErrUnavailable", err, tt.want)
			}
			if tt.sel {
				if blamedStore(t, err) != "memcached 127.0.0.1:1" {
					t.Errorf("Check's error names store %v", err)
				}
			}
		})
	}
}

// For a client whose servers it cannot see, Check reads one probe item:
// a miss is an answer; a failure is the server's; a context already ended
// stops it before any read.
func TestCheckOpaqueClient(t *testing.T) {
	f := newFakeClient()
	b := mustNew(t, f, nil)
	if err := b.Check(context.Background()); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if f.calls["get"] != 1 {
		t.Errorf("Check made %d gets, want 1", f.calls["get"])
	}
	f.setBefore(func(string, string) error { return memcache.ErrNoServers })
	if err := b.Check(context.Background()); !errors.Is(err, throttler.ErrUnavailable) || !errors.Is(err, memcache.ErrNoServers) {
		t.Errorf("Check with no servers = %v, want ErrUnavailable and ErrNoServers", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Check(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Check with a cancelled context = %v", err)
	}
}

// A client left with gomemcache's default pool (2 idle connections, which
// under load makes every call beyond two dial and close a connection) gets
// defaultIdleConns; a pool the caller sized is left alone.
func TestNewSizesTheDefaultPool(t *testing.T) {
	for _, tt := range []struct{ set, want int }{{0, defaultIdleConns}, {8, 8}, {1000, 1000}} {
		c := memcache.New("127.0.0.1:1")
		c.MaxIdleConns = tt.set
		mustNew(t, c, nil)
		if c.MaxIdleConns != tt.want {
			t.Errorf("MaxIdleConns %d: New left %d, want %d", tt.set, c.MaxIdleConns, tt.want)
		}
	}
}
