package otel_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/metrics/internal/traffic"
	"github.com/throttlekit/throttlekit/metrics/otel"
)

func newMetrics(t *testing.T, o *otel.Options) (*otel.Metrics, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	m, err := otel.New(mp, o)
	require.NoError(t, err)
	return m, reader
}

// collect reads every instrument of the adapter's scope, by name.
func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.Collect(context.Background(), &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, otel.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

func attrs(kv ...string) attribute.Set {
	var out []attribute.KeyValue
	for i := 0; i < len(kv); i += 2 {
		out = append(out, attribute.String(kv[i], kv[i+1]))
	}
	return attribute.NewSet(out...)
}

func sum(points ...metricdata.DataPoint[int64]) metricdata.Sum[int64] {
	return metricdata.Sum[int64]{Temporality: metricdata.CumulativeTemporality, IsMonotonic: true, DataPoints: points}
}

func point(v int64, kv ...string) metricdata.DataPoint[int64] {
	return metricdata.DataPoint[int64]{Attributes: attrs(kv...), Value: v}
}

func decision(v int64, policy, op, source, result string) metricdata.DataPoint[int64] {
	return point(v, "throttlekit.policy", policy, "throttlekit.op", op, "throttlekit.source", source, "throttlekit.result", result)
}

// documentedBuckets are Options.Buckets' default, as its comment lists them.
var documentedBuckets = []float64{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}

// The calls are traffic.Calls'; its comment says what each did.
func TestObservedCallsCollect(t *testing.T) {
	m, reader := newMetrics(t, nil)
	open, _ := traffic.Calls(t, m.Observe)
	require.NoError(t, m.Watch("open", open))
	got := collect(t, reader)

	dec := got["throttlekit.decisions"]
	assert.Equal(t, "{decision}", dec.Unit)
	metricdatatest.AssertAggregationsEqual(t, sum(
		decision(1, "login", "peek", "failure_mode", "allowed"),
		decision(1, "login", "take", "fallback", "allowed"),
		decision(2, "login", "take", "primary", "allowed"),
		decision(2, "login", "take", "failure_mode", "denied"),
		decision(1, "login", "take", "primary", "denied"),
		decision(1, "login", "take", "none", "error"),
		decision(1, "unnamed", "take", "primary", "allowed"),
	), dec.Data, metricdatatest.IgnoreTimestamp())

	errs := got["throttlekit.backend.errors"]
	assert.Equal(t, "{error}", errs.Unit)
	metricdatatest.AssertAggregationsEqual(t, sum(
		point(1, "throttlekit.store", "redis-1", "error.type", "error"),
		point(1, "throttlekit.store", "redis-2", "error.type", "timeout"),
		point(1, "throttlekit.store", "redis-2", "error.type", "error"),
		point(1, "throttlekit.store", "redis-3", "error.type", "error"),
	), errs.Data, metricdatatest.IgnoreTimestamp())

	breakers := got["throttlekit.breakers.open"]
	metricdatatest.AssertAggregationsEqual(t, metricdata.Gauge[int64]{DataPoints: []metricdata.DataPoint[int64]{
		point(1, "throttlekit.store", "redis-2"),
	}}, breakers.Data, metricdatatest.IgnoreTimestamp())

	lat := got["throttlekit.backend.duration"]
	assert.Equal(t, "s", lat.Unit)
	hist, ok := lat.Data.(metricdata.Histogram[float64])
	require.True(t, ok, "%T", lat.Data)
	counts := map[string]uint64{}
	for _, p := range hist.DataPoints {
		store, _ := p.Attributes.Value("throttlekit.store")
		counts[store.AsString()] = p.Count
		assert.Equal(t, documentedBuckets, p.Bounds)
	}
	assert.Equal(t, map[string]uint64{"default": 4, "redis-1": 1, "redis-2": 2, "redis-3": 1}, counts)
}

// The sources are traffic.Drive's; its comment says what each did.
func TestPulledStatsCollect(t *testing.T) {
	m, reader := newMetrics(t, nil)
	s := traffic.Drive(t)
	s.AddTo(t, m)
	got := collect(t, reader)

	side := func(v int64, router, side string) metricdata.DataPoint[int64] {
		return point(v, "throttlekit.router", router, "throttlekit.side", side)
	}
	metricdatatest.AssertAggregationsEqual(t, sum(
		side(3, "r", "old"), side(2, "r", "new"), side(3, "sessions", "old"), side(1, "sessions", "new"),
	), got["throttlekit.router.calls"].Data, metricdatatest.IgnoreTimestamp())

	perShadow := func(closed, failing, mismatch, forward, reverse int64) metricdata.Sum[int64] {
		sh := func(v int64, name, dir string) metricdata.DataPoint[int64] {
			return point(v, "throttlekit.shadow", name, "throttlekit.direction", dir)
		}
		return sum(sh(closed, "closed", ""), sh(failing, "failing", ""), sh(mismatch, "mismatch", ""),
			sh(forward, "sessions", "forward"), sh(reverse, "sessions", "reverse"))
	}
	for name, want := range map[string]metricdata.Sum[int64]{
		"throttlekit.shadow.results":          perShadow(1, 1, 1, 3, 0),
		"throttlekit.shadow.compared":         perShadow(0, 0, 1, 3, 0),
		"throttlekit.shadow.mismatches":       perShadow(0, 0, 1, 0, 0),
		"throttlekit.shadow.candidate_errors": perShadow(0, 1, 0, 0, 0),
		"throttlekit.shadow.dropped":          perShadow(1, 0, 0, 0, 0),
	} {
		metricdatatest.AssertAggregationsEqual(t, want, got[name].Data, metricdatatest.IgnoreTimestamp())
	}

	kinds, ok := got["throttlekit.shadow.mismatch_kinds"].Data.(metricdata.Sum[int64])
	require.True(t, ok)
	byKind := map[string]int64{}
	for _, p := range kinds.DataPoints {
		if name, _ := p.Attributes.Value("throttlekit.shadow"); name.AsString() == "mismatch" {
			k, _ := p.Attributes.Value("throttlekit.kind")
			byKind[k.AsString()] = p.Value
		}
	}
	assert.Equal(t, map[string]int64{"allowed": 1, "used": 1, "reset_at": 1, "retry_after": 0, "reordered": 0, "late": 0}, byKind)

	metricdatatest.AssertAggregationsEqual(t, sum(point(1, "throttlekit.migration", "sessions")),
		got["throttlekit.migration.moving.calls"].Data, metricdatatest.IgnoreTimestamp())

	require.NoError(t, m.Unregister())
	_, still := collect(t, reader)["throttlekit.router.calls"]
	assert.False(t, still, "unregistered: the sources are no longer read")
}

func TestNewRefusesBadInput(t *testing.T) {
	mp := sdkmetric.NewMeterProvider()
	tests := []struct {
		opts otel.Options
		want string
	}{
		{otel.Options{MaxPolicies: -1}, "otel: Options.MaxPolicies must be >= 0, got -1"},
		{otel.Options{MaxStores: -1}, "otel: Options.MaxStores must be >= 0, got -1"},
		{otel.Options{Buckets: []float64{2, 1}}, "otel: Options.Buckets must be positive, finite and increasing by at least 1ns, got [2 1]"},
	}
	for _, tt := range tests {
		_, err := otel.New(mp, &tt.opts)
		assert.EqualError(t, err, tt.want)
	}
	_, err := otel.New(nil, nil)
	assert.EqualError(t, err, "otel: New needs a MeterProvider, got nil")
}

// batcher is a batching backend whose counts are fixed.
type batcher struct{ st backend.BatchStats }

func (b *batcher) Stats() backend.BatchStats { return b.st }

// A batching backend's counts as observable instruments, read at each
// collection, under throttlekit.backend=name (fixed counts here; a
// redis.Backend's Stats in an application).
func TestBatchingCollect(t *testing.T) {
	m, reader := newMetrics(t, nil)
	b := &batcher{backend.BatchStats{RoundTrips: 10, Ops: 41, Batched: 33, Abandoned: 2,
		BatchSizes: [8]uint64{6, 1, 0, 3}, CacheHits: 7, CacheKeys: 3, PrimarySwitches: 1}}
	require.NoError(t, m.Watch("redis", b)) // the backend itself, as a *redis.Backend
	b.st.RoundTrips = 11                    // read at the collection, not when added
	got := collect(t, reader)

	one := func(v int64) metricdata.Sum[int64] { return sum(point(v, "throttlekit.backend", "redis")) }
	for name, want := range map[string]metricdata.Sum[int64]{
		"throttlekit.backend.round_trips":          one(11),
		"throttlekit.backend.operations":           one(41),
		"throttlekit.backend.batched_operations":   one(33),
		"throttlekit.backend.abandoned_operations": one(2),
		"throttlekit.overlimit_cache.hits":         one(7),
		"throttlekit.backend.primary_switches":     one(1),
	} {
		metricdatatest.AssertAggregationsEqual(t, want, got[name].Data, metricdatatest.IgnoreTimestamp())
	}
	keys, ok := got["throttlekit.overlimit_cache.keys"].Data.(metricdata.Gauge[int64])
	require.True(t, ok)
	require.Len(t, keys.DataPoints, 1)
	assert.Equal(t, int64(3), keys.DataPoints[0].Value)

	bySize, ok := got["throttlekit.backend.round_trips_by_size"].Data.(metricdata.Sum[int64])
	require.True(t, ok)
	sizes := map[string]int64{}
	for _, p := range bySize.DataPoints {
		s, _ := p.Attributes.Value("throttlekit.size")
		sizes[s.AsString()] = p.Value
	}
	assert.Equal(t, map[string]int64{"1": 6, "2-3": 1, "4-7": 0, "8-15": 3, "16-31": 0, "32-63": 0, "64-127": 0, "128+": 0}, sizes)
	assert.EqualError(t, m.Watch("other", (*batcher)(nil)), `otel: Watch "other": the source is a nil *otel_test.batcher`)
	assert.EqualError(t, m.Watch("other", b.st), `otel: Watch "other": a backend.BatchStats is not a source: want a *throttler.Throttler, or a *flags.Router, *shadow.Backend, *migration.Migration, batching backend (backend/redis) or backend/memory Backend, or its Stats method`)
}

// An in-process backend's counts as observable instruments, under
// throttlekit.backend=name: a table of one key that two keys share.
func TestMemoryCollect(t *testing.T) {
	m, reader := newMetrics(t, nil)
	mem := traffic.FullMemory(t)                       // its comment says what it holds
	require.NoError(t, m.Watch("embedded", mem.Stats)) // its Stats method
	got := collect(t, reader)
	one := func(v int64) metricdata.Sum[int64] { return sum(point(v, "throttlekit.backend", "embedded")) }
	metricdatatest.AssertAggregationsEqual(t, one(2), got["throttlekit.memory.evictions"].Data, metricdatatest.IgnoreTimestamp())
	metricdatatest.AssertAggregationsEqual(t, one(1), got["throttlekit.memory.second_tier_hits"].Data, metricdatatest.IgnoreTimestamp())
	keys, ok := got["throttlekit.memory.keys"].Data.(metricdata.Gauge[int64])
	require.True(t, ok)
	require.Len(t, keys.DataPoints, 1)
	assert.Equal(t, int64(1), keys.DataPoints[0].Value)
	usage, ok := got["throttlekit.memory.usage"].Data.(metricdata.Gauge[int64])
	require.True(t, ok)
	require.Len(t, usage.DataPoints, 1)
	assert.Equal(t, mem.Stats().Bytes, usage.DataPoints[0].Value, "its tables' arrays: a size the allocator picks")
	assert.Positive(t, usage.DataPoints[0].Value)
	assert.Equal(t, "By", got["throttlekit.memory.usage"].Unit)
	assert.EqualError(t, m.Watch("embedded", mem), `otel: Watch "embedded": name already watched`)
	assert.EqualError(t, m.Watch("other", (func() memory.Stats)(nil)), `otel: Watch "other": the source is a nil func() memory.Stats`)
}
