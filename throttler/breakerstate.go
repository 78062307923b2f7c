package throttler

import (
	"maps"
	"slices"
)

// BreakerState is one store's breaker as Breakers reads it, for metrics
// and alerts: an open breaker means the Throttler answers that store's keys
// from the fallback or the failure mode.
type BreakerState struct {
	// Store is the store's name as the backend names it; "" for a backend
	// that is one store (and for the stores beyond the Throttler's bound).
	Store string
	// Open reports that calls skip the store: its breaker opened and no
	// probe has succeeded since. With no calls to probe it, it stays open.
	Open bool
	// Failures is the run of consecutive store failures counted so far.
	Failures int64
}

// Breakers returns the state of each store's breaker, sorted by store: the
// stores seen so far, and the shared breaker ("") for a backend that names
// no stores or when that breaker holds failures. It reads atomics and takes
// no lock on the call path; it is meant for scrapes, not for every call.
func (t *Throttler) Breakers() []BreakerState {
	if t == nil || t.backend == nil {
		return nil
	}
	var out []BreakerState
	if shared := stateOf("", &t.breaker); t.store == nil || shared.Open || shared.Failures > 0 {
		out = append(out, shared)
	}
	if m := t.breakers.Load(); m != nil {
		for _, store := range slices.Sorted(maps.Keys(*m)) {
			out = append(out, stateOf(store, (*m)[store]))
		}
	}
	return out
}

func stateOf(store string, b *breaker) BreakerState {
	return BreakerState{Store: store, Open: b.openUntil.Load() != 0, Failures: b.failures.Load()}
}
