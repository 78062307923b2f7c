package metricdef

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"unicode/utf8"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/internal/nilness"
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
	MigrationLate
	BreakersOpen
	BatchRoundTrips
	BatchOperations
	BatchBatched
	BatchAbandoned
	BatchRoundTripsBySize
	CacheHits
	CacheKeys
	BackendPrimarySwitches
	MemoryKeys
	MemoryEvictions
	MemorySecondTierHits
	MemoryBytes
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
		"Mismatches carrying each kind of difference (one mismatch may carry several); kinds reordered and late: differing pairs the order of calls (or a late answer) explains, not mismatches.", []string{"shadow", "direction", "kind"}, false},
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
	MigrationLate: {"throttlekit_migration_late_calls_total", "throttlekit.migration.late_calls", "{call}",
		"Calls one store served alone that were answered more than LateAfter after this process saw a change that moved their key.", moveLabels, false},
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
	BackendPrimarySwitches: {"throttlekit_backend_primary_switches_total", "throttlekit.backend.primary_switches", "{switch}",
		"Primary switches a backend saw: its primary client reached another server, or its server turned replica (READONLY).", batchLabels, false},
	MemoryKeys: {"throttlekit_memory_keys", "throttlekit.memory.keys", "{key}",
		"(key, policy) states an in-process backend holds, bounded by its MaxKeys.", batchLabels, true},
	MemoryEvictions: {"throttlekit_memory_evictions_total", "throttlekit.memory.evictions", "{key}",
		"Live states a full in-process backend moved to its second tier to make room.", batchLabels, false},
	MemorySecondTierHits: {"throttlekit_memory_second_tier_hits_total", "throttlekit.memory.second_tier_hits", "{call}",
		"Calls an in-process backend answered from a state its second tier remembered (may over-count, never under).", batchLabels, false},
	MemoryBytes: {"throttlekit_memory_bytes", "throttlekit.memory.usage", "By",
		"Heap an in-process backend's tables hold, keys included: slots, second tier, logs and lease sets.", batchLabels, true},
}

// Sample is one value of a pulled metric.
type Sample struct {
	Pull   Pull
	Labels [3]string // the first len(Specs[Pull].Labels) are set
	Value  float64
}

// differenceKinds are the kinds counted by ShadowDifferences: the ways two
// decisions disagree (errors and drops have metrics of their own), and
// Reordered and Late, the differing pairs that the order of calls (and a
// late answer) explains (not mismatches, so never in ShadowMismatches: the
// real-difference rate).
var differenceKinds = [...]shadow.Kind{shadow.AllowedDiffers, shadow.UsedDiffers, shadow.ResetAtDiffers, shadow.RetryAfterDiffers, shadow.Reordered, shadow.Late}

// Sources are what an adapter reads at each collection. Watch may be called
// at any time; names share one space (a router and a migration of one name
// would write the same series).
type Sources struct {
	// MaxStores bounds the store label values of BreakersOpen, as the
	// observed metrics' store table does.
	MaxStores int

	mu         sync.Mutex
	names      map[string]bool
	routers    []named[flags.Stats]
	shadows    []named[shadow.Stats]
	migrations []named[migration.Stats]
	batchers   []named[backend.BatchStats]
	memories   []named[memory.Stats]
	throttlers []*throttler.Throttler
}

// named is a source's Stats and the name its series carry.
type named[S any] struct {
	name  string
	stats func() S
}

// accepted lists the sources Watch takes, for its error.
const accepted = "a *throttler.Throttler, or a *flags.Router, *shadow.Backend, " +
	"*migration.Migration, batching backend (backend/redis) or backend/memory Backend, " +
	"or its Stats method"

// The sources Watch finds by their Stats method: a change of its type is a
// compile error here rather than "not a source" at run time.
var (
	_ interface{ Stats() flags.Stats }     = (*flags.Router)(nil)
	_ interface{ Stats() shadow.Stats }    = (*shadow.Backend)(nil)
	_ interface{ Stats() migration.Stats } = (*migration.Migration)(nil)
	_ interface{ Stats() memory.Stats }    = (*memory.Backend)(nil)
)

// maxNameLen bounds a source's name, like a policy's.
const maxNameLen = 128

// Watch reads src at each collection under name:
//
//   - a *throttler.Throttler: its breakers in BreakersOpen, labelled by
//     store (the name only identifies it);
//   - a flags.Router's Stats: RouterCalls with router name;
//   - a shadow.Backend's Stats: the Shadow metrics with shadow name and an
//     empty direction;
//   - a migration.Migration's Stats: its routing as RouterCalls (router
//     name), its shadows (shadow name, direction forward and reverse) and
//     its moving keys (migration name);
//   - a backend.BatchStats (backend/redis's Backend): the Batch and Cache
//     metrics with backend name;
//   - a memory.Stats (backend/memory's Backend): the Memory metrics with
//     backend name.
//
// Each Stats source may be given as the value whose Stats method returns
// it or as that method. Anything else, a nil source, an empty, invalid or
// taken name and a Throttler already watched are errors.
func (s *Sources) Watch(name string, src any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.check(name, src); err != nil {
		return fmt.Errorf("Watch %q: %w", name, err)
	}
	if t, ok := src.(*throttler.Throttler); ok {
		s.throttlers = append(s.throttlers, t)
	} else if !add(&s.routers, name, src) && !add(&s.shadows, name, src) &&
		!add(&s.migrations, name, src) && !add(&s.batchers, name, src) && !add(&s.memories, name, src) {
		return fmt.Errorf("Watch %q: a %T is not a source: want %s", name, src, accepted)
	}
	if s.names == nil {
		s.names = map[string]bool{}
	}
	s.names[name] = true
	return nil
}

func (s *Sources) check(name string, src any) error {
	switch {
	case nilness.IsNil(src):
		return nilness.Check("the source", src)
	case name == "":
		return errors.New("empty name")
	case len(name) > maxNameLen || !utf8.ValidString(name):
		return fmt.Errorf("a name is valid UTF-8 of at most %d bytes", maxNameLen)
	case s.names[name]:
		return errors.New("name already watched")
	}
	if t, ok := src.(*throttler.Throttler); ok && slices.Contains(s.throttlers, t) {
		// Its open breakers would count twice.
		return errors.New("the Throttler is watched under another name")
	}
	return nil
}

// add appends src to list if it is a source of S's, or its Stats method.
func add[S any](list *[]named[S], name string, src any) bool {
	var stats func() S
	switch v := src.(type) {
	case func() S:
		stats = v
	case interface{ Stats() S }:
		stats = v.Stats
	default:
		return false
	}
	*list = append(*list, named[S]{name, stats})
	return true
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
		compared(yield, sh.name, "", sh.stats())
	}
	for _, m := range migrations {
		st := m.stats()
		routed(yield, m.name, st.Routed)
		compared(yield, m.name, "forward", st.Forward)
		compared(yield, m.name, "reverse", st.Reverse)
		for p, v := range map[Pull]uint64{
			MigrationMovingCalls:    st.Moving.Calls,
			MigrationCompensated:    st.Moving.Compensated,
			MigrationRefundFailures: st.Moving.RefundFailed,
			MigrationOneStore:       st.Moving.OneStore,
			MigrationPercentChanges: st.Moving.Changes,
			MigrationLate:           st.Moving.Late,
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
		yield(Sample{Pull: MemoryBytes, Labels: l, Value: float64(st.Bytes)})
	}
	if len(throttlers) > 0 {
		s.breakers(yield, throttlers)
	}
}

func batched(yield func(Sample), name string, st backend.BatchStats) {
	l := [3]string{name}
	for p, v := range map[Pull]uint64{
		BatchRoundTrips:        st.RoundTrips,
		BatchOperations:        st.Ops,
		BatchBatched:           st.Batched,
		BatchAbandoned:         st.Abandoned,
		CacheHits:              st.CacheHits,
		BackendPrimarySwitches: st.PrimarySwitches,
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
