package benchmarks

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/throttlekit/throttlekit/backend/memcached"
	"github.com/throttlekit/throttlekit/throttler"
)

// memcachedServe starts the memcached binary on a free loopback port and
// returns its address; the server is killed when the benchmark ends. It
// skips the benchmark when memcached is not installed.
func memcachedServe(b *testing.B) string {
	b.Helper()
	bin, err := exec.LookPath("memcached")
	if err != nil {
		b.Skip("memcached not installed")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	// -t 1: one worker thread, as the machine has 2 cores for the server and the benchmark.
	cmd := exec.Command(bin, "-l", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "0", "-m", "64", "-t", "1", "-c", "1024", "-u", "root")
	if err := cmd.Start(); err != nil {
		b.Fatalf("start memcached: %v", err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	c := memcache.New(addr)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c.Ping() == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("memcached on %s not answering", addr)
		}
	}
	_ = c.Close()
	return addr
}

// BenchmarkMemcachedTake compares Backend.Take in an open window with the
// floor, a bare gomemcache Increment on the same server, on 1 goroutine and
// on 64: "take" is the default (the head's reset-at cached, so one incr),
// "take-nocache" reads the head on every call (gets + incr).
func BenchmarkMemcachedTake(b *testing.B) {
	addr := memcachedServe(b)
	for _, goroutines := range []int{1, 64} {
		c := memcache.New(addr)
		c.Timeout = time.Second
		c.MaxIdleConns = goroutines
		b.Cleanup(func() { _ = c.Close() })

		b.Run(fmt.Sprintf("floor-incr/goroutines=%d", goroutines), func(b *testing.B) {
			key := "bench:floor:" + strconv.Itoa(goroutines)
			if err := c.Set(&memcache.Item{Key: key, Value: []byte("0")}); err != nil {
				b.Fatal(err)
			}
			memcachedRun(b, goroutines, func() error {
				_, err := c.Increment(key, 1)
				return err
			})
		})

		for _, mode := range []struct {
			name string
			opts *memcached.Options
		}{{"take", nil}, {"take-nocache", &memcached.Options{NoCache: true}}} {
			b.Run(fmt.Sprintf("%s/goroutines=%d", mode.name, goroutines), func(b *testing.B) {
				m := memcached.New(c, mode.opts)
				// Every call is admitted: the benchmark measures counting in an open window.
				p := throttler.Policy{Name: "bench", Limit: memcached.MaxLimit, Window: time.Hour}
				now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
				ctx := context.Background()
				key := mode.name + "-" + strconv.Itoa(goroutines)
				memcachedRun(b, goroutines, func() error {
					d, err := m.Take(ctx, key, p, 1, now)
					if err == nil && !d.Allowed {
						err = fmt.Errorf("denied: %+v", d)
					}
					return err
				})
			})
		}
	}
}

// memcachedRun calls f b.N times over the given number of goroutines.
func memcachedRun(b *testing.B, goroutines int, f func() error) {
	b.ReportAllocs()
	if goroutines == 1 {
		for b.Loop() {
			if err := f(); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	b.SetParallelism((goroutines + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := f(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
