package prometheus_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/metrics/internal/traffic"
)

// The dashboard and the alert rules under deploy/ may name only metrics
// that the adapter really exports: the names come from a registry scraped
// after traffic that makes every metric appear, not from a list.

const (
	dashboardFile = "../../deploy/grafana/throttlekit-migration.json"
	rulesFile     = "../../deploy/prometheus/throttlekit-alerts.yml"
)

// exported is every series name the adapter exports after traffic.Calls,
// traffic.DryRun and traffic.Drive, a histogram's _bucket, _sum and _count included.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	m, reg := newMetrics(t, nil)
	open, _ := traffic.Calls(t, m.Observe)
	require.NoError(t, m.Watch("open", open))
	traffic.DryRun(t, m.Observe)
	s := traffic.Drive(t)
	require.NoError(t, m.Watch("shadow", s.Mismatch))
	require.NoError(t, m.Watch("sessions", s.Migration))
	require.NoError(t, m.Watch("redis", func() backend.BatchStats { return backend.BatchStats{} }))
	families, err := reg.Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				names[f.GetName()+suffix] = true
			}
		}
	}
	return names
}

var (
	promqlStrings = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	promqlMatcher = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	promqlGroup   = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promqlIdent   = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	promqlWords   = []string{"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right", "inf", "nan", "le"}
)

// metricNames returns the metric names in a PromQL expression: the
// identifiers left once strings, label matchers, ranges and grouping
// clauses are gone that are neither functions (followed by "("), keywords,
// nor parts of numbers.
func metricNames(expr string) []string {
	s := promqlStrings.ReplaceAllString(expr, " ")
	s = promqlMatcher.ReplaceAllString(s, " ")
	s = promqlGroup.ReplaceAllString(s, " ")
	var out []string
	for _, loc := range promqlIdent.FindAllStringIndex(s, -1) {
		word := s[loc[0]:loc[1]]
		if loc[0] > 0 && strings.ContainsAny(s[loc[0]-1:loc[0]], "0123456789.$") {
			continue // 1e3, 0.5e-1, a $variable
		}
		if strings.HasPrefix(strings.TrimLeft(s[loc[1]:], " \t\n"), "(") || slices.Contains(promqlWords, strings.ToLower(word)) {
			continue
		}
		out = append(out, word)
	}
	return out
}

func TestMetricNamesOfPromQL(t *testing.T) {
	tests := []struct {
		expr string
		want []string
	}{
		{`sum by (store) (rate(a_total{x="y z",w=~"$v"}[5m])) / ignoring (reason) group_left sum(rate(b_count[$__rate_interval])) > 0.5e-1`, []string{"a_total", "b_count"}},
		{`histogram_quantile(0.99, sum by (le) (rate(h_bucket[1m]))) and on () vector(1) offset 5m`, []string{"h_bucket"}},
		{`max(x) > bool 1e3 or absent(y)`, []string{"x", "y"}},
		{`up`, []string{"up"}},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, metricNames(tt.expr), tt.expr)
	}
}

// checkExprs asserts that each expression names at least one metric and only
// exported ones, and (where promtool is installed: make test has it) that it
// parses, with Grafana's variables given values.
func checkExprs(t *testing.T, exprs map[string]string, names map[string]bool) map[string]bool {
	t.Helper()
	used := map[string]bool{}
	for where, expr := range exprs {
		got := metricNames(expr)
		assert.NotEmpty(t, got, "%s: %s names no metric", where, expr)
		for _, n := range got {
			used[n] = true
			assert.True(t, names[n], "%s: %s is not a metric the adapter exports", where, n)
		}
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool not installed: the expressions' syntax is not checked")
		return used
	}
	var rules []map[string]string
	for where, expr := range exprs {
		e := strings.NewReplacer("$__rate_interval", "5m", "$migration", ".*").Replace(expr)
		rules = append(rules, map[string]string{"record": fmt.Sprintf("check:%d", len(rules)), "expr": e})
		t.Logf("%s: %s", where, e)
	}
	out, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "check", "rules": rules}}})
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "exprs.yml")
	require.NoError(t, os.WriteFile(file, out, 0o600))
	res, err := exec.Command(promtool, "check", "rules", file).CombinedOutput()
	assert.NoError(t, err, "promtool check rules:\n%s", res)
	return used
}

func TestDashboardQueriesExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	var dash struct {
		UID    string
		Title  string
		Panels []struct {
			ID         int
			Type       string
			Title      string
			Datasource *struct{ Type, UID string }
			Targets    []struct{ Expr, RefID string }
		}
		Templating struct {
			List []struct {
				Name, Type, Definition string
			}
		}
	}
	require.NoError(t, json.Unmarshal(raw, &dash), "the dashboard is JSON")
	require.NotEmpty(t, dash.UID)
	require.NotEmpty(t, dash.Title)

	exprs := map[string]string{}
	ids := map[int]bool{}
	for _, p := range dash.Panels {
		assert.False(t, ids[p.ID], "panel id %d twice", p.ID)
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		require.NotNil(t, p.Datasource, p.Title)
		assert.Equal(t, "${datasource}", p.Datasource.UID, p.Title)
		assert.NotEmpty(t, p.Targets, "%s has no query", p.Title)
		for _, tg := range p.Targets {
			exprs[p.Title+" "+tg.RefID] = tg.Expr
		}
	}
	labelValues := regexp.MustCompile(`^label_values\((\w+),\s*\w+\)$`)
	for _, v := range dash.Templating.List {
		if v.Type == "query" {
			m := labelValues.FindStringSubmatch(v.Definition)
			require.NotNil(t, m, "variable %s: %q", v.Name, v.Definition)
			exprs["variable "+v.Name] = m[1]
		}
	}
	used := checkExprs(t, exprs, exported(t))
	// What the dashboard must show.
	for _, want := range []string{
		"throttlekit_router_calls_total",                   // share per store
		"throttlekit_shadow_mismatch_kinds_total",          // mismatches by kind
		"throttlekit_backend_call_duration_seconds_bucket", // latency per store
		"throttlekit_decisions_total",                      // degraded decisions
		"throttlekit_breakers_open",                        // breaker state
		"throttlekit_would_deny_total",                     // a limit's dry run
	} {
		assert.True(t, used[want], "the dashboard does not show %s", want)
	}
}

func TestAlertRulesUseExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile(rulesFile)
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Rules []struct{ Alert, Expr string }
		}
	}
	require.NoError(t, yaml.Unmarshal(raw, &rules))
	exprs := map[string]string{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			exprs[r.Alert] = r.Expr
		}
	}
	require.Len(t, exprs, 10)
	checkExprs(t, exprs, exported(t))
}
