package integration

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	goredis "github.com/redis/go-redis/v9"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// redisImage is built locally by ../shared/testenv/up; nothing is pulled.
const redisImage = "redis:7.0"

// redisNoPersistence keeps every server in memory: nothing here survives a
// test, and snapshots would only cost time.
var redisNoPersistence = []string{"--save", "", "--appendonly", "no"}

// redisContainer is one redis-server in a container, reached on loopback.
type redisContainer struct {
	c    *testcontainers.DockerContainer
	Addr string // host:port on loopback
	IP   string // the container's address on Docker's network, for replicaof
}

// redisStart starts a redis-server with args on Docker's default network,
// its port published on a fixed loopback port (so that a stopped and
// restarted container keeps its address), and terminates it when the test
// ends.
func redisStart(t testing.TB, args ...string) *redisContainer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hostPort := strconv.Itoa(redisFreePorts(t, 1)[0])
	c, err := testcontainers.Run(ctx, redisImage,
		containerLogger(t),
		testcontainers.WithCmd(append(append([]string{}, redisNoPersistence...), args...)...),
		testcontainers.WithExposedPorts("6379/tcp"),
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
			hc.PortBindings = network.PortMap{network.MustParsePort("6379/tcp"): {{
				HostIP: netip.MustParseAddr("127.0.0.1"), HostPort: hostPort}}}
		}),
		testcontainers.WithWaitStrategy(wait.ForAll(
			wait.ForLog("Ready to accept connections"),
			wait.ForListeningPort("6379/tcp"),
		).WithDeadline(time.Minute)),
	)
	testcontainers.CleanupContainer(t, c)
	if err != nil {
		t.Fatalf("start %s: %v", redisImage, err)
	}
	host, err := c.Host(ctx)
	if err != nil {
		t.Fatal(err)
	}
	port, err := c.MappedPort(ctx, "6379/tcp")
	if err != nil {
		t.Fatal(err)
	}
	ip, err := c.ContainerIP(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &redisContainer{c: c, Addr: net.JoinHostPort(host, port.Port()), IP: ip}
}

// redisClient returns a client of addr, closed when the test ends. Context
// deadlines only bound socket I/O with ContextTimeoutEnabled, which the
// backend's documentation asks every user to set.
func redisClient(t testing.TB, addr string) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: true,
		DialTimeout:           2 * time.Second,
		MaxRetries:            -1, // a retried script could count twice
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// redisReplicaSet starts a primary and n replicas of it, and waits until
// every replica has synchronised. It returns the primary first.
func redisReplicaSet(t testing.TB, n int) (*redisContainer, []*redisContainer) {
	t.Helper()
	// Diskless sync starts at once instead of waiting 5s for more replicas.
	primary := redisStart(t, "--repl-diskless-sync-delay", "0")
	replicas := make([]*redisContainer, n)
	for i := range replicas {
		replicas[i] = redisStart(t, "--replicaof", primary.IP, "6379")
	}
	for _, r := range replicas {
		c := redisClient(t, r.Addr)
		waitFor(t, 30*time.Second, "replica "+r.Addr+" in sync", func(ctx context.Context) bool {
			info, err := c.Info(ctx, "replication").Result()
			return err == nil && strings.Contains(info, "master_link_status:up")
		})
	}
	return primary, replicas
}

// redisCluster starts a Redis Cluster of n masters without replicas and
// returns their addresses. The nodes share the host's network so that the
// addresses they announce (127.0.0.1 and their own port) are the ones a
// ClusterClient dials: with published ports, a node knows only its
// container address, which the host cannot reach.
func redisCluster(t testing.TB, n int) []string {
	t.Helper()
	return redisClusterOwned(t, n, n)
}

// redisClusterOwned is redisCluster with the slots split over the first
// owners masters only: the others join empty, for a reshard to fill.
func redisClusterOwned(t testing.TB, n, owners int) []string {
	t.Helper()
	ports := redisFreePorts(t, n)
	addrs := make([]string, n)
	clients := make([]*goredis.Client, n)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i, port := range ports {
		p := strconv.Itoa(port)
		args := append(append([]string{}, redisNoPersistence...),
			"--port", p, "--bind", "127.0.0.1",
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes-"+p+".conf",
			"--cluster-node-timeout", "5000")
		if owners < n {
			// A master a reshard empties stays a master, rather than
			// turning into a replica of the one that took its last slot.
			args = append(args, "--cluster-allow-replica-migration", "no")
		}
		c, err := testcontainers.Run(ctx, redisImage,
			containerLogger(t),
			testcontainers.WithCmd(args...),
			testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) { hc.NetworkMode = "host" }),
			testcontainers.WithWaitStrategy(wait.ForLog("Ready to accept connections").WithStartupTimeout(time.Minute)),
		)
		testcontainers.CleanupContainer(t, c)
		if err != nil {
			t.Fatalf("start cluster node on %d: %v", port, err)
		}
		addrs[i] = net.JoinHostPort("127.0.0.1", p)
		clients[i] = redisClient(t, addrs[i])
	}
	// Split the 16384 slots evenly, then introduce every node to the first.
	const slots = 16384
	for i, c := range clients {
		if lo, hi := i*slots/owners, (i+1)*slots/owners-1; i < owners {
			if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
				t.Fatalf("CLUSTER ADDSLOTSRANGE %d %d on %s: %v", lo, hi, addrs[i], err)
			}
		}
		if i > 0 {
			if err := c.ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(ports[0])).Err(); err != nil {
				t.Fatalf("CLUSTER MEET from %s: %v", addrs[i], err)
			}
		}
	}
	for i, c := range clients {
		waitFor(t, time.Minute, "cluster state ok on "+addrs[i], func(ctx context.Context) bool {
			info, err := c.ClusterInfo(ctx).Result()
			return err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", n))
		})
	}
	return addrs
}

// redisClusterClient returns a client of the cluster at addrs, closed when
// the test ends.
func redisClusterClient(t testing.TB, addrs []string) *goredis.ClusterClient {
	t.Helper()
	c := goredis.NewClusterClient(&goredis.ClusterOptions{
		Addrs:                 addrs,
		ContextTimeoutEnabled: true,
		DialTimeout:           2 * time.Second,
		MaxRetries:            -1,
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// redisFreePorts returns n loopback ports that were free a moment ago.
func redisFreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for len(ports) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		port := l.Addr().(*net.TCPAddr).Port
		// A cluster node also listens on port+10000 for its bus.
		if port+10000 > 65535 {
			continue
		}
		if b, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000))); err == nil {
			b.Close()
			ports = append(ports, port)
		}
	}
	return ports
}

// redisPause freezes the container's processes (connections stay open and
// hang, like a stalled server) until redisUnpause; the test's cleanup
// unpauses it so that it can be terminated.
func redisPause(t testing.TB, rc *redisContainer) {
	t.Helper()
	cli, err := testcontainers.NewDockerClientWithOpts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.ContainerPause(context.Background(), rc.c.GetContainerID(), client.ContainerPauseOptions{}); err != nil {
		t.Fatalf("pause %s: %v", rc.Addr, err)
	}
	t.Cleanup(func() { redisUnpause(t, rc) })
}

// redisUnpause resumes a paused container; resuming a running one is a no-op.
func redisUnpause(t testing.TB, rc *redisContainer) {
	t.Helper()
	cli, err := testcontainers.NewDockerClientWithOpts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.ContainerUnpause(context.Background(), rc.c.GetContainerID(), client.ContainerUnpauseOptions{}); err != nil &&
		!strings.Contains(err.Error(), "not paused") {
		t.Errorf("unpause %s: %v", rc.Addr, err)
	}
}
