// Package metricdef is what the Prometheus and OpenTelemetry adapters share:
// how an Observation maps to label values, the bounded tables that keep
// label values few, and the pull-style sources (routers, shadows,
// migrations, Throttlers' breakers) read at each collection.
//
// Cardinality: no client key ever becomes a label. Label values come from
// configuration (policy names, store names, the names given to Watch) or
// from small fixed sets (op, source, result, reason, side, direction,
// kind); policy and store names are capped by Table, beyond which they
// count as "other".
package metricdef

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// Fixed label values, indexed as the adapters' pre-resolved arrays are.
var (
	// OpNames is indexed by throttler.Op; 0 and anything unknown is "unknown".
	OpNames = [...]string{"unknown", "take", "peek", "refund", "acquire", "release"}
	// SourceNames is indexed by throttler.Source; the last is for unknown
	// sources. Underscores rather than Source.String's hyphen: label values
	// follow the names around them.
	SourceNames = [...]string{"primary", "fallback", "failure_mode", "none", "unknown"}
	// ResultNames: a decision that allowed, one that denied, and no decision
	// (bad input, a caller's cancelled context: Source none).
	ResultNames = [...]string{"allowed", "denied", "error"}
	// ReasonNames classify a primary's failure: its deadline expired (the
	// Throttler's Timeout), or any other error, an open breaker's skipped
	// calls included (the store is not serving them).
	ReasonNames = [...]string{"timeout", "error"}
)

// Sizes of the fixed label sets.
const (
	NumOps     = len(OpNames)
	NumSources = len(SourceNames)
	NumResults = len(ResultNames)
	NumReasons = len(ReasonNames)
)

// Other is the label value that names beyond a Table's bound count under.
const Other = "other"

// Unnamed is the policy label of an unnamed policy; DefaultStore the store
// label of a backend that is one store (Observation.Store "").
const (
	Unnamed      = "unnamed"
	DefaultStore = "default"
)

// OpIndex is op's index in OpNames.
func OpIndex(op throttler.Op) int {
	if op >= throttler.OpTake && int(op) < NumOps {
		return int(op)
	}
	return 0
}

// SourceIndex is s's index in SourceNames.
func SourceIndex(s throttler.Source) int {
	if s >= 0 && int(s) < NumSources-1 {
		return int(s)
	}
	return NumSources - 1
}

// ResultIndex is o's index in ResultNames.
func ResultIndex(o *throttler.Observation) int {
	switch {
	case o.Source == throttler.SourceNone:
		return 2
	case o.Decision.Allowed:
		return 0
	}
	return 1
}

// WouldDeny reports whether o is a Take that its policy would have denied
// but runs in dry run for the key (Decision.WouldDeny): what the would-deny
// counters count. Peeks and refunds are not admissions.
func WouldDeny(o *throttler.Observation) bool {
	return o.Op == throttler.OpTake && o.Decision.WouldDeny
}

// WouldDenyMembers yields, for a WouldDeny observation of a composite
// policy, the name of each member that would have denied: those that say
// WouldDeny (a member in dry run for the key), or, in a composite in dry run
// as a whole, those that denied. Nothing for a single policy.
func WouldDenyMembers(o *throttler.Observation) iter.Seq[string] {
	return func(yield func(string) bool) {
		if !o.Policy.Composite() {
			return
		}
		var names [throttler.MaxMembers]string
		for i, m := range o.Policy.Members() {
			names[i] = m.Name
		}
		byMember := false
		for _, md := range o.Decision.Members() {
			byMember = byMember || md.WouldDeny
		}
		for i, md := range o.Decision.Members() {
			if (byMember && md.WouldDeny || !byMember && !md.Allowed) && !yield(names[i]) {
				return
			}
		}
	}
}

// ReasonIndex classifies a backend error (see ReasonNames).
func ReasonIndex(err error) int {
	if errors.Is(err, context.DeadlineExceeded) {
		return 0
	}
	return 1
}

// PolicyName is the name of the policy o concerns: the concurrency policy's
// for a lease operation, the rate policy's otherwise.
func PolicyName(o *throttler.Observation) string {
	if o.Op == throttler.OpAcquire || o.Op == throttler.OpRelease {
		return o.Concurrency.Name
	}
	return o.Policy.Name
}

// PolicyLabel is the label value of a policy name. A name the Throttler
// refused may be any bytes: label values must be UTF-8.
func PolicyLabel(name string) string {
	if name == "" {
		return Unnamed
	}
	return strings.ToValidUTF8(name, "\uFFFD")
}

// StoreLabel is the label value of a store name.
func StoreLabel(name string) string {
	if name == "" {
		return DefaultStore
	}
	return strings.ToValidUTF8(name, "\uFFFD")
}

// DefaultBuckets are the latency buckets, in seconds: from an in-process
// store's microseconds through a network store's milliseconds to the
// Throttler's default 100ms timeout and beyond.
var DefaultBuckets = []float64{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}

// Options are both adapters' options (each documents its own copy).
type Options struct {
	MaxPolicies, MaxStores int
	Buckets                []float64
}

// WithDefaults validates o and fills in the defaults: 100 policies, 64
// stores, DefaultBuckets. Its errors name the field ("Options.MaxStores
// ..."); the adapter adds its prefix.
func (o Options) WithDefaults() (Options, error) {
	switch {
	case o.MaxPolicies < 0:
		return o, fmt.Errorf("Options.MaxPolicies must be >= 0, got %d", o.MaxPolicies)
	case o.MaxStores < 0:
		return o, fmt.Errorf("Options.MaxStores must be >= 0, got %d", o.MaxStores)
	}
	if o.MaxPolicies == 0 {
		o.MaxPolicies = 100
	}
	if o.MaxStores == 0 {
		o.MaxStores = 64
	}
	if o.Buckets == nil {
		o.Buckets = DefaultBuckets
	}
	for i, b := range o.Buckets {
		// Whole nanoseconds: the Prometheus adapter compares durations.
		d := time.Duration(b * float64(time.Second))
		if d <= 0 || math.IsInf(b, 0) || math.IsNaN(b) || (i > 0 && d <= time.Duration(o.Buckets[i-1]*float64(time.Second))) {
			return o, fmt.Errorf("Options.Buckets must be positive, finite and increasing by at least 1ns, got %v", o.Buckets)
		}
	}
	o.Buckets = slices.Clone(o.Buckets)
	return o, nil
}
