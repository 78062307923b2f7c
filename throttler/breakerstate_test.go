package throttler_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/throttlekit/throttlekit/throttler"
)

func TestBreakersReportEachStore(t *testing.T) {
	mono := &monoClock{}
	b := newStoresBackend(t)
	th := newThrottler(t, b, &throttler.Options{BreakerThreshold: 2, BreakerCooldown: time.Second})
	throttler.SetMonotonic(th, mono.Now)
	p := throttler.PerMinute(100)
	assert.Empty(t, th.Breakers(), "a backend that names stores: none seen yet")

	b.set("store a", errDown)
	takeN(t, th, "a:1", p, 1)
	takeN(t, th, "b:1", p, 1)
	assert.Equal(t, []throttler.BreakerState{
		{Store: "store a", Failures: 1},
		{Store: "store b"},
	}, th.Breakers(), "one failure is below the threshold")

	takeN(t, th, "a:1", p, 1)
	assert.Equal(t, []throttler.BreakerState{
		{Store: "store a", Open: true, Failures: 2},
		{Store: "store b"},
	}, th.Breakers())

	b.set("store a", nil)
	mono.Add(time.Second)
	takeN(t, th, "a:1", p, 1) // the probe succeeds
	assert.Equal(t, []throttler.BreakerState{{Store: "store a"}, {Store: "store b"}}, th.Breakers())
}

func TestBreakersOfOneStore(t *testing.T) {
	th := newThrottler(t, &stubBackend{err: errDown}, &throttler.Options{BreakerThreshold: 1})
	assert.Equal(t, []throttler.BreakerState{{}}, th.Breakers(), "a backend that is one store has its breaker listed")
	takeN(t, th, "k", throttler.PerMinute(1), 1)
	assert.Equal(t, []throttler.BreakerState{{Open: true, Failures: 1}}, th.Breakers())

	var zero *throttler.Throttler
	assert.Nil(t, zero.Breakers())
	assert.Nil(t, (&throttler.Throttler{}).Breakers())
}
