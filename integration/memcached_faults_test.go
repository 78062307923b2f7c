package integration

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/memcached"
	"github.com/throttlekit/throttlekit/throttler"
)

// TestMemcachedFaults takes Memcached away mid-load, by pausing its
// container (a stalled server: calls hang until the client's timeout) or
// stopping it (a dead one: connections are refused), under a Throttler that
// fails open, with and without a memory fallback. Every call must be answered
// within the Throttler's timeout plus a small margin, the fallback must keep
// limiting, and once Memcached is back the decisions must come from it again.
func TestMemcachedFaults(t *testing.T) {
	faultSubtests(t, memcachedTestFault)
}

const (
	memcachedFaultTimeout = 100 * time.Millisecond
	// memcachedClientTimeout bounds each gomemcache call, which takes no
	// context: below the Throttler's timeout, as the package documents.
	memcachedClientTimeout = 60 * time.Millisecond
	// memcachedFaultMargin is what a call may take beyond the timeout:
	// scheduling on a 2-core machine shared with the server and other tests.
	memcachedFaultMargin = 150 * time.Millisecond
)

func memcachedTestFault(t *testing.T, fault string, fallback bool) {
	s := memcachedStart(t)
	leaks := faultLeaks()
	c := memcachedClient(t, memcachedClientTimeout, s.addr)
	sc := &faultScenario{
		name:    "Memcached",
		backend: memcachedNew(t, c, nil),
		leaks:   leaks,
		timeout: memcachedFaultTimeout,
		margin:  memcachedFaultMargin,
		pause:   s.pause,
		unpause: s.unpause,
		stop:    s.stop,
		start:   s.start,
		stored: func(t *testing.T, key string, p throttler.Policy) {
			stored, err := memcachedNew(t, c, &memcached.Options{NoCache: true}).Peek(context.Background(), key, p, time.Now())
			require.NoError(t, err)
			assert.Equal(t, int64(1), stored.Used, "the decision after recovery was counted in Memcached")
		},
		closeClient: c.Close,
	}
	sc.run(t, fault, fallback)
}
