package redis

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/backend/backendtest"
	"github.com/throttlekit/throttlekit/throttler"
)

// startRedis starts a redis-server of its own on a free local port, without
// persistence, for the test's lifetime, and returns a client on it; args
// are added to the server's command line. It skips the test when
// redis-server is not on PATH.
func startRedis(t *testing.T, args ...string) (*goredis.Client, int) {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server is not on PATH")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir := t.TempDir()
	cmd := exec.Command(path, append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "log")}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	rdb := goredis.NewClient(&goredis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), PoolSize: 64})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	for i := 0; ; i++ {
		if err := rdb.Ping(ctx).Err(); err == nil {
			return rdb, port
		} else if i == 200 {
			t.Fatalf("redis-server on port %d: %v", port, err)
		}
		time.Sleep(10 * time.Millisecond) // the server starting, not the clock
	}
}

// TestConformanceLocalRedis runs the whole conformance suite (the four
// algorithms, their tables, concurrency and differential traces) against a
// real Redis started for the test.
func TestConformanceLocalRedis(t *testing.T) {
	rdb, _ := startRedis(t)
	backendtest.Run(t, func(t *testing.T) throttler.Backend {
		b, err := NewSharded([]Shard{{Primary: rdb}}, &Options{Prefix: "conf:"})
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}
