package integration

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// memcachedImage is built locally by ../shared/testenv/up; nothing is pulled.
const memcachedImage = "memcached:1.6"

// memcachedServer is one Memcached container, terminated when the test ends.
type memcachedServer struct {
	ctr  *testcontainers.DockerContainer
	addr string // 127.0.0.1:port
}

// memcachedStart starts a Memcached container; args are memcached's flags
// (for example "-m", "8"). It is published on a fixed loopback port, so that
// a restarted container keeps its address.
func memcachedStart(t *testing.T, args ...string) *memcachedServer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	hostPort := memcachedFreePort(t)
	opts := []testcontainers.ContainerCustomizer{
		containerLogger(t),
		testcontainers.WithExposedPorts("11211/tcp"),
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
			hc.PortBindings = network.PortMap{network.MustParsePort("11211/tcp"): {{
				HostIP: netip.MustParseAddr("127.0.0.1"), HostPort: hostPort}}}
		}),
		testcontainers.WithWaitStrategyAndDeadline(30*time.Second, wait.ForListeningPort("11211/tcp")),
	}
	if len(args) > 0 {
		opts = append(opts, testcontainers.WithCmd(args...)) // the entrypoint runs memcached with flags alone
	}
	ctr, err := testcontainers.Run(ctx, memcachedImage, opts...)
	testcontainers.CleanupContainer(t, ctr)
	if err != nil {
		t.Fatalf("start %s: %v", memcachedImage, err)
	}
	s := &memcachedServer{ctr: ctr}
	s.addr = s.endpoint(t)
	memcachedWaitReady(t, s.addr)
	return s
}

// memcachedFreePort returns a loopback port that was free a moment ago.
func memcachedFreePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// endpoint is the server's published address.
func (s *memcachedServer) endpoint(t *testing.T) string {
	t.Helper()
	addr, err := s.ctr.PortEndpoint(context.Background(), "11211/tcp", "")
	if err != nil {
		t.Fatalf("memcached endpoint: %v", err)
	}
	return addr
}

// memcachedWaitReady polls until the server answers, for at most 10s.
func memcachedWaitReady(t *testing.T, addrs ...string) {
	t.Helper()
	c := memcache.New(addrs...)
	c.Timeout = 200 * time.Millisecond
	defer c.Close()
	var err error
	if _, ok := poll(10*time.Second, 50*time.Millisecond, func(context.Context) bool { err = c.Ping(); return err == nil }); !ok {
		t.Fatalf("memcached %v not answering: %v", addrs, err)
	}
}

// memcachedClient is a client for addrs with the timeout that bounds each
// call, closed when the test ends.
func memcachedClient(t *testing.T, timeout time.Duration, addrs ...string) *memcache.Client {
	t.Helper()
	c := memcache.New(addrs...)
	c.Timeout = timeout
	c.MaxIdleConns = 64
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func (s *memcachedServer) stop(t *testing.T) {
	t.Helper()
	timeout := time.Duration(0)
	if err := s.ctr.Stop(context.Background(), &timeout); err != nil {
		t.Fatalf("stop memcached: %v", err)
	}
}

// start restarts a stopped container, on the same address, empty.
func (s *memcachedServer) start(t *testing.T) {
	t.Helper()
	if err := s.ctr.Start(context.Background()); err != nil {
		t.Fatalf("restart memcached: %v", err)
	}
	if addr := s.endpoint(t); addr != s.addr {
		t.Fatalf("restarted memcached moved from %s to %s", s.addr, addr)
	}
}

// pause freezes the server's processes: connections stay open and calls
// hang until the client's timeout, the slow kind of failure.
func (s *memcachedServer) pause(t *testing.T) {
	t.Helper()
	s.docker(t, func(ctx context.Context, c *testcontainers.DockerClient) error {
		_, err := c.ContainerPause(ctx, s.ctr.GetContainerID(), client.ContainerPauseOptions{})
		return err
	})
	t.Cleanup(func() { // a paused container may refuse to be terminated
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := testcontainers.NewDockerClientWithOpts(ctx); err == nil {
			_, _ = c.ContainerUnpause(ctx, s.ctr.GetContainerID(), client.ContainerUnpauseOptions{})
			_ = c.Close()
		}
	})
}

func (s *memcachedServer) unpause(t *testing.T) {
	t.Helper()
	s.docker(t, func(ctx context.Context, c *testcontainers.DockerClient) error {
		_, err := c.ContainerUnpause(ctx, s.ctr.GetContainerID(), client.ContainerUnpauseOptions{})
		return err
	})
}

func (s *memcachedServer) docker(t *testing.T, f func(context.Context, *testcontainers.DockerClient) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		t.Fatalf("docker client: %v", err)
	}
	defer c.Close()
	if err := f(ctx, c); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("docker: %v", err)
	}
}
