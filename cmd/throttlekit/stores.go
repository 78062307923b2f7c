package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/backend/memcached"
	"github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/throttler"
)

// Store names, as --control and --candidate take them and reports print
// them. Each replica set of --redis-replica is a store of its own.
const (
	storeMemcached    = "memcached"
	storeRedis        = "redis"
	storeRedisReplica = "redis-replica"
)

// storeConfig is what the store options say.
type storeConfig struct {
	redis           []string   // shard primaries, in the application's order
	redisReplicas   [][]string // each: one replica per shard, in shard order
	redisPrefix     string
	memcached       []string
	memcachedPrefix string
	timeout         time.Duration
}

// addStoreFlags declares the store options on fs.
func addStoreFlags(fs *flag.FlagSet, c *storeConfig) {
	fs.Func("redis", "The Redis primaries, `addr[,addr...]`: one per shard, in the application's order (one address: redis.New; several: redis.NewSharded).", func(s string) error {
		if c.redis != nil {
			return errors.New("given twice; list the shards in one --redis, in order")
		}
		addrs, err := parseAddrs(s)
		c.redis = addrs
		return err
	})
	fs.Func("redis-replica", "Redis replicas, `addr[,addr...]`: one of each shard, in the order of --redis. Repeat the option for more replicas; each is a store of its own (redis-replica, redis-replica-2, ...), which only Peek reads.", func(s string) error {
		addrs, err := parseAddrs(s)
		c.redisReplicas = append(c.redisReplicas, addrs)
		return err
	})
	fs.StringVar(&c.redisPrefix, "redis-prefix", "throttlekit:", "The `prefix` of the application's Redis keys (redis.Options.Prefix).")
	fs.Func("memcached", "The Memcached servers, `addr[,addr...]`, as the application's client lists them (the order places the keys).", func(s string) error {
		if c.memcached != nil {
			return errors.New("given twice; list the servers in one --memcached, in order")
		}
		addrs, err := parseAddrs(s)
		c.memcached = addrs
		return err
	})
	fs.StringVar(&c.memcachedPrefix, "memcached-prefix", "throttlekit:", "The `prefix` of the application's Memcached keys (memcached.Options.Prefix).")
	fs.DurationVar(&c.timeout, "timeout", 2*time.Second, "How long one call to a store may take, dialling included.")
}

// parseAddrs reads a comma-separated list of host:port.
func parseAddrs(s string) ([]string, error) {
	var addrs []string
	for a := range strings.SplitSeq(s, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			return nil, errors.New("an empty address")
		}
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			return nil, fmt.Errorf("address %q: want host:port", a)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("address %q: port %q is not a number from 1 to 65535", a, port)
		}
		if host == "" {
			return nil, fmt.Errorf("address %q: the host is empty", a)
		}
		addrs = append(addrs, a)
	}
	return addrs, nil
}

// check reports a store configuration that cannot work: replicas that do
// not match the shards, a timeout of zero or less. The backends check the
// rest (a prefix) when they are built.
func (c *storeConfig) check() error {
	for i, r := range c.redisReplicas {
		if c.redis == nil {
			return errors.New("--redis-replica needs --redis: the primaries of the replicas' shards")
		}
		if len(r) != len(c.redis) {
			return fmt.Errorf("--redis-replica #%d lists %d addresses for %d shards; give one replica per shard, in the order of --redis", i+1, len(r), len(c.redis))
		}
	}
	if c.timeout <= 0 {
		return fmt.Errorf("--timeout is %v; want more than 0", c.timeout)
	}
	return nil
}

// names lists the stores configured, in the order reports show them:
// the old store of a Memcached-to-Redis migration first.
func (c *storeConfig) names() []string {
	var names []string
	if c.memcached != nil {
		names = append(names, storeMemcached)
	}
	if c.redis != nil {
		names = append(names, storeRedis)
	}
	for i := range c.redisReplicas {
		names = append(names, replicaName(i))
	}
	return names
}

func replicaName(i int) string {
	if i == 0 {
		return storeRedisReplica
	}
	return storeRedisReplica + "-" + strconv.Itoa(i+1)
}

// store is one configured store.
type store struct {
	name  string
	addrs []string
	b     throttler.Backend
	// readOnly: a replica, which only Peek may call.
	readOnly bool
}

// stores are the connected stores; Close closes their clients.
type stores struct {
	list    []store
	closers []func() error
}

func (s *stores) get(name string) *store {
	for i := range s.list {
		if s.list[i].name == name {
			return &s.list[i]
		}
	}
	return nil
}

func (s *stores) Close() {
	for _, c := range s.closers {
		c()
	}
}

// openStores builds a backend for every store of c. Nothing is dialled yet:
// go-redis and gomemcache connect on the first call (gomemcache resolves
// host names here: a failure matches throttler.ErrUnavailable). Any other
// error is the configuration's (a prefix the backend refuses).
func openStores(c storeConfig) (*stores, error) {
	s := &stores{}
	redisClient := func(addr string) *goredis.Client {
		rc := goredis.NewClient(&goredis.Options{
			Addr:                  addr,
			ContextTimeoutEnabled: true,
			DialTimeout:           c.timeout,
			ReadTimeout:           c.timeout,
			WriteTimeout:          c.timeout,
			MaxRetries:            -1, // a retried Take could count twice
		})
		s.closers = append(s.closers, rc.Close)
		return rc
	}
	if c.memcached != nil {
		var sel memcache.ServerList
		if err := sel.SetServers(c.memcached...); err != nil {
			// The addresses were checked; what fails here is resolving a
			// host name: the store cannot be reached.
			return nil, fmt.Errorf("--memcached: %w: %w", throttler.ErrUnavailable, err)
		}
		mc := memcache.NewFromSelector(&sel)
		mc.Timeout = c.timeout
		s.closers = append(s.closers, mc.Close)
		b, err := memcached.New(mc, &memcached.Options{Prefix: c.memcachedPrefix, Selector: &sel})
		if err != nil {
			s.Close()
			return nil, err
		}
		s.list = append(s.list, store{name: storeMemcached, addrs: c.memcached, b: b})
	}
	if c.redis != nil {
		b, err := redisBackend(c.redis, c.redisPrefix, redisClient)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.list = append(s.list, store{name: storeRedis, addrs: c.redis, b: b})
	}
	for i, addrs := range c.redisReplicas {
		// A replica set stands in for the primaries, so that every Peek
		// reads the replicas and nothing else.
		b, err := redisBackend(addrs, c.redisPrefix, redisClient)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.list = append(s.list, store{name: replicaName(i), addrs: addrs, b: b, readOnly: true})
	}
	return s, nil
}

func redisBackend(addrs []string, prefix string, client func(string) *goredis.Client) (*redis.Backend, error) {
	opts := &redis.Options{Prefix: prefix}
	if len(addrs) == 1 {
		return redis.New(client(addrs[0]), opts)
	}
	shards := make([]redis.Shard, len(addrs))
	for i, a := range addrs {
		shards[i] = redis.Shard{Primary: client(a)}
	}
	return redis.NewSharded(shards, opts)
}

// checker is a store that can verify, at start-up, that all of its servers
// answer (memcached.Backend, redis.Backend). A store without it is not
// checked; its first call tells instead.
type checker interface {
	Check(ctx context.Context) error
}

// checkStores asks every store that can to check its servers, each within
// timeout, and returns the first failure, naming the store and its
// addresses: a wrong address stops a command before it reads or writes
// anything, with one clear error, instead of a report full of failures.
func checkStores(ctx context.Context, list []store, timeout time.Duration) error {
	for _, s := range list {
		c, ok := s.b.(checker)
		if !ok {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, timeout)
		err := c.Check(cctx)
		cancel()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				// Its own timeout: the store did not answer in time.
				err = fmt.Errorf("%w: no answer within --timeout %v: %w", throttler.ErrUnavailable, timeout, err)
			}
			return fmt.Errorf("store %s (%s) does not answer: %w", s.name, strings.Join(s.addrs, ","), err)
		}
	}
	return nil
}

// openError reports an error of openStores, returning its exit status.
func (e *env) openError(cmd string, err error) int {
	if errors.Is(err, throttler.ErrUnavailable) {
		return e.fail(cmd, exitUnreachable, err)
	}
	return e.usage(cmd, "%v", err)
}

// exitFor is the exit status for a store's error: unreachable when the
// store itself failed (throttler.ErrUnavailable), failed otherwise.
func exitFor(err error) int {
	if errors.Is(err, throttler.ErrUnavailable) {
		return exitUnreachable
	}
	return exitFailed
}
