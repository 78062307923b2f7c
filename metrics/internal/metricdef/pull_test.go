package metricdef_test

import (
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/flags"
	. "github.com/throttlekit/throttlekit/metrics/internal/metricdef"
	"github.com/throttlekit/throttlekit/metrics/internal/traffic"
	"github.com/throttlekit/throttlekit/shadow"
)

// backend/redis's Backend is a batching source (metricdef does not import
// it: the adapters never compile in a Redis client).
var _ interface{ Stats() backend.BatchStats } = (*redis.Backend)(nil)

// batch is a batching backend's Stats, fixed: a backend/redis Backend in an
// application.
type batch backend.BatchStats

func (b batch) Stats() backend.BatchStats { return backend.BatchStats(b) }

var (
	shadowPulls = []Pull{ShadowResults, ShadowCompared, ShadowMismatches, ShadowIgnored,
		ShadowDifferences, ShadowCandidateErrors, ShadowControlErrors, ShadowDropped, ShadowQueued,
		ShadowPublishDropped}
	movePulls   = []Pull{MigrationMovingCalls, MigrationCompensated, MigrationRefundFailures, MigrationOneStore, MigrationPercentChanges, MigrationLate}
	batchPulls  = []Pull{BatchRoundTrips, BatchOperations, BatchBatched, BatchAbandoned, BatchRoundTripsBySize, CacheHits, CacheKeys, BackendPrimarySwitches}
	memoryPulls = []Pull{MemoryKeys, MemoryEvictions, MemorySecondTierHits, MemoryBytes}
)

// series are "metric first-label second-label" of each pull, the labels
// that tell one source from another (the kind and size labels aside).
func series(pulls []Pull, labels ...string) []string {
	var out []string
	for _, p := range pulls {
		out = append(out, strings.Join(append([]string{Specs[p].Prom}, labels...), " "))
	}
	return out
}

// routed are a router's series: both sides.
func routed(name string) []string {
	return append(series([]Pull{RouterCalls}, name, "old"), series([]Pull{RouterCalls}, name, "new")...)
}

// collect is every distinct series s yields and the value of the first
// sample of want.
func collect(s *Sources, want Pull) (got []string, value float64) {
	seen := map[string]bool{}
	found := false
	s.Collect(func(x Sample) {
		n := len(Specs[x.Pull].Labels)
		if x.Pull == ShadowDifferences || x.Pull == BatchRoundTripsBySize {
			n-- // the kind or size label
		}
		key := strings.Join(append([]string{Specs[x.Pull].Prom}, x.Labels[:n]...), " ")
		if !seen[key] {
			seen[key] = true
			got = append(got, key)
		}
		if x.Pull == want && !found {
			value, found = x.Value, true
		}
	})
	sort.Strings(got)
	return got, value
}

// Watch sends each kind of source, given as itself or as its Stats method,
// to its metrics under its name, and nothing else: a source read as
// another kind, or a label swapped, changes the series.
func TestWatchRoutesEachSource(t *testing.T) {
	s := traffic.Drive(t)
	open, _ := traffic.Calls(t, nil)
	mem := traffic.FullMemory(t)
	b := batch{RoundTrips: 10, Ops: 41}
	tests := []struct {
		name   string
		source any
		want   []string
		pull   Pull    // a metric the source sets
		value  float64 // its first sample's value
	}{
		{"a-throttler", open, series([]Pull{BreakersOpen}, "redis-2"), BreakersOpen, 1},
		{"r", s.Router, routed("r"), RouterCalls, 3},
		{"r", s.Router.Stats, routed("r"), RouterCalls, 3},
		{"mismatch", s.Mismatch, series(shadowPulls, "mismatch", ""), ShadowMismatches, 1},
		{"mismatch", s.Mismatch.Stats, series(shadowPulls, "mismatch", ""), ShadowMismatches, 1},
		{"sessions", s.Migration, append(append(append(routed("sessions"),
			series(shadowPulls, "sessions", "forward")...), series(shadowPulls, "sessions", "reverse")...),
			series(movePulls, "sessions")...), MigrationMovingCalls, 1},
		{"sessions", s.Migration.Stats, append(append(append(routed("sessions"),
			series(shadowPulls, "sessions", "forward")...), series(shadowPulls, "sessions", "reverse")...),
			series(movePulls, "sessions")...), MigrationMovingCalls, 1},
		{"redis", b, series(batchPulls, "redis"), BatchOperations, 41},
		{"redis", b.Stats, series(batchPulls, "redis"), BatchOperations, 41},
		{"embedded", mem, series(memoryPulls, "embedded"), MemoryEvictions, 2},
		{"embedded", mem.Stats, series(memoryPulls, "embedded"), MemoryEvictions, 2},
	}
	for _, tt := range tests {
		var src Sources
		require.NoError(t, src.Watch(tt.name, tt.source), "%T", tt.source)
		got, value := collect(&src, tt.pull)
		sort.Strings(tt.want)
		assert.Equal(t, tt.want, got, "%T", tt.source)
		assert.Equal(t, tt.value, value, "%T: %s", tt.source, Specs[tt.pull].Prom)
	}
}

// Watch refuses, when it is called, what it could not read: a source of
// no known kind, a nil one, a bad or taken name, a Throttler twice.
func TestWatchRefuses(t *testing.T) {
	s := traffic.Drive(t)
	open, _ := traffic.Calls(t, nil)
	var src Sources
	require.NoError(t, src.Watch("r", s.Router))
	require.NoError(t, src.Watch("open", open))
	tests := []struct {
		name   string
		source any
		want   string
	}{
		{"x", 42, `Watch "x": a int is not a source: want a *throttler.Throttler, or a *flags.Router, *shadow.Backend, *migration.Migration, batching backend (backend/redis) or backend/memory Backend, or its Stats method`},
		{"x", func() int { return 1 }, `Watch "x": a func() int is not a source: want `},
		{"x", shadow.Stats{}, `Watch "x": a shadow.Stats is not a source: want `},
		{"x", memory.Options{}, `Watch "x": a memory.Options is not a source: want `},
		{"x", nil, `Watch "x": the source is nil`},
		{"x", (*flags.Router)(nil), `Watch "x": the source is a nil *flags.Router`},
		{"x", (func() backend.BatchStats)(nil), `Watch "x": the source is a nil func() backend.BatchStats`},
		{"r", s.Router, `Watch "r": name already watched`},
		{"r", s.Migration, `Watch "r": name already watched`},
		{"", s.Mismatch, `Watch "": empty name`},
		{"bad\xff", s.Router, `Watch "bad\xff": a name is valid UTF-8 of at most 128 bytes`},
		{strings.Repeat("m", 129), s.Migration, `Watch "` + strings.Repeat("m", 129) + `": a name is valid UTF-8 of at most 128 bytes`},
		{"again", open, `Watch "again": the Throttler is watched under another name`},
	}
	for _, tt := range tests {
		err := src.Watch(tt.name, tt.source)
		require.Error(t, err, "%T", tt.source)
		assert.True(t, strings.HasPrefix(err.Error(), tt.want), "%T: %v", tt.source, err)
	}
	// Nothing refused was added: the sources are the two watched.
	got, _ := collect(&src, RouterCalls)
	assert.Equal(t, []string{"throttlekit_breakers_open redis-2", "throttlekit_router_calls_total r new", "throttlekit_router_calls_total r old"}, got)
}
