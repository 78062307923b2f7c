package prometheus_test

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	prom "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/metrics/internal/traffic"
	"github.com/throttlekit/throttlekit/metrics/prometheus"
	"github.com/throttlekit/throttlekit/shadow"
	"github.com/throttlekit/throttlekit/throttler"
)

func newMetrics(t *testing.T, o *prometheus.Options) (*prometheus.Metrics, *prom.Registry) {
	t.Helper()
	m, err := prometheus.New(o)
	require.NoError(t, err)
	reg := prom.NewPedanticRegistry()
	require.NoError(t, reg.Register(m))
	return m, reg
}

// The calls are traffic.Calls'; its comment says what each did.
func TestObservedCallsScrape(t *testing.T) {
	m, reg := newMetrics(t, nil)
	open, _ := traffic.Calls(t, m.Observe)
	require.NoError(t, m.Watch("open", open))

	want := `
# HELP throttlekit_decisions_total Throttler calls by policy, operation, who decided (primary, fallback, failure_mode, none) and result.
# TYPE throttlekit_decisions_total counter
throttlekit_decisions_total{op="peek",policy="login",result="allowed",source="failure_mode"} 1
throttlekit_decisions_total{op="take",policy="login",result="allowed",source="fallback"} 1
throttlekit_decisions_total{op="take",policy="login",result="allowed",source="primary"} 2
throttlekit_decisions_total{op="take",policy="login",result="denied",source="failure_mode"} 2
throttlekit_decisions_total{op="take",policy="login",result="denied",source="primary"} 1
throttlekit_decisions_total{op="take",policy="login",result="error",source="none"} 1
throttlekit_decisions_total{op="take",policy="unnamed",result="allowed",source="primary"} 1
# HELP throttlekit_backend_errors_total Primary store failures by store and reason (timeout, error), answered by the fallback or the failure mode.
# TYPE throttlekit_backend_errors_total counter
throttlekit_backend_errors_total{reason="error",store="default"} 0
throttlekit_backend_errors_total{reason="error",store="redis-1"} 1
throttlekit_backend_errors_total{reason="error",store="redis-2"} 1
throttlekit_backend_errors_total{reason="error",store="redis-3"} 1
throttlekit_backend_errors_total{reason="timeout",store="default"} 0
throttlekit_backend_errors_total{reason="timeout",store="redis-1"} 0
throttlekit_backend_errors_total{reason="timeout",store="redis-2"} 1
throttlekit_backend_errors_total{reason="timeout",store="redis-3"} 0
# HELP throttlekit_breakers_open Watched Throttlers whose breaker for the store is open: its calls get the fallback or the failure mode.
# TYPE throttlekit_breakers_open gauge
throttlekit_breakers_open{store="redis-2"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want),
		"throttlekit_decisions_total", "throttlekit_backend_errors_total", "throttlekit_breakers_open"))

	counts := histogramCounts(t, reg, "throttlekit_backend_call_duration_seconds", "store")
	assert.Equal(t, map[string]uint64{"default": 4, "redis-1": 1, "redis-2": 2, "redis-3": 1}, counts,
		"every call a store decided, none of the refused one")
}

// histogramCounts gathers a histogram's sample counts by one label.
func histogramCounts(t *testing.T, reg prom.Gatherer, name, label string) map[string]uint64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]uint64{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					out[l.GetValue()] = m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return out
}

// The sources are traffic.Drive's; its comment says what each did.
func TestPulledStatsScrape(t *testing.T) {
	m, reg := newMetrics(t, nil)
	s := traffic.Drive(t)
	s.AddTo(t, m)

	want := `
# HELP throttlekit_router_calls_total Calls a router (or a migration) sent to each side: its share of traffic per store.
# TYPE throttlekit_router_calls_total counter
throttlekit_router_calls_total{router="r",side="new"} 2
throttlekit_router_calls_total{router="r",side="old"} 3
throttlekit_router_calls_total{router="sessions",side="new"} 1
throttlekit_router_calls_total{router="sessions",side="old"} 3
# HELP throttlekit_shadow_compared_total Pairs where both the control and the candidate answered.
# TYPE throttlekit_shadow_compared_total counter
throttlekit_shadow_compared_total{direction="",shadow="closed"} 0
throttlekit_shadow_compared_total{direction="",shadow="failing"} 0
throttlekit_shadow_compared_total{direction="",shadow="mismatch"} 1
throttlekit_shadow_compared_total{direction="forward",shadow="sessions"} 3
throttlekit_shadow_compared_total{direction="reverse",shadow="sessions"} 0
# HELP throttlekit_shadow_mismatches_total Compared pairs whose decisions differ (not ignored).
# TYPE throttlekit_shadow_mismatches_total counter
throttlekit_shadow_mismatches_total{direction="",shadow="closed"} 0
throttlekit_shadow_mismatches_total{direction="",shadow="failing"} 0
throttlekit_shadow_mismatches_total{direction="",shadow="mismatch"} 1
throttlekit_shadow_mismatches_total{direction="forward",shadow="sessions"} 0
throttlekit_shadow_mismatches_total{direction="reverse",shadow="sessions"} 0
# HELP throttlekit_shadow_candidate_errors_total Mirrored calls the candidate failed, timed out or panicked on.
# TYPE throttlekit_shadow_candidate_errors_total counter
throttlekit_shadow_candidate_errors_total{direction="",shadow="closed"} 0
throttlekit_shadow_candidate_errors_total{direction="",shadow="failing"} 1
throttlekit_shadow_candidate_errors_total{direction="",shadow="mismatch"} 0
throttlekit_shadow_candidate_errors_total{direction="forward",shadow="sessions"} 0
throttlekit_shadow_candidate_errors_total{direction="reverse",shadow="sessions"} 0
# HELP throttlekit_shadow_dropped_total Calls never mirrored (queue full or shadow closed): the candidate's counts lag.
# TYPE throttlekit_shadow_dropped_total counter
throttlekit_shadow_dropped_total{direction="",shadow="closed"} 1
throttlekit_shadow_dropped_total{direction="",shadow="failing"} 0
throttlekit_shadow_dropped_total{direction="",shadow="mismatch"} 0
throttlekit_shadow_dropped_total{direction="forward",shadow="sessions"} 0
throttlekit_shadow_dropped_total{direction="reverse",shadow="sessions"} 0
# HELP throttlekit_shadow_results_total Shadow results published: compared, failed or dropped.
# TYPE throttlekit_shadow_results_total counter
throttlekit_shadow_results_total{direction="",shadow="closed"} 1
throttlekit_shadow_results_total{direction="",shadow="failing"} 1
throttlekit_shadow_results_total{direction="",shadow="mismatch"} 1
throttlekit_shadow_results_total{direction="forward",shadow="sessions"} 3
throttlekit_shadow_results_total{direction="reverse",shadow="sessions"} 0
# HELP throttlekit_migration_moving_calls_total Calls for keys a change of percentage is moving, each made on both stores.
# TYPE throttlekit_migration_moving_calls_total counter
throttlekit_migration_moving_calls_total{migration="sessions"} 1
# HELP throttlekit_migration_percent_changes_total Changes of the rollout's percentage this process has seen.
# TYPE throttlekit_migration_percent_changes_total counter
throttlekit_migration_percent_changes_total{migration="sessions"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want),
		"throttlekit_router_calls_total", "throttlekit_shadow_compared_total", "throttlekit_shadow_mismatches_total",
		"throttlekit_shadow_candidate_errors_total", "throttlekit_shadow_dropped_total", "throttlekit_shadow_results_total",
		"throttlekit_migration_moving_calls_total", "throttlekit_migration_percent_changes_total"))

	kinds := `
# HELP throttlekit_shadow_mismatch_kinds_total Mismatches carrying each kind of difference (one mismatch may carry several); kinds reordered and late: differing pairs the order of calls (or a late answer) explains, not mismatches.
# TYPE throttlekit_shadow_mismatch_kinds_total counter
throttlekit_shadow_mismatch_kinds_total{direction="",kind="allowed",shadow="closed"} 0
throttlekit_shadow_mismatch_kinds_total{direction="",kind="late",shadow="closed"} 0
throttlekit_shadow_mismatch_kinds_total{direction="",kind="reordered",shadow="closed"} 0
throttlekit_shadow_mismatch_kinds_total{direction="",kind="reset_at",shadow="closed"} 0
throttlekit_shadow_mismatch_kinds_total{direction="",kind="retry_after",shadow="closed"} 0
throttlekit_shadow_mismatch_kinds_total{direction="",kind="used",shadow="closed"} 0
throttlekit_shadow_mismatch_kinds_total{direction="",kind="allowed",shadow="failing"} 0
throttlekit_shadow_mismatch_kinds_total{direction="",kind="late",shadow="failing"} 0
throttlekit_shadow_mismatch_kinds_total{direction="",kind="reordered",shadow="failing"} 0
throttlekit_shadow_mismatch_kinds_total{direction="",kind="reset_at",shadow="failing"} 0
throttlekit_shadow_mismatch_kinds_total{direction="",kind="retry_after",shadow="failing"} 0
throttlekit_shadow_mismatch_kinds_total{direction="",kind="used",shadow="failing"} 0
throttlekit_shadow_mismatch_kinds_total{direction="",kind="allowed",shadow="mismatch"} 1
throttlekit_shadow_mismatch_kinds_total{direction="",kind="late",shadow="mismatch"} 0
throttlekit_shadow_mismatch_kinds_total{direction="",kind="reordered",shadow="mismatch"} 0
throttlekit_shadow_mismatch_kinds_total{direction="",kind="reset_at",shadow="mismatch"} 1
throttlekit_shadow_mismatch_kinds_total{direction="",kind="retry_after",shadow="mismatch"} 0
throttlekit_shadow_mismatch_kinds_total{direction="",kind="used",shadow="mismatch"} 1
throttlekit_shadow_mismatch_kinds_total{direction="forward",kind="allowed",shadow="sessions"} 0
throttlekit_shadow_mismatch_kinds_total{direction="forward",kind="late",shadow="sessions"} 0
throttlekit_shadow_mismatch_kinds_total{direction="forward",kind="reordered",shadow="sessions"} 0
throttlekit_shadow_mismatch_kinds_total{direction="forward",kind="reset_at",shadow="sessions"} 0
throttlekit_shadow_mismatch_kinds_total{direction="forward",kind="retry_after",shadow="sessions"} 0
throttlekit_shadow_mismatch_kinds_total{direction="forward",kind="used",shadow="sessions"} 0
throttlekit_shadow_mismatch_kinds_total{direction="reverse",kind="allowed",shadow="sessions"} 0
throttlekit_shadow_mismatch_kinds_total{direction="reverse",kind="late",shadow="sessions"} 0
throttlekit_shadow_mismatch_kinds_total{direction="reverse",kind="reordered",shadow="sessions"} 0
throttlekit_shadow_mismatch_kinds_total{direction="reverse",kind="reset_at",shadow="sessions"} 0
throttlekit_shadow_mismatch_kinds_total{direction="reverse",kind="retry_after",shadow="sessions"} 0
throttlekit_shadow_mismatch_kinds_total{direction="reverse",kind="used",shadow="sessions"} 0
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(kinds), "throttlekit_shadow_mismatch_kinds_total"))
}

func TestCardinalityIsBounded(t *testing.T) {
	m, reg := newMetrics(t, &prometheus.Options{MaxPolicies: 2, MaxStores: 2})
	for _, name := range []string{"a", "b", "c", "d", "a", "\xff"} {
		for _, store := range []string{"", "s1", "s2", "s3"} {
			m.Observe(throttler.Observation{Op: throttler.OpTake, Policy: throttler.Policy{Name: name}, Store: store, Decision: throttler.Decision{Allowed: true}})
		}
	}
	m.Observe(throttler.Observation{Op: throttler.OpAcquire, Concurrency: throttler.ConcurrencyPolicy{Name: "uploads"}, Store: "s1"})
	want := `
# HELP throttlekit_decisions_total Throttler calls by policy, operation, who decided (primary, fallback, failure_mode, none) and result.
# TYPE throttlekit_decisions_total counter
throttlekit_decisions_total{op="acquire",policy="other",result="denied",source="primary"} 1
throttlekit_decisions_total{op="take",policy="a",result="allowed",source="primary"} 8
throttlekit_decisions_total{op="take",policy="b",result="allowed",source="primary"} 4
throttlekit_decisions_total{op="take",policy="other",result="allowed",source="primary"} 12
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want), "throttlekit_decisions_total"))
	assert.Equal(t, map[string]uint64{"default": 6, "s1": 7, "other": 12},
		histogramCounts(t, reg, "throttlekit_backend_call_duration_seconds", "store"),
		"the default store takes one of the two places")
}

func TestLeaseOpsCountUnderTheConcurrencyPolicy(t *testing.T) {
	m, reg := newMetrics(t, nil)
	ok := throttler.Decision{Allowed: true}
	m.Observe(throttler.Observation{Op: throttler.OpAcquire, Concurrency: throttler.ConcurrencyPolicy{Name: "uploads", Limit: 2, TTL: time.Minute}, Decision: ok})
	m.Observe(throttler.Observation{Op: throttler.OpRelease, Concurrency: throttler.ConcurrencyPolicy{Name: "uploads", Limit: 2, TTL: time.Minute}, Decision: ok, Policy: traffic.Login})
	want := `
# HELP throttlekit_decisions_total Throttler calls by policy, operation, who decided (primary, fallback, failure_mode, none) and result.
# TYPE throttlekit_decisions_total counter
throttlekit_decisions_total{op="acquire",policy="uploads",result="allowed",source="primary"} 1
throttlekit_decisions_total{op="release",policy="uploads",result="allowed",source="primary"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want), "throttlekit_decisions_total"))
}

func TestNewRefusesBadOptions(t *testing.T) {
	tests := []struct {
		opts prometheus.Options
		want string
	}{
		{prometheus.Options{MaxPolicies: -1}, "prometheus: Options.MaxPolicies must be >= 0, got -1"},
		{prometheus.Options{MaxStores: -2}, "prometheus: Options.MaxStores must be >= 0, got -2"},
		{prometheus.Options{Buckets: []float64{0.1, 0.1}}, "prometheus: Options.Buckets must be positive, finite and increasing by at least 1ns, got [0.1 0.1]"},
		{prometheus.Options{Buckets: []float64{0, 1}}, "prometheus: Options.Buckets must be positive, finite and increasing by at least 1ns, got [0 1]"},
		{prometheus.Options{Buckets: []float64{1, math.Inf(1)}}, "prometheus: Options.Buckets must be positive, finite and increasing by at least 1ns, got [1 +Inf]"},
		{prometheus.Options{Buckets: []float64{1e-10}}, "prometheus: Options.Buckets must be positive, finite and increasing by at least 1ns, got [1e-10]"},
	}
	for _, tt := range tests {
		_, err := prometheus.New(&tt.opts)
		assert.EqualError(t, err, tt.want)
	}
}

// Watch refuses, when it is called, a source it could not read; its errors
// carry the adapter's prefix (metricdef's tests cover every case).
func TestWatchRefusesBadSources(t *testing.T) {
	m, _ := newMetrics(t, nil)
	s := traffic.Drive(t)
	require.NoError(t, m.Watch("r", s.Router))
	tests := []struct {
		err  error
		want string
	}{
		{m.Watch("r", s.Router), `prometheus: Watch "r": name already watched`},
		{m.Watch("r", s.Migration), `prometheus: Watch "r": name already watched`},
		{m.Watch("", s.Mismatch), `prometheus: Watch "": empty name`},
		{m.Watch("x", (*shadow.Backend)(nil)), `prometheus: Watch "x": the source is a nil *shadow.Backend`},
		{m.Watch("x", nil), `prometheus: Watch "x": the source is nil`},
		{m.Watch("bad\xff", s.Router), `prometheus: Watch "bad\xff": a name is valid UTF-8 of at most 128 bytes`},
		{m.Watch(strings.Repeat("m", 129), s.Migration), `prometheus: Watch "` + strings.Repeat("m", 129) + `": a name is valid UTF-8 of at most 128 bytes`},
		{m.Watch("x", (*throttler.Throttler)(nil)), `prometheus: Watch "x": the source is a nil *throttler.Throttler`},
		{m.Watch("x", s.Router.Take), `prometheus: Watch "x": a func(context.Context, string, throttler.Policy, int64, time.Time) (throttler.Decision, error) is not a source: want a *throttler.Throttler, or a *flags.Router, *shadow.Backend, *migration.Migration, batching backend (backend/redis) or backend/memory Backend, or its Stats method`},
	}
	for _, tt := range tests {
		assert.EqualError(t, tt.err, tt.want)
	}
	_, healthy := traffic.Calls(t, nil)
	require.NoError(t, m.Watch("healthy", healthy))
	assert.EqualError(t, m.Watch("healthy-again", healthy), `prometheus: Watch "healthy-again": the Throttler is watched under another name`)
}

// A batching backend's counts, read at each scrape: round trips by size,
// operations and the over-limit cache, under backend=name. The counts are
// a redis.Backend's Stats in an application; fixed here.
func TestBatchingScrape(t *testing.T) {
	m, reg := newMetrics(t, nil)
	st := backend.BatchStats{RoundTrips: 10, Ops: 41, Batched: 33, Abandoned: 2,
		BatchSizes: [8]uint64{6, 1, 0, 3}, CacheHits: 7, CacheKeys: 3, PrimarySwitches: 1}
	require.NoError(t, m.Watch("redis", func() backend.BatchStats { return st }))
	st.CacheHits = 9 // read at the scrape, not when added

	want := `
# HELP throttlekit_backend_round_trips_total Requests a batching backend sent to its store: a batch, or one operation alone.
# TYPE throttlekit_backend_round_trips_total counter
throttlekit_backend_round_trips_total{backend="redis"} 10
# HELP throttlekit_backend_operations_total Operations the round trips carried: over round trips, the mean batch size.
# TYPE throttlekit_backend_operations_total counter
throttlekit_backend_operations_total{backend="redis"} 41
# HELP throttlekit_backend_batched_operations_total Operations that waited for a batch instead of going alone.
# TYPE throttlekit_backend_batched_operations_total counter
throttlekit_backend_batched_operations_total{backend="redis"} 33
# HELP throttlekit_backend_abandoned_operations_total Operations whose callers left before their batch was sent: never run.
# TYPE throttlekit_backend_abandoned_operations_total counter
throttlekit_backend_abandoned_operations_total{backend="redis"} 2
# HELP throttlekit_backend_round_trips_by_size_total Round trips by how many operations they carried (size 1, 2-3, 4-7, ..., 128+).
# TYPE throttlekit_backend_round_trips_by_size_total counter
throttlekit_backend_round_trips_by_size_total{backend="redis",size="1"} 6
throttlekit_backend_round_trips_by_size_total{backend="redis",size="2-3"} 1
throttlekit_backend_round_trips_by_size_total{backend="redis",size="4-7"} 0
throttlekit_backend_round_trips_by_size_total{backend="redis",size="8-15"} 3
throttlekit_backend_round_trips_by_size_total{backend="redis",size="16-31"} 0
throttlekit_backend_round_trips_by_size_total{backend="redis",size="32-63"} 0
throttlekit_backend_round_trips_by_size_total{backend="redis",size="64-127"} 0
throttlekit_backend_round_trips_by_size_total{backend="redis",size="128+"} 0
# HELP throttlekit_overlimit_cache_hits_total Takes the over-limit cache denied without a round trip.
# TYPE throttlekit_overlimit_cache_hits_total counter
throttlekit_overlimit_cache_hits_total{backend="redis"} 9
# HELP throttlekit_overlimit_cache_keys Keys the over-limit cache holds: each denied until the instant its store named.
# TYPE throttlekit_overlimit_cache_keys gauge
throttlekit_overlimit_cache_keys{backend="redis"} 3
# HELP throttlekit_backend_primary_switches_total Primary switches a backend saw: its primary client reached another server, or its server turned replica (READONLY).
# TYPE throttlekit_backend_primary_switches_total counter
throttlekit_backend_primary_switches_total{backend="redis"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want),
		"throttlekit_backend_round_trips_total", "throttlekit_backend_operations_total",
		"throttlekit_backend_batched_operations_total", "throttlekit_backend_abandoned_operations_total",
		"throttlekit_backend_round_trips_by_size_total", "throttlekit_overlimit_cache_hits_total", "throttlekit_overlimit_cache_keys",
		"throttlekit_backend_primary_switches_total"))
	assert.EqualError(t, m.Watch("redis", func() backend.BatchStats { return st }), `prometheus: Watch "redis": name already watched`)
	assert.EqualError(t, m.Watch("other", (func() backend.BatchStats)(nil)), `prometheus: Watch "other": the source is a nil func() backend.BatchStats`)
}

// An in-process backend's counts, read at each scrape under backend=name:
// here a table of one key that two keys share, so one was evicted and
// came back from the second tier, evicting the other.
func TestMemoryScrape(t *testing.T) {
	m, reg := newMetrics(t, nil)
	mem := traffic.FullMemory(t)                 // its comment says what it holds
	require.NoError(t, m.Watch("embedded", mem)) // the Backend itself
	bytes := mem.Stats().Bytes                   // its tables' arrays: a size the allocator picks
	require.Positive(t, bytes)
	want := `
# HELP throttlekit_memory_bytes Heap an in-process backend's tables hold, keys included: slots, second tier, logs and lease sets.
# TYPE throttlekit_memory_bytes gauge
throttlekit_memory_bytes{backend="embedded"} ` + strconv.FormatInt(bytes, 10) + `
# HELP throttlekit_memory_evictions_total Live states a full in-process backend moved to its second tier to make room.
# TYPE throttlekit_memory_evictions_total counter
throttlekit_memory_evictions_total{backend="embedded"} 2
# HELP throttlekit_memory_keys (key, policy) states an in-process backend holds, bounded by its MaxKeys.
# TYPE throttlekit_memory_keys gauge
throttlekit_memory_keys{backend="embedded"} 1
# HELP throttlekit_memory_second_tier_hits_total Calls an in-process backend answered from a state its second tier remembered (may over-count, never under).
# TYPE throttlekit_memory_second_tier_hits_total counter
throttlekit_memory_second_tier_hits_total{backend="embedded"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want),
		"throttlekit_memory_evictions_total", "throttlekit_memory_keys", "throttlekit_memory_second_tier_hits_total",
		"throttlekit_memory_bytes"))
	assert.EqualError(t, m.Watch("embedded", mem.Stats), `prometheus: Watch "embedded": name already watched`)
	assert.EqualError(t, m.Watch("other", (*memory.Backend)(nil)), `prometheus: Watch "other": the source is a nil *memory.Backend`)
}
