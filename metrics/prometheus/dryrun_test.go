package prometheus_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/metrics/internal/traffic"
	"github.com/throttlekit/throttlekit/metrics/prometheus"
)

// The calls are traffic.DryRun's; its comment says what each did.
func TestWouldDenyScrape(t *testing.T) {
	m, reg := newMetrics(t, nil)
	traffic.DryRun(t, m.Observe)
	want := `
# HELP throttlekit_would_deny_total Takes a policy would have denied for keys it runs in dry run, answered allowed, by policy.
# TYPE throttlekit_would_deny_total counter
throttlekit_would_deny_total{policy="burst"} 1
throttlekit_would_deny_total{policy="export"} 3
throttlekit_would_deny_total{policy="login"} 2
throttlekit_would_deny_total{policy="search"} 2
throttlekit_would_deny_total{policy="unnamed"} 1
# HELP throttlekit_decisions_total Throttler calls by policy, operation, who decided (primary, fallback, failure_mode, none) and result.
# TYPE throttlekit_decisions_total counter
throttlekit_decisions_total{op="peek",policy="login",result="allowed",source="primary"} 1
throttlekit_decisions_total{op="take",policy="export",result="allowed",source="primary"} 4
throttlekit_decisions_total{op="take",policy="login",result="allowed",source="primary"} 6
throttlekit_decisions_total{op="take",policy="login",result="denied",source="primary"} 1
throttlekit_decisions_total{op="take",policy="unnamed",result="allowed",source="primary"} 8
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want),
		"throttlekit_would_deny_total", "throttlekit_decisions_total"))
}

// The would-deny series are bounded as the decisions' are: policies beyond
// MaxPolicies count under "other".
func TestWouldDenyCardinalityIsBounded(t *testing.T) {
	m, reg := newMetrics(t, &prometheus.Options{MaxPolicies: 1})
	traffic.DryRun(t, m.Observe)
	want := `
# HELP throttlekit_would_deny_total Takes a policy would have denied for keys it runs in dry run, answered allowed, by policy.
# TYPE throttlekit_would_deny_total counter
throttlekit_would_deny_total{policy="login"} 2
throttlekit_would_deny_total{policy="other"} 7
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want), "throttlekit_would_deny_total"))
}
