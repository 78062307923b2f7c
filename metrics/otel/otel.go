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
//	err = m.Watch("api", t)            // its breakers
//	err = m.Watch("sessions", mig)     // share, shadows, moving keys
//	err = m.Watch("redis", redisStore) // batches, over-limit cache
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
//	throttlekit.would_deny        counter   {decision}  throttlekit.policy
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
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/throttlekit/throttlekit/metrics/internal/metricdef"
	"github.com/throttlekit/throttlekit/throttler"
)

// ScopeName is the instrumentation scope of the meter.
const ScopeName = "github.com/throttlekit/throttlekit/metrics/otel"

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
	// them). default: those of metrics/prometheus: 0.00005, 0.0001,
	// 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
	// 0.5, 1
	Buckets []float64
}

// Metrics records the instruments above. It is safe for concurrent use.
// Create it with New.
type Metrics struct {
	decisions metric.Int64Counter
	wouldDeny metric.Int64Counter
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
	// wouldDeny is the policy's attribute alone.
	wouldDeny []metric.AddOption
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
	m.wouldDeny, err = meter.Int64Counter("throttlekit.would_deny", metric.WithUnit("{decision}"),
		metric.WithDescription("Takes a policy would have denied for keys it runs in dry run, answered allowed, by policy."))
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
		return &policyOptions{label: l, wouldDeny: []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(
			attribute.String(metricdef.AttrKey("policy"), l)))}}
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
	if metricdef.WouldDeny(&o) {
		if !o.Policy.Composite() {
			m.wouldDeny.Add(ctx, 1, po.wouldDeny...)
		}
		for name := range metricdef.WouldDenyMembers(&o) {
			m.wouldDeny.Add(ctx, 1, m.policies.Get(name, metricdef.PolicyLabel).wouldDeny...)
		}
	}
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

// Watch reads source at each collection, under name (unique among the
// sources of m). source is one of:
//
//   - a *throttler.Throttler: its breakers in throttlekit.breakers.open,
//     whose attribute is the store (name only tells Throttlers apart);
//   - a *flags.Router: throttlekit.router.calls with throttlekit.router=name;
//   - a *shadow.Backend: the throttlekit.shadow.* instruments with
//     throttlekit.shadow=name and throttlekit.direction="";
//   - a *migration.Migration: its routing (throttlekit.router.calls,
//     throttlekit.router=name), its shadows (throttlekit.shadow=name,
//     direction forward and reverse) and its moving keys
//     (throttlekit.migration=name);
//   - a batching backend (backend/redis's Backend): the throttlekit.backend.
//     round trip and operation instruments, its primary switches and the
//     throttlekit.overlimit_cache. ones with throttlekit.backend=name;
//   - a backend/memory Backend: the throttlekit.memory. keys, evictions,
//     second-tier hits and usage (bytes) instruments with
//     throttlekit.backend=name.
//
// Each but the Throttler may also be given as its Stats method
// (redisBackend.Stats). Any other source, a nil one, a name that is empty,
// longer than 128 bytes, not UTF-8 or already watched, and a Throttler
// watched twice are errors.
func (m *Metrics) Watch(name string, source any) error {
	return wrap(m.sources.Watch(name, source))
}

func wrap(err error) error {
	if err != nil {
		return fmt.Errorf("otel: %w", err)
	}
	return nil
}
