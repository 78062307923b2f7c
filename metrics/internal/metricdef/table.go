package metricdef

import (
	"sync"
	"sync/atomic"
)

// Table maps a name (a policy's, a store's) to what an adapter keeps for its
// label value, built once by New, for at most Max label values; once they
// are all taken, names not seen before share the entry of Other. Names whose
// labels are equal ("" and "unnamed") share one entry, so that an adapter
// never writes one series twice.
//
// Get takes no lock and does not allocate once a name is known: the map is
// replaced, never changed, when a name is first seen (names are few and
// fixed by configuration, so copies are rare). Once the table is full, an
// unknown name costs a map miss and an atomic load, never the lock, so that
// a bug that names a policy per key does not serialise every call.
type Table[T any] struct {
	// Max bounds the distinct label values, Other aside; at least 1.
	Max int
	// New builds the entry of a label value (the name's, or Other).
	New func(label string) *T

	m       atomic.Pointer[map[string]*T] // by name
	other   atomic.Pointer[T]             // Other's entry, set when the table fills
	mu      sync.Mutex                    // serialises additions and Each
	byLabel map[string]*T
}

// Get returns name's entry. label maps a name to its label value
// (PolicyLabel, StoreLabel).
func (t *Table[T]) Get(name string, label func(string) string) *T {
	if m := t.m.Load(); m != nil {
		if e, ok := (*m)[name]; ok {
			return e
		}
	}
	if o := t.other.Load(); o != nil {
		return o
	}
	return t.add(name, label)
}

func (t *Table[T]) add(name string, label func(string) string) *T {
	t.mu.Lock()
	defer t.mu.Unlock()
	var old map[string]*T
	if m := t.m.Load(); m != nil {
		old = *m
	}
	if e, ok := old[name]; ok {
		return e
	}
	if t.byLabel == nil {
		t.byLabel = map[string]*T{}
	}
	l := label(name)
	e := t.byLabel[l]
	if e == nil {
		if len(t.byLabel) >= max(1, t.Max) {
			return t.overflow()
		}
		e = t.New(l)
		t.byLabel[l] = e
	}
	m := make(map[string]*T, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[name] = e
	t.m.Store(&m)
	return e
}

// overflow returns Other's entry and marks the table full. t.mu is held.
func (t *Table[T]) overflow() *T {
	e := t.byLabel[Other]
	if e == nil {
		e = t.New(Other)
		t.byLabel[Other] = e
	}
	t.other.Store(e)
	return e
}

// Each calls f with every entry, one per label value.
func (t *Table[T]) Each(f func(*T)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, e := range t.byLabel {
		f(e)
	}
}
