package metricdef_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/throttlekit/throttlekit/metrics/internal/metricdef"
)

type entry struct{ label string }

func newTable(max int) *metricdef.Table[entry] {
	return &metricdef.Table[entry]{Max: max, New: func(l string) *entry { return &entry{l} }}
}

func labels(t *metricdef.Table[entry]) map[string]bool {
	out := map[string]bool{}
	t.Each(func(e *entry) { out[e.label] = true })
	return out
}

func TestTableBoundsLabels(t *testing.T) {
	tb := newTable(2)
	a := tb.Get("a", metricdef.PolicyLabel)
	assert.Same(t, a, tb.Get("a", metricdef.PolicyLabel))
	unnamed := tb.Get("", metricdef.PolicyLabel)
	assert.Equal(t, "unnamed", unnamed.label)
	assert.Same(t, unnamed, tb.Get("unnamed", metricdef.PolicyLabel), "equal labels share an entry")
	other := tb.Get("c", metricdef.PolicyLabel)
	assert.Equal(t, "other", other.label)
	assert.Same(t, other, tb.Get("d", metricdef.PolicyLabel))
	assert.Same(t, other, tb.Get("other", metricdef.PolicyLabel), "a name other shares the overflow")
	assert.Same(t, a, tb.Get("a", metricdef.PolicyLabel), "known names keep their entry once full")
	assert.Equal(t, map[string]bool{"a": true, "unnamed": true, "other": true}, labels(tb))
	assert.Equal(t, "bad\uFFFD", metricdef.PolicyLabel("bad\xff"))
}

// Concurrent first sightings of the same names build one entry per label,
// never more than Max (and other), and each name has one entry for all.
func TestTableConcurrentGets(t *testing.T) {
	tb := newTable(50)
	var wg sync.WaitGroup
	seen := make([]map[string]*entry, 8)
	for g := range seen {
		seen[g] = map[string]*entry{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				name := fmt.Sprint("p", (i*7+g)%100)
				seen[g][name] = tb.Get(name, metricdef.PolicyLabel)
			}
		}()
	}
	wg.Wait()
	got := labels(tb)
	assert.Len(t, got, 51, "50 names and other")
	assert.True(t, got["other"])
	for name, e := range seen[0] {
		for g := 1; g < len(seen); g++ {
			if e2, ok := seen[g][name]; ok {
				assert.Same(t, e, e2, "every goroutine gets one entry for %s", name)
			}
		}
	}
}
