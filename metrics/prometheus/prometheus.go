// Package prometheus exports a Throttler's decisions, its stores' latency,
// errors and breakers, and the routing and comparisons of flags routers,
// shadows and migrations as Prometheus metrics:
//
//	m, err := prometheus.New(nil)
//	if err != nil {
//		return err
//	}
//	registry.MustRegister(m)
//	t, err := throttler.New(b, &throttler.Options{Observe: m.Observe})
//	...
//	err = m.Watch("api", t)            // its breakers
//	err = m.Watch("sessions", mig)     // share, shadows, moving keys
//	err = m.Watch("redis", redisStore) // batches, over-limit cache
//
// Observe feeds the call metrics on every call; the rest is read from each
// source's Stats when the registry is scraped, so the core needs no other
// hook and pays nothing for them between scrapes.
//
// # Metrics
//
//	throttlekit_decisions_total{policy,op,source,result}       counter
//	throttlekit_would_deny_total{policy}                       counter
//	throttlekit_backend_call_duration_seconds{store}           histogram
//	throttlekit_backend_errors_total{store,reason}             counter
//	throttlekit_breakers_open{store}                           gauge
//	throttlekit_router_calls_total{router,side}                counter
//	throttlekit_shadow_*_total{shadow,direction}               counters
//	throttlekit_shadow_mismatch_kinds_total{shadow,direction,kind}
//	throttlekit_shadow_queued_calls{shadow,direction}          gauge
//	throttlekit_migration_*_total{migration}                   counters
//
// op is take, peek, refund, acquire or release; source primary, fallback,
// failure_mode (fail open or closed) or none (bad input, a caller's
// cancelled context: result error); result allowed, denied or error; reason
// timeout (the Throttler's Timeout expired) or error (any other failure, an
// open breaker's skipped calls included). A decision is degraded exactly
// when its source is fallback or failure_mode. throttlekit_would_deny_total
// counts the Takes a policy would have denied for keys it runs in dry run
// (throttler.Policy.EnforcedBy), which throttlekit_decisions_total counts as
// allowed. The latency and error
// metrics leave out source none. docs/operations.md has the whole list, the
// alerts and the dashboard built on them.
//
// # Cardinality
//
// No client key ever becomes a label. policy is the policy's Name ("unnamed"
// for an unnamed policy), store the store's name as the backend gives it
// ("default" for a backend that is one store), router, shadow, migration and
// backend the names given to Watch: all fixed by configuration. The adapter
// bounds policies and stores all the same (Options.MaxPolicies, MaxStores);
// names beyond the bound count under "other". With P policies and S stores
// the call metrics are at most P×5×4×3 decision series and P would-deny
// series (only those seen are created), S histograms of len(Buckets)+3 series and S×2 error series.
package prometheus

import (
	"fmt"
	"sync/atomic"
	"time"

	prom "github.com/prometheus/client_golang/prometheus"

	"github.com/throttlekit/throttlekit/metrics/internal/metricdef"
	"github.com/throttlekit/throttlekit/throttler"
)

// Options configure Metrics. Nil options mean defaults.
type Options struct {
	// MaxPolicies bounds the distinct policy label values; later policies
	// count as "other". default: 100
	MaxPolicies int
	// MaxStores bounds the distinct store label values; later stores count
	// as "other". default: 64
	MaxStores int
	// Buckets are the latency histogram's upper bounds in seconds,
	// increasing by at least a nanosecond. default: from an in-process
	// store's microseconds through a network store's milliseconds to the
	// Throttler's default 100ms timeout and beyond: 0.00005, 0.0001,
	// 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
	// 0.5, 1
	Buckets []float64
}

// Metrics is a Prometheus Collector of everything above. It is safe for
// concurrent use. Create it with New.
//
// The call metrics are plain atomic counters that Collect turns into
// Prometheus metrics at each scrape: a call costs a map lookup and three
// atomic adds, where client_golang's vectors and histograms cost several
// more atomics and a float compare-and-swap loop per observation.
type Metrics struct {
	bounds []time.Duration // the buckets' upper bounds
	// buckets is bounds in seconds, for Collect.
	buckets []float64

	policies metricdef.Table[policyCounters]
	stores   metricdef.Table[storeCounters]
	// defaultStore is the store of a backend that is one store: no lookup.
	defaultStore *storeCounters

	sources                               metricdef.Sources
	decisions, wouldDeny, latency, errors *prom.Desc
	pulls                                 [metricdef.NumPulls]*prom.Desc
}

// policyCounters are one policy's decisions by op, source and result.
type policyCounters struct {
	label string
	n     [metricdef.NumOps][metricdef.NumSources][metricdef.NumResults]atomic.Uint64
	// wouldDeny counts the Takes it would have denied in dry run.
	wouldDeny atomic.Uint64
}

// storeCounters are one store's latency histogram and errors.
type storeCounters struct {
	label string
	// counts[i] counts the calls in bucket i (not cumulative); the last
	// is above every bound.
	counts []atomic.Uint64
	sumNs  atomic.Int64
	errors [metricdef.NumReasons]atomic.Uint64
}

var _ prom.Collector = (*Metrics)(nil)

// New returns Metrics; register them with a Prometheus Registerer and pass
// Observe to throttler.Options. Options that cannot work are an error.
func New(opts *Options) (*Metrics, error) {
	var o metricdef.Options
	if opts != nil {
		o = metricdef.Options(*opts)
	}
	o, err := o.WithDefaults()
	if err != nil {
		return nil, fmt.Errorf("prometheus: %w", err)
	}
	m := &Metrics{buckets: o.Buckets}
	for _, b := range o.Buckets {
		m.bounds = append(m.bounds, time.Duration(b*float64(time.Second)))
	}
	m.decisions = prom.NewDesc("throttlekit_decisions_total",
		"Throttler calls by policy, operation, who decided (primary, fallback, failure_mode, none) and result.",
		[]string{"policy", "op", "source", "result"}, nil)
	m.wouldDeny = prom.NewDesc("throttlekit_would_deny_total",
		"Takes a policy would have denied for keys it runs in dry run, answered allowed, by policy.",
		[]string{"policy"}, nil)
	m.latency = prom.NewDesc("throttlekit_backend_call_duration_seconds",
		"Wall time of Throttler calls that reached a store (fallback included), by store.",
		[]string{"store"}, nil)
	m.errors = prom.NewDesc("throttlekit_backend_errors_total",
		"Primary store failures by store and reason (timeout, error), answered by the fallback or the failure mode.",
		[]string{"store", "reason"}, nil)
	m.policies = metricdef.Table[policyCounters]{Max: o.MaxPolicies, New: func(l string) *policyCounters {
		return &policyCounters{label: l}
	}}
	m.stores = metricdef.Table[storeCounters]{Max: o.MaxStores, New: m.newStore}
	m.defaultStore = m.stores.Get("", metricdef.StoreLabel)
	m.sources.MaxStores = o.MaxStores
	for i, s := range metricdef.Specs {
		m.pulls[i] = prom.NewDesc(s.Prom, s.Help, s.Labels, nil)
	}
	return m, nil
}

func (m *Metrics) newStore(label string) *storeCounters {
	return &storeCounters{label: label, counts: make([]atomic.Uint64, len(m.bounds)+1)}
}

// Observe counts one Throttler call: pass it as throttler.Options.Observe
// (or call it from your own Observe). It takes no lock and does not
// allocate once the call's policy and store have been seen.
func (m *Metrics) Observe(o throttler.Observation) {
	pc := m.policies.Get(metricdef.PolicyName(&o), metricdef.PolicyLabel)
	pc.n[metricdef.OpIndex(o.Op)][metricdef.SourceIndex(o.Source)][metricdef.ResultIndex(&o)].Add(1)
	if metricdef.WouldDeny(&o) {
		if !o.Policy.Composite() {
			pc.wouldDeny.Add(1)
		}
		for name := range metricdef.WouldDenyMembers(&o) {
			m.policies.Get(name, metricdef.PolicyLabel).wouldDeny.Add(1)
		}
	}
	if o.Source == throttler.SourceNone {
		return // no store decided: bad input or the caller gave up
	}
	st := m.defaultStore
	if o.Store != "" {
		st = m.stores.Get(o.Store, metricdef.StoreLabel)
	}
	// The first bucket whose bound holds the latency: a linear scan, as
	// short calls (the common case) end it at once.
	i := 0
	for i < len(m.bounds) && o.Latency > m.bounds[i] {
		i++
	}
	st.counts[i].Add(1)
	st.sumNs.Add(int64(o.Latency))
	if o.Err != nil {
		st.errors[metricdef.ReasonIndex(o.Err)].Add(1)
	}
}

// Watch reads source at each scrape, under name (unique among the sources
// of m). source is one of:
//
//   - a *throttler.Throttler: its breakers in throttlekit_breakers_open,
//     whose label is the store (name only tells Throttlers apart);
//   - a *flags.Router: throttlekit_router_calls_total with router=name;
//   - a *shadow.Backend: the throttlekit_shadow_ metrics with shadow=name
//     and direction="";
//   - a *migration.Migration: its routing (throttlekit_router_calls_total,
//     router=name), its shadows (shadow=name, direction forward: old serves
//     and new is compared; reverse: the other way) and its moving keys
//     (throttlekit_migration_ metrics, migration=name);
//   - a batching backend (backend/redis's Backend): the throttlekit_backend_
//     round trip and operation metrics, its primary switches and the
//     throttlekit_overlimit_cache_ metrics with backend=name;
//   - a backend/memory Backend: the throttlekit_memory_ keys, evictions,
//     second-tier hits and bytes metrics with backend=name.
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
		return fmt.Errorf("prometheus: %w", err)
	}
	return nil
}

// Describe implements the Prometheus Collector.
func (m *Metrics) Describe(ch chan<- *prom.Desc) {
	ch <- m.decisions
	ch <- m.wouldDeny
	ch <- m.latency
	ch <- m.errors
	for _, d := range m.pulls {
		ch <- d
	}
}

// Collect implements the Prometheus Collector: the call counters as they are
// now (a decision series once it has counted a call; a store's histogram
// and errors once it has been seen), then every source's Stats read now.
func (m *Metrics) Collect(ch chan<- prom.Metric) {
	send := func(d *prom.Desc, vt prom.ValueType, v float64, labels ...string) {
		c, err := prom.NewConstMetric(d, vt, v, labels...)
		if err != nil {
			c = prom.NewInvalidMetric(d, err) // the scrape reports it
		}
		ch <- c
	}
	m.policies.Each(func(pc *policyCounters) {
		for op := range pc.n {
			for src := range pc.n[op] {
				for res := range pc.n[op][src] {
					if n := pc.n[op][src][res].Load(); n > 0 {
						send(m.decisions, prom.CounterValue, float64(n), pc.label,
							metricdef.OpNames[op], metricdef.SourceNames[src], metricdef.ResultNames[res])
					}
				}
			}
		}
		if n := pc.wouldDeny.Load(); n > 0 {
			send(m.wouldDeny, prom.CounterValue, float64(n), pc.label)
		}
	})
	m.stores.Each(func(st *storeCounters) {
		buckets := make(map[float64]uint64, len(m.buckets))
		var count uint64
		for i := range st.counts {
			count += st.counts[i].Load()
			if i < len(m.buckets) {
				buckets[m.buckets[i]] = count
			}
		}
		h, err := prom.NewConstHistogram(m.latency, count, time.Duration(st.sumNs.Load()).Seconds(), buckets, st.label)
		if err != nil {
			h = prom.NewInvalidMetric(m.latency, err)
		}
		ch <- h
		for i, r := range metricdef.ReasonNames {
			send(m.errors, prom.CounterValue, float64(st.errors[i].Load()), st.label, r)
		}
	})
	m.sources.Collect(func(s metricdef.Sample) {
		spec := metricdef.Specs[s.Pull]
		vt := prom.CounterValue
		if spec.Gauge {
			vt = prom.GaugeValue
		}
		send(m.pulls[s.Pull], vt, s.Value, s.Labels[:len(spec.Labels)]...)
	})
}
