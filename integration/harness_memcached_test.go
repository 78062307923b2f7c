package integration

import (
	"net"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/memcached"
)

// memcachedTwoServers starts two Memcached servers and returns a backend
// over both through one ServerList (which the tests ask where an item
// lives), for the tests that pause one and watch the other.
func memcachedTwoServers(t *testing.T) (b *memcached.Backend, sel *memcache.ServerList, healthy, paused *memcachedServer) {
	t.Helper()
	healthy, paused = memcachedStart(t), memcachedStart(t)
	sel = new(memcache.ServerList)
	require.NoError(t, sel.SetServers(healthy.addr, paused.addr))
	c := memcache.NewFromSelector(sel)
	c.Timeout = memcachedClientTimeout
	c.MaxIdleConns = 64
	t.Cleanup(func() { _ = c.Close() })
	return memcachedNew(t, c, &memcached.Options{Selector: sel}), sel, healthy, paused
}

// resolvedAddr is addr as a ServerList and the backend's errors name it.
func resolvedAddr(t *testing.T, addr string) string {
	t.Helper()
	a, err := net.ResolveTCPAddr("tcp", addr)
	require.NoError(t, err)
	return a.String()
}
