package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// checked is a store with a start-up Check that returns err.
type checked struct {
	throttler.Backend
	err error
}

func (c checked) Check(context.Context) error { return c.err }

// Both commands check every store that can check itself before they read
// or write anything: a store that does not answer is one clear error on
// stderr and exit status 3, with nothing on stdout and nothing written.
func TestStartUpCheck(t *testing.T) {
	down := fmt.Errorf("redis 10.0.1.5:6379: check: dial tcp 10.0.1.5:6379: connect: connection refused: %w", throttler.ErrUnavailable)
	for _, args := range [][]string{inspectArgs, shadowArgs} {
		t.Run(args[0], func(t *testing.T) {
			te := newTestEnv(t)
			te.backends[storeMemcached] = checked{te.backend(t, storeMemcached), nil}
			te.backends[storeRedis] = checked{te.backend(t, storeRedis), down}
			if code := te.run(args...); code != exitUnreachable {
				t.Errorf("exit status %d, want %d", code, exitUnreachable)
			}
			want := "throttlekit " + args[0] + ": store redis (10.0.1.5:6379) does not answer: redis 10.0.1.5:6379: check: dial tcp 10.0.1.5:6379: connect: connection refused"
			if !strings.HasPrefix(te.errb.String(), want) {
				t.Errorf("stderr %q, want %q…", te.errb.String(), want)
			}
			if te.out.Len() != 0 {
				t.Errorf("stdout %q, want nothing", te.out.String())
			}
			p := throttler.Policy{Name: "core", Limit: 3, Window: time.Minute}
			if d, _ := te.backends[storeMemcached].Peek(context.Background(), syntheticKey(0), p, t0); d.Used != 0 {
				t.Errorf("the control was written to: used %d", d.Used)
			}
		})
	}
}

// With the stores the command builds itself: a Memcached server list with
// one dead server (nothing listens on 127.0.0.1:1) beside a live one. Without
// the check, a key whose items the live server holds was inspected as if
// all was well; now every order of the list stops with the dead server
// named.
func TestStartUpCheckNamesTheDeadServer(t *testing.T) {
	live := fakeMemcached(t)
	for _, servers := range []string{live, live + ",127.0.0.1:1", "127.0.0.1:1," + live} {
		t.Run(servers, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := newEnv(&out, &errb).run(context.Background(), []string{"inspect",
				"--policy", "name=core,limit=10,window=1m", "--key", "user:42", "--memcached", servers, "--timeout", "1s"})
			if servers == live {
				if code != exitOK || !strings.Contains(out.String(), "one store: nothing to compare") {
					t.Errorf("exit status %d, stdout %q, stderr %q", code, out.String(), errb.String())
				}
				return
			}
			want := fmt.Sprintf("throttlekit inspect: store memcached (%s) does not answer: memcached 127.0.0.1:1: check: dial tcp 127.0.0.1:1: connect: connection refused", servers)
			if code != exitUnreachable || !strings.HasPrefix(errb.String(), want) {
				t.Errorf("exit status %d, stderr %q; want %d and %q", code, errb.String(), exitUnreachable, want)
			}
		})
	}
}

// fakeMemcached listens on loopback and answers every get with a miss, as a
// live, empty Memcached does, until the test ends.
func fakeMemcached(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					reply := "ERROR\r\n"
					if strings.HasPrefix(line, "get") {
						reply = "END\r\n"
					}
					if _, err := c.Write([]byte(reply)); err != nil {
						return
					}
				}
			})
		}
	})
	return l.Addr().String()
}
