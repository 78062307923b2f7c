// Package otel records a Throttler's decisions, its stores' latency,
// errors and breakers, and the routing and comparisons of flags routers,
// shadows and migrations as OpenTelemetry metrics:
//
//	m, err := otel.New(meterProvider, nil)
//	if err != nil {
//		return err
//	}
//	defer m.Unregister()
//	t, err := throttler.New(b, &throttler.Options{Observe: m.Observe})
//	...
//	err = m.WatchThrottler(t)             // its breakers
//	err = m.AddMigration("sessions", mig) // share, shadows, moving keys
//
// Observe records the call instruments on every call; the rest are
// observable instruments whose callback reads each source's Stats when the
// reader collects, so the core needs no other hook.
//
// # Instruments
//
// Names follow the semantic conventions' style: dotted, lower case, the unit
// in the instrument's unit rather than its name, counts as {annotations};
// attributes a library defines are namespaced (throttlekit.*), and the
// error classification is the conventions' error.type.
//
//	throttlekit.decisions         counter   {decision}  throttlekit.policy, .op, .source, .result
//	throttlekit.backend.duration  histogram s           throttlekit.store
//	throttlekit.backend.errors    counter   {error}     throttlekit.store, error.type (timeout, error)
//	throttlekit.breakers.open     gauge     {breaker}   throttlekit.store
//	throttlekit.router.calls      counter   {call}      throttlekit.router, .side
//	throttlekit.shadow.*          counters            throttlekit.shadow, .direction (.kind)
//	throttlekit.shadow.queued     gauge     {call}
//	throttlekit.migration.*       counters            throttlekit.migration
//
// The values of each attribute, and the cardinality and its bounds, are
// those of package prometheus (metrics/prometheus), whose names these
// mirror.
package otel

import (
	"context"
	"errors"
	"fmt"
	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/backend/memory"
	"slices"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/metrics/internal/metricdef"
	"github.com/throttlekit/throttlekit/migration"
	"github.com/throttlekit/throttlekit/shadow"
	"github.com/throttlekit/throttlekit/throttler"
)

// ScopeName is the instrumentation scope of the meter.
const ScopeName = "github.com/throttlekit/throttlekit/metrics/otel"

// DefaultBuckets are the latency histogram's bucket boundaries, in seconds:
// the same as metrics/prometheus's.
var DefaultBuckets = slices.Clone(metricdef.DefaultBuckets)

// Options configure Metrics. Nil options mean defaults.
type Options struct {
	// MaxPolicies bounds the distinct throttlekit.policy values; later
	// policies count as "other". default: 100
	MaxPolicies int
	// MaxStores bounds the distinct throttlekit.store values; later stores
	// count as "other". default: 64
	MaxStores int
	// Buckets are the latency histogram's boundaries in seconds,
	// increasing by at least a nanosecond (advice: a View may replace
	// them). default: DefaultBuckets
	Buckets []float64
}

// Metrics records the instruments above. It is safe for concurrent use.
// Create it with New.
type Metrics struct {
	decisions metric.Int64Counter
	latency   metric.Float64Histogram
	errors    metric.Int64Counter

	policies     metricdef.Table[policyOptions]
	stores       metricdef.Table[storeOptions]
	defaultStore *storeOptions

	sources metricdef.Sources
	pulls   [metricdef.NumPulls]metric.Observable
	reg     metric.Registration
}

// policyOptions are one policy's attribute sets, by op, source and result,
// built the first time each is seen, so that Observe never builds
// attributes.
type policyOptions struct {
	label string
	opts  [metricdef.NumOps][metricdef.NumSources][metricdef.NumResults]atomic.Pointer[[]metric.AddOption]
}

type storeOptions struct {
	record []metric.RecordOption
	errors [metricdef.NumReasons][]metric.AddOption
}

// New returns Metrics over mp's meter for ScopeName. Options that cannot
// work, and instruments mp refuses, are errors.
func New(mp metric.MeterProvider, opts *Options) (*Metrics, error) {
	if mp == nil {
		return nil, errors.New("otel: New needs a MeterProvider, got nil")
	}
	var o metricdef.Options
	if opts != nil {
		o = metricdef.Options(*opts)
	}
	o, err := o.WithDefaults()
	if err != nil {
		return nil, fmt.Errorf("otel: %w", err)
	}
	meter := mp.Meter(ScopeName)
	m := &Metrics{}
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	m.decisions, err = meter.Int64Counter("throttlekit.decisions", metric.WithUnit("{decision}"),
		metric.WithDescription("Throttler calls by policy, operation, who decided (primary, fallback, failure_mode, none) and result."))
	add(err)
	m.latency, err = meter.Float64Histogram("throttlekit.backend.duration", metric.WithUnit("s"),
		metric.WithDescription("Wall time of Throttler calls that reached a store (fallback included), by store."),
		metric.WithExplicitBucketBoundaries(o.Buckets...))
	add(err)
	m.errors, err = meter.Int64Counter("throttlekit.backend.errors", metric.WithUnit("{error}"),
		metric.WithDescription("Primary store failures by store and error.type (timeout, error), answered by the fallback or the failure mode."))
	add(err)
	for i, s := range metricdef.Specs {
		if s.Gauge {
			m.pulls[i], err = meter.Int64ObservableGauge(s.Otel, metric.WithUnit(s.Unit), metric.WithDescription(s.Help))
		} else {
			m.pulls[i], err = meter.Int64ObservableCounter(s.Otel, metric.WithUnit(s.Unit), metric.WithDescription(s.Help))
		}
		add(err)
	}
	if len(errs) == 0 {
		m.reg, err = meter.RegisterCallback(m.observe, m.pulls[:]...)
		add(err)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("otel: %w", errors.Join(errs...))
	}
	m.policies = metricdef.Table[policyOptions]{Max: o.MaxPolicies, New: func(l string) *policyOptions {
		return &policyOptions{label: l}
	}}
	m.stores = metricdef.Table[storeOptions]{Max: o.MaxStores, New: newStore}
	m.defaultStore = m.stores.Get("", metricdef.StoreLabel)
	m.sources.MaxStores = o.MaxStores
	return m, nil
}

var storeKey = attribute.Key(metricdef.AttrKey("store"))

func newStore(label string) *storeOptions {
	s := &storeOptions{record: []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(storeKey.String(label)))}}
	for i, r := range metricdef.ReasonNames {
		s.errors[i] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(storeKey.String(label), attribute.String("error.type", r)))}
	}
	return s
}

// Observe records one Throttler call: pass it as throttler.Options.Observe
// (or call it from your own Observe). It builds no attributes once the
// call's policy and store have been seen.
func (m *Metrics) Observe(o throttler.Observation) {
	ctx := context.Background()
	po := m.policies.Get(metricdef.PolicyName(&o), metricdef.PolicyLabel)
	op, src, res := metricdef.OpIndex(o.Op), metricdef.SourceIndex(o.Source), metricdef.ResultIndex(&o)
	slot := &po.opts[op][src][res]
	opts := slot.Load()
	if opts == nil {
		opts = &[]metric.AddOption{metric.WithAttributeSet(attribute.NewSet(
			attribute.String(metricdef.AttrKey("policy"), po.label),
			attribute.String(metricdef.AttrKey("op"), metricdef.OpNames[op]),
			attribute.String(metricdef.AttrKey("source"), metricdef.SourceNames[src]),
			attribute.String(metricdef.AttrKey("result"), metricdef.ResultNames[res]),
		))}
		slot.Store(opts) // a racing Observe stores an equal set
	}
	m.decisions.Add(ctx, 1, *opts...)
	if o.Source == throttler.SourceNone {
		return // no store decided: bad input or the caller gave up
	}
	st := m.defaultStore
	if o.Store != "" {
		st = m.stores.Get(o.Store, metricdef.StoreLabel)
	}
	m.latency.Record(ctx, o.Latency.Seconds(), st.record...)
	if o.Err != nil {
		m.errors.Add(ctx, 1, st.errors[metricdef.ReasonIndex(o.Err)]...)
	}
}

// observe is the observable instruments' callback: every source's Stats,
// read now.
func (m *Metrics) observe(_ context.Context, obs metric.Observer) error {
	m.sources.Collect(func(s metricdef.Sample) {
		spec := metricdef.Specs[s.Pull]
		kv := make([]attribute.KeyValue, len(spec.Labels))
		for i, l := range spec.Labels {
			kv[i] = attribute.String(metricdef.AttrKey(l), s.Labels[i])
		}
		opt := metric.WithAttributeSet(attribute.NewSet(kv...))
		switch in := m.pulls[s.Pull].(type) {
		case metric.Int64ObservableCounter:
			obs.ObserveInt64(in, int64(s.Value), opt)
		case metric.Int64ObservableGauge:
			obs.ObserveInt64(in, int64(s.Value), opt)
		}
	})
	return nil
}

// Unregister stops the observable instruments' callback: the sources are
// no longer read. The call instruments keep recording.
func (m *Metrics) Unregister() error {
	if err := m.reg.Unregister(); err != nil {
		return fmt.Errorf("otel: %w", err)
	}
	return nil
}

// WatchThrottler adds t's breakers to throttlekit.breakers.open.
func (m *Metrics) WatchThrottler(t *throttler.Throttler) error {
	return wrap(m.sources.WatchThrottler(t))
}

// AddRouter reads r's Stats at each collection: throttlekit.router.calls
// with throttlekit.router=name.
func (m *Metrics) AddRouter(name string, r *flags.Router) error {
	return wrap(m.sources.AddRouter(name, r))
}

// AddShadow reads b's Stats at each collection: the throttlekit.shadow.*
// instruments with throttlekit.shadow=name and throttlekit.direction="".
func (m *Metrics) AddShadow(name string, b *shadow.Backend) error {
	return wrap(m.sources.AddShadow(name, b))
}

// AddMigration reads mg's Stats at each collection: its routing
// (throttlekit.router.calls, throttlekit.router=name), its shadows
// (throttlekit.shadow=name, direction forward and reverse) and its moving
// keys (throttlekit.migration=name).
func (m *Metrics) AddMigration(name string, mg *migration.Migration) error {
	return wrap(m.sources.AddMigration(name, mg))
}

// AddBatching reads stats at each collection, a batching backend's
// counts (backend/redis: pass the Backend's Stats method): the
// throttlekit.backend. round trip and operation instruments and the
// throttlekit.overlimit_cache. ones with throttlekit.backend=name.
func (m *Metrics) AddBatching(name string, stats func() backend.BatchStats) error {
	return wrap(m.sources.AddBatching(name, stats))
}

// AddMemory reads stats at each collection, an in-process backend's counts
// (backend/memory: pass the Backend's Stats method): the throttlekit.memory. keys,
// evictions and second-tier hits metrics with throttlekit.backend=name.
func (m *Metrics) AddMemory(name string, stats func() memory.Stats) error {
	return wrap(m.sources.AddMemory(name, stats))
}

func wrap(err error) error {
	if err != nil {
		return fmt.Errorf("otel: %w", err)
	}
	return nil
}
