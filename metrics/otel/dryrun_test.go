package otel_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"

	"github.com/throttlekit/throttlekit/metrics/internal/traffic"
	"github.com/throttlekit/throttlekit/metrics/otel"
)

// The calls are traffic.DryRun's; its comment says what each did.
func TestWouldDenyCollect(t *testing.T) {
	m, reader := newMetrics(t, nil)
	traffic.DryRun(t, m.Observe)
	got := collect(t, reader)
	wd := got["throttlekit.would_deny"]
	assert.Equal(t, "{decision}", wd.Unit)
	metricdatatest.AssertAggregationsEqual(t, sum(
		point(1, "throttlekit.policy", "burst"),
		point(3, "throttlekit.policy", "export"),
		point(2, "throttlekit.policy", "login"),
		point(2, "throttlekit.policy", "search"),
		point(1, "throttlekit.policy", "unnamed"),
	), wd.Data, metricdatatest.IgnoreTimestamp())
	metricdatatest.AssertAggregationsEqual(t, sum(
		decision(1, "login", "peek", "primary", "allowed"),
		decision(4, "export", "take", "primary", "allowed"),
		decision(6, "login", "take", "primary", "allowed"),
		decision(1, "login", "take", "primary", "denied"),
		decision(8, "unnamed", "take", "primary", "allowed"),
	), got["throttlekit.decisions"].Data, metricdatatest.IgnoreTimestamp())
}

func TestWouldDenyCardinalityIsBounded(t *testing.T) {
	m, reader := newMetrics(t, &otel.Options{MaxPolicies: 1})
	traffic.DryRun(t, m.Observe)
	metricdatatest.AssertAggregationsEqual(t, sum(
		point(2, "throttlekit.policy", "login"),
		point(7, "throttlekit.policy", "other"),
	), collect(t, reader)["throttlekit.would_deny"].Data, metricdatatest.IgnoreTimestamp())
}
