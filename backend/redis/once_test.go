package redis

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// scriptServer is a loopback server speaking just enough RESP2 for a
// go-redis client: it answers every script with reply(n), n counting the
// scripts received from 1, and anything else with OK (HELLO with an error,
// so that the client speaks RESP2). A reply of "" closes the connection
// without answering, as a server that ran the script and then lost the
// connection would. ran counts the scripts answered as run. A command it
// cannot parse fails the test when it ends: the server would otherwise
// close the connection, and the client see a failure Redis never gives.
type scriptServer struct {
	addr    string
	n       atomic.Int64
	ran     atomic.Int64
	reply   func(n int64) string
	garbled atomic.Pointer[error] // the first command it could not parse
}

func newScriptServer(t *testing.T, reply func(n int64) string) *scriptServer {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &scriptServer{addr: l.Addr().String(), reply: reply}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = l.Close()
		wg.Wait()
		if err := s.garbled.Load(); err != nil {
			t.Errorf("the server closed a connection on a command it could not parse: %v", *err)
		}
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); s.serve(c) }()
		}
	}()
	return s
}

// client is a client of s, speaking RESP2, closed when the test ends.
func (s *scriptServer) client(t *testing.T) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: s.addr, Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func (s *scriptServer) serve(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		cmd, err := readCommand(r)
		if err != nil {
			if errors.Is(err, errNotRESP) {
				s.garbled.CompareAndSwap(nil, &err)
			}
			return
		}
		var out string
		switch strings.ToLower(cmd) {
		case "hello":
			out = "-ERR unknown command 'HELLO'\r\n"
		case "eval", "evalsha":
			out = s.reply(s.n.Add(1))
			if out == "" {
				s.ran.Add(1)
				return
			}
			if out[0] != '-' {
				s.ran.Add(1)
			}
		default:
			out = "+OK\r\n"
		}
		if _, err := io.WriteString(c, out); err != nil {
			return
		}
	}
}

// readCommand reads one RESP array of bulk strings and returns its name.
// Each bulk string is read by its length, never up to a newline: an EVAL's
// script source holds newlines.
func readCommand(r *bufio.Reader) (string, error) {
	n, err := readHeader(r, '*')
	if err != nil {
		return "", err
	}
	var name string
	for i := range n {
		size, err := readHeader(r, '$')
		if err != nil {
			return "", err
		}
		arg := make([]byte, size+2) // and its CRLF
		if _, err := io.ReadFull(r, arg); err != nil {
			return "", err
		}
		if i == 0 {
			name = string(arg[:size])
		}
	}
	return name, nil
}

var errNotRESP = errors.New("not RESP")

// readHeader reads a RESP header line of the given kind (* or $) and
// returns its count.
func readHeader(r *bufio.Reader, kind byte) (int, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil || line[0] != kind || n < 0 {
		return 0, fmt.Errorf("%w: want a %c header, got %q", errNotRESP, kind, line)
	}
	return n, nil
}

// takeReply is take.lua's answer to an admitted Take.
var takeReply = fmt.Sprintf("*3\r\n:1\r\n:1\r\n:%d\r\n", reset)

// go-redis re-sends a command that failed in a way it deems transient: a
// Take whose script ran, and whose connection then dropped before the
// reply, ran once per attempt (4 with the default MaxRetries). It runs
// once now, alone or in a batch.
func TestTakeRunsOnceWhenItsReplyIsLost(t *testing.T) {
	for _, batched := range []bool{false, true} {
		t.Run(fmt.Sprint("batched=", batched), func(t *testing.T) {
			srv := newScriptServer(t, func(int64) string { return "" })
			b := newBackend(t, srv.client(t), &Options{alwaysBatch: batched})
			if _, err := b.Take(context.Background(), "k", policy, 1, t0); err == nil {
				t.Error("Take answered, want the lost reply's error")
			}
			if n := srv.ran.Load(); n != 1 {
				t.Errorf("the script ran %d times, want once", n)
			}
		})
	}
}

// A Cluster's pipeline re-sent a node's whole sub-batch when its first
// command was refused with TRYAGAIN, so the scripts after it that had run
// ran again (5 runs for 3 Takes). Only the refused one is sent again: each
// Take runs once.
func TestClusterBatchIsNotResentWhole(t *testing.T) {
	srv := newScriptServer(t, func(n int64) string {
		if n == 1 {
			return "-TRYAGAIN Multiple keys request during rehashing of slot\r\n"
		}
		return takeReply
	})
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{
		Addrs: []string{srv.addr}, Protocol: 2, DisableIdentity: true,
		ClusterSlots: func(context.Context) ([]goredis.ClusterSlot, error) {
			return []goredis.ClusterSlot{{Start: 0, End: 16383, Nodes: []goredis.ClusterNode{{Addr: srv.addr}}}}, nil
		},
	})
	defer cc.Close()
	var stats counters
	l := newLane(cc, 128, &stats)
	var live []*pending
	for _, key := range []string{"a", "b", "c"} {
		live = append(live, &pending{req: &request{fn: fnTake, sk: key, take: takeArgs{1, 2, 10, 1, 3}}})
	}
	l.run(context.Background(), live)
	if ran, sent := srv.ran.Load(), srv.n.Load(); ran != 3 || sent != 4 {
		t.Errorf("scripts ran %d times of %d sent, want 3 of 4 (the refused one sent again)", ran, sent)
	}
	for _, p := range live {
		if p.err != nil {
			t.Errorf("%s: %v", p.req.sk, p.err)
		}
	}
}

// A script the server refused before it ran (READONLY: a demoted primary
// after a failover) is sent again once, alone or in a batch; one the server
// refuses again fails its call.
func TestRefusedScriptIsSentAgainOnce(t *testing.T) {
	for _, batched := range []bool{false, true} {
		t.Run(fmt.Sprint("batched=", batched), func(t *testing.T) {
			srv := newScriptServer(t, func(n int64) string {
				if n == 1 || n >= 3 {
					return "-READONLY You can't write against a read only replica.\r\n"
				}
				return takeReply
			})
			b := newBackend(t, srv.client(t), &Options{alwaysBatch: batched})
			if _, err := b.Take(context.Background(), "k", policy, 1, t0); err != nil {
				t.Errorf("first Take: %v, want the second attempt's answer", err)
			}
			if _, err := b.Take(context.Background(), "k", policy, 1, t0); !strings.Contains(fmt.Sprint(err), "READONLY") {
				t.Errorf("second Take: %v, want READONLY after one more attempt", err)
			}
			if sent := srv.n.Load(); sent != 4 {
				t.Errorf("%d scripts sent, want 4 (each Take twice)", sent)
			}
		})
	}
}

// Lease scripts run once too: an Acquire whose reply is lost ran once per
// attempt.
func TestAcquireRunsOnceWhenItsReplyIsLost(t *testing.T) {
	srv := newScriptServer(t, func(int64) string { return "" })
	b := newBackend(t, srv.client(t), nil)
	if _, err := b.Acquire(context.Background(), "k", leasePolicy, 1, t0); err == nil {
		t.Error("Acquire answered, want the lost reply's error")
	}
	if n := srv.ran.Load(); n != 1 {
		t.Errorf("the script ran %d times, want once", n)
	}
}

// lateContext is a context whose deadline has passed but whose Done is not
// closed yet, as a context's is until its timer fires.
type lateContext struct {
	context.Context
	deadline time.Time
	done     chan struct{}
	closed   atomic.Bool
}

func (c *lateContext) Deadline() (time.Time, bool) { return c.deadline, true }
func (c *lateContext) Done() <-chan struct{}       { return c.done }
func (c *lateContext) Err() error {
	if c.closed.Load() {
		return context.DeadlineExceeded
	}
	return nil
}

// A batch that timed out at its callers' deadline answered a caller whose
// context had not said so yet: a Throttler, which counts a deadline as a
// store failure only when its own context ended, did not count it. The
// caller now returns once its context has ended.
func TestBatchTimeoutReturnsAfterTheCallersDeadline(t *testing.T) {
	srv := newScriptServer(t, func(int64) string { return takeReply })
	l := newLane(srv.client(t), 128, new(counters))
	l.always = true
	ctx := &lateContext{Context: context.Background(), deadline: time.Now().Add(-time.Millisecond), done: make(chan struct{})}
	go func() {
		time.Sleep(20 * time.Millisecond) // the context's timer, late
		ctx.closed.Store(true)
		close(ctx.done)
	}()
	_, err := l.do(ctx, &request{fn: fnTake, sk: "k", take: takeArgs{1, 2, 10, 1, 3}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("do: %v, want the batch's deadline", err)
	}
	if ctx.Err() == nil {
		t.Error("do returned before the caller's context ended")
	}
}
