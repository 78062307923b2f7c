package metricdef

import (
	"errors"
	"fmt"
	"sync"
	"unicode/utf8"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/migration"
	"github.com/throttlekit/throttlekit/shadow"
	"github.com/throttlekit/throttlekit/throttler"
)

// Pull names a metric read from a source's Stats at each collection, so
// that the core needs no hook for it and costs nothing between scrapes.
type Pull int

// The pulled metrics.
const (
	RouterCalls Pull = iota
	ShadowResults
	ShadowCompared
	ShadowMismatches
	ShadowIgnored
	ShadowDifferences
	ShadowCandidateErrors
	ShadowControlErrors
	ShadowDropped
	ShadowQueued
	ShadowPublishDropped
	MigrationMovingCalls
	MigrationCompensated
	MigrationRefundFailures
	MigrationOneStore
	MigrationPercentChanges
	BreakersOpen
	BatchRoundTrips
	BatchOperations
	BatchBatched
	BatchAbandoned
	BatchRoundTripsBySize
	CacheHits
	CacheKeys
	MemoryKeys
	MemoryEvictions
	MemorySecondTierHits
	NumPulls
)

// Spec describes a metric in both ecosystems' conventions.
type Spec struct {
	// Prom is the Prometheus name: units in the name, _total on counters.
	Prom string
	// Otel is the OpenTelemetry name: dotted, the unit apart in Unit.
	Otel string
	// Unit is the OpenTelemetry unit (UCUM, {annotation} for counts).
	Unit string
	Help string
	// Labels are the Prometheus label names; OpenTelemetry attribute keys
	// are AttrKey of each.
	Labels []string
	// Gauge: a value that goes up and down; otherwise a counter.
	Gauge bool
}

// AttrKey is the OpenTelemetry attribute key of a label: namespaced, as
// semantic conventions ask of attributes a library defines.
func AttrKey(label string) string { return "throttlekit." + label }

var (
	shadowLabels = []string{"shadow", "direction"}
	moveLabels   = []string{"migration"}
	batchLabels  = []string{"backend"}
)

// BatchSizeLabels name backend.BatchStats.BatchSizes' buckets, the size
// label of BatchRoundTripsBySize.
var BatchSizeLabels = [len(backend.BatchStats{}.BatchSizes)]string{"1", "2-3", "4-7", "8-15", "16-31", "32-63", "64-127", "128+"}

// Specs describes every pulled metric, indexed by Pull.
var Specs = [NumPulls]Spec{
	RouterCalls: {"throttlekit_router_calls_total", "throttlekit.router.calls", "{call}",
		"Calls a router (or a migration) sent to each side: its share of traffic per store.", []string{"router", "side"}, false},
	ShadowResults: {"throttlekit_shadow_results_total", "throttlekit.shadow.results", "{result}",
		"Shadow results published: compared, failed or dropped.", shadowLabels, false},
	ShadowCompared: {"throttlekit_shadow_compared_total", "throttlekit.shadow.compared", "{comparison}",
		"Pairs where both the control and the candidate answered.", shadowLabels, false},
	ShadowMismatches: {"throttlekit_shadow_mismatches_total", "throttlekit.shadow.mismatches", "{comparison}",
		"Compared pairs whose decisions differ (not ignored).", shadowLabels, false},
	ShadowIgnored: {"throttlekit_shadow_ignored_total", "throttlekit.shadow.ignored", "{comparison}",
		"Differences that the shadow's Ignore accepted.", shadowLabels, false},
	ShadowDifferences: {"throttlekit_shadow_mismatch_kinds_total", "throttlekit.shadow.mismatch_kinds", "{comparison}",
		"Mismatches carrying each kind of difference (one mismatch may carry several); kind reordered: differing pairs the order of calls explains, not mismatches.", []string{"shadow", "direction", "kind"}, false},
	ShadowCandidateErrors: {"throttlekit_shadow_candidate_errors_total", "throttlekit.shadow.candidate_errors", "{error}",
		"Mirrored calls the candidate failed, timed out or panicked on.", shadowLabels, false},
	ShadowControlErrors: {"throttlekit_shadow_control_errors_total", "throttlekit.shadow.control_errors", "{error}",
		"Calls the control failed, so there was nothing to compare.", shadowLabels, false},
	ShadowDropped: {"throttlekit_shadow_dropped_total", "throttlekit.shadow.dropped", "{call}",
		"Calls never mirrored (queue full or shadow closed): the candidate's counts lag.", shadowLabels, false},
	ShadowQueued: {"throttlekit_shadow_queued_calls", "throttlekit.shadow.queued", "{call}",
		"Calls waiting for a shadow worker.", shadowLabels, true},
	ShadowPublishDropped: {"throttlekit_shadow_publish_dropped_total", "throttlekit.shadow.publish_dropped", "{result}",
		"Results never passed to the shadow's Publish hook.", shadowLabels, false},
	MigrationMovingCalls: {"throttlekit_migration_moving_calls_total", "throttlekit.migration.moving.calls", "{call}",
		"Calls for keys a change of percentage is moving, each made on both stores.", moveLabels, false},
	MigrationCompensated: {"throttlekit_migration_compensated_total", "throttlekit.migration.compensated", "{call}",
		"Moving keys' takes one store admitted and the other denied, refunded on the admitting store.", moveLabels, false},
	MigrationRefundFailures: {"throttlekit_migration_refund_failures_total", "throttlekit.migration.refund_failures", "{call}",
		"Compensating refunds that failed.", moveLabels, false},
	MigrationOneStore: {"throttlekit_migration_one_store_total", "throttlekit.migration.one_store", "{call}",
		"Moving keys' calls answered by one store because the other failed.", moveLabels, false},
	MigrationPercentChanges: {"throttlekit_migration_percent_changes_total", "throttlekit.migration.percent_changes", "{change}",
		"Changes of the rollout's percentage this process has seen.", moveLabels, false},
	BreakersOpen: {"throttlekit_breakers_open", "throttlekit.breakers.open", "{breaker}",
		"Watched Throttlers whose breaker for the store is open: its calls get the fallback or the failure mode.", []string{"store"}, true},
	BatchRoundTrips: {"throttlekit_backend_round_trips_total", "throttlekit.backend.round_trips", "{round_trip}",
		"Requests a batching backend sent to its store: a batch, or one operation alone.", batchLabels, false},
	BatchOperations: {"throttlekit_backend_operations_total", "throttlekit.backend.operations", "{operation}",
		"Operations the round trips carried: over round trips, the mean batch size.", batchLabels, false},
	BatchBatched: {"throttlekit_backend_batched_operations_total", "throttlekit.backend.batched_operations", "{operation}",
		"Operations that waited for a batch instead of going alone.", batchLabels, false},
	BatchAbandoned: {"throttlekit_backend_abandoned_operations_total", "throttlekit.backend.abandoned_operations", "{operation}",
		"Operations whose callers left before their batch was sent: never run.", batchLabels, false},
	BatchRoundTripsBySize: {"throttlekit_backend_round_trips_by_size_total", "throttlekit.backend.round_trips_by_size", "{round_trip}",
		"Round trips by how many operations they carried (size 1, 2-3, 4-7, ..., 128+).", []string{"backend", "size"}, false},
	CacheHits: {"throttlekit_overlimit_cache_hits_total", "throttlekit.overlimit_cache.hits", "{call}",
		"Takes the over-limit cache denied without a round trip.", batchLabels, false},
	CacheKeys: {"throttlekit_overlimit_cache_keys", "throttlekit.overlimit_cache.keys", "{key}",
		"Keys the over-limit cache holds: each denied until the instant its store named.", batchLabels, true},
	MemoryKeys: {"throttlekit_memory_keys", "throttlekit.memory.keys", "{key}",
		"(key, policy) states an in-process backend holds, bounded by its MaxKeys.", batchLabels, true},
	MemoryEvictions: {"throttlekit_memory_evictions_total", "throttlekit.memory.evictions", "{key}",
		"Live states a full in-process backend moved to its second tier to make room.", batchLabels, false},
	MemorySecondTierHits: {"throttlekit_memory_second_tier_hits_total", "throttlekit.memory.second_tier_hits", "{call}",
		"Calls an in-process backend answered from a state its second tier remembered (may over-count, never under).", batchLabels, false},
}

// Sample is one value of a pulled metric.
type Sample struct {
	Pull   Pull
	Labels [3]string // the first len(Specs[Pull].Labels) are set
	Value  float64
}

// differenceKinds are the kinds counted by ShadowDifferences: the ways two
// decisions disagree (errors and drops have metrics of their own), and
// Reordered, the differing pairs that the order of calls explains (not
// mismatches, so never in ShadowMismatches: the real-difference rate).
var differenceKinds = [...]shadow.Kind{shadow.AllowedDiffers, shadow.UsedDiffers, shadow.ResetAtDiffers, shadow.RetryAfterDiffers, shadow.Reordered}

// Sources are what an adapter reads at each collection. Add* and Watch may
// be called at any time; names share one space (a router and a migration of
// one name would write the same series).
type Sources struct {
	// MaxStores bounds the store label values of BreakersOpen, as the
	// observed metrics' store table does.
	MaxStores int

	mu         sync.Mutex
	names      map[string]bool
	routers    []namedRouter
	shadows    []namedShadow
	migrations []namedMigration
	batchers   []namedBatcher
	memories   []namedMemory
	throttlers []*throttler.Throttler
}

type namedMemory struct {
	name  string
	stats func() memory.Stats
}

type namedBatcher struct {
	name  string
	stats func() backend.BatchStats
}

type namedRouter struct {
	name  string
	stats func() flags.Stats
}

type namedShadow struct {
	name, direction string
	stats           func() shadow.Stats
}

type namedMigration struct {
	name string
	m    *migration.Migration
}

// maxNameLen bounds a source's name, like a policy's.
const maxNameLen = throttler.MaxPolicyNameLen

func (s *Sources) claim(what, name string, nilArg bool) error {
	switch {
	case nilArg:
		return fmt.Errorf("%s %q: nil", what, name)
	case name == "":
		return fmt.Errorf("%s: empty name", what)
	case len(name) > maxNameLen || !utf8.ValidString(name):
		return fmt.Errorf("%s %q: a name is valid UTF-8 of at most %d bytes", what, name, maxNameLen)
	case s.names[name]:
		return fmt.Errorf("%s %q: name already added", what, name)
	}
	if s.names == nil {
		s.names = map[string]bool{}
	}
	s.names[name] = true
	return nil
}

// AddRouter reads r's Stats: RouterCalls with router name.
func (s *Sources) AddRouter(name string, r *flags.Router) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.claim("AddRouter", name, r == nil); err != nil {
		return err
	}
	s.routers = append(s.routers, namedRouter{name, r.Stats})
	return nil
}

// AddShadow reads b's Stats: the Shadow metrics with shadow name and an
// empty direction.
func (s *Sources) AddShadow(name string, b *shadow.Backend) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.claim("AddShadow", name, b == nil); err != nil {
		return err
	}
	s.shadows = append(s.shadows, namedShadow{name: name, stats: b.Stats})
	return nil
}

// AddMigration reads m's Stats: its routing as RouterCalls (router name),
// its shadows (shadow name, direction forward and reverse) and its moving
// keys (migration name).
func (s *Sources) AddMigration(name string, m *migration.Migration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.claim("AddMigration", name, m == nil); err != nil {
		return err
	}
	s.migrations = append(s.migrations, namedMigration{name, m})
	return nil
}

// AddBatching reads stats (a batching backend's, such as backend/redis's
// Backend.Stats): the Batch and Cache metrics with backend name.
func (s *Sources) AddBatching(name string, stats func() backend.BatchStats) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.claim("AddBatching", name, stats == nil); err != nil {
		return err
	}
	s.batchers = append(s.batchers, namedBatcher{name, stats})
	return nil
}

// AddMemory reads stats (backend/memory's Backend.Stats): the Memory
// metrics with backend name.
func (s *Sources) AddMemory(name string, stats func() memory.Stats) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.claim("AddMemory", name, stats == nil); err != nil {
		return err
	}
	s.memories = append(s.memories, namedMemory{name, stats})
	return nil
}

// WatchThrottler reads t's breakers: BreakersOpen counts, per store, the
// watched Throttlers whose breaker is open.
func (s *Sources) WatchThrottler(t *throttler.Throttler) error {
	if t == nil {
		return errors.New("WatchThrottler: nil Throttler")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.throttlers {
		if w == t {
			return errors.New("WatchThrottler: Throttler already watched")
		}
	}
	s.throttlers = append(s.throttlers, t)
	return nil
}

// Collect reads every source and yields its samples.
func (s *Sources) Collect(yield func(Sample)) {
	s.mu.Lock()
	routers, shadows, migrations, batchers, memories, throttlers := s.routers, s.shadows, s.migrations, s.batchers, s.memories, s.throttlers
	s.mu.Unlock()
	for _, r := range routers {
		routed(yield, r.name, r.stats())
	}
	for _, sh := range shadows {
		compared(yield, sh.name, sh.direction, sh.stats())
	}
	for _, m := range migrations {
		st := m.m.Stats()
		routed(yield, m.name, st.Routed)
		compared(yield, m.name, "forward", st.Forward)
		compared(yield, m.name, "reverse", st.Reverse)
		for p, v := range map[Pull]uint64{
			MigrationMovingCalls:    st.Moving.Calls,
			MigrationCompensated:    st.Moving.Compensated,
			MigrationRefundFailures: st.Moving.RefundFailed,
			MigrationOneStore:       st.Moving.OneStore,
			MigrationPercentChanges: st.Moving.Changes,
		} {
			yield(Sample{Pull: p, Labels: [3]string{m.name}, Value: float64(v)})
		}
	}
	for _, b := range batchers {
		batched(yield, b.name, b.stats())
	}
	for _, m := range memories {
		st, l := m.stats(), [3]string{m.name}
		yield(Sample{Pull: MemoryKeys, Labels: l, Value: float64(st.Keys)})
		yield(Sample{Pull: MemoryEvictions, Labels: l, Value: float64(st.Evictions)})
		yield(Sample{Pull: MemorySecondTierHits, Labels: l, Value: float64(st.SecondTierHits)})
	}
	if len(throttlers) > 0 {
		s.breakers(yield, throttlers)
	}
}

func batched(yield func(Sample), name string, st backend.BatchStats) {
	l := [3]string{name}
	for p, v := range map[Pull]uint64{
		BatchRoundTrips: st.RoundTrips,
		BatchOperations: st.Ops,
		BatchBatched:    st.Batched,
		BatchAbandoned:  st.Abandoned,
		CacheHits:       st.CacheHits,
	} {
		yield(Sample{Pull: p, Labels: l, Value: float64(v)})
	}
	yield(Sample{Pull: CacheKeys, Labels: l, Value: float64(st.CacheKeys)})
	for i, n := range st.BatchSizes {
		yield(Sample{Pull: BatchRoundTripsBySize, Labels: [3]string{name, BatchSizeLabels[i]}, Value: float64(n)})
	}
}

func routed(yield func(Sample), name string, st flags.Stats) {
	yield(Sample{Pull: RouterCalls, Labels: [3]string{name, "old"}, Value: float64(st.Old)})
	yield(Sample{Pull: RouterCalls, Labels: [3]string{name, "new"}, Value: float64(st.New)})
}

func compared(yield func(Sample), name, direction string, st shadow.Stats) {
	l := [3]string{name, direction}
	for p, v := range map[Pull]uint64{
		ShadowResults:         st.Results,
		ShadowCompared:        st.Compared,
		ShadowMismatches:      st.Mismatched,
		ShadowIgnored:         st.Ignored,
		ShadowCandidateErrors: st.ByKind[shadow.CandidateError],
		ShadowControlErrors:   st.ByKind[shadow.ControlError],
		ShadowDropped:         st.ByKind[shadow.Dropped],
		ShadowPublishDropped:  st.PublishDropped,
	} {
		yield(Sample{Pull: p, Labels: l, Value: float64(v)})
	}
	yield(Sample{Pull: ShadowQueued, Labels: l, Value: float64(st.Queued)})
	for _, k := range differenceKinds {
		yield(Sample{Pull: ShadowDifferences, Labels: [3]string{name, direction, k.String()}, Value: float64(st.ByKind[k])})
	}
}

func (s *Sources) breakers(yield func(Sample), throttlers []*throttler.Throttler) {
	open := map[string]int{}
	for _, t := range throttlers {
		for _, b := range t.Breakers() {
			label := StoreLabel(b.Store)
			if _, seen := open[label]; !seen && len(open) >= max(1, s.MaxStores) {
				label = Other
			}
			if b.Open {
				open[label]++
			} else {
				open[label] += 0
			}
		}
	}
	for store, n := range open {
		yield(Sample{Pull: BreakersOpen, Labels: [3]string{store}, Value: float64(n)})
	}
}
