package prometheus_test

import (
	"context"
	"fmt"
	"time"

	prom "github.com/prometheus/client_golang/prometheus"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/metrics/prometheus"
	"github.com/throttlekit/throttlekit/throttler"
)

// A Throttler reports every call to the adapter; the registry's scrape
// (here Gather) turns the counts into metrics.
func Example() {
	metrics, err := prometheus.New(nil)
	if err != nil {
		panic(err)
	}
	registry := prom.NewRegistry()
	registry.MustRegister(metrics)

	store, err := memory.New(nil)
	if err != nil {
		panic(err)
	}
	t, err := throttler.New(store, &throttler.Options{Observe: metrics.Observe})
	if err != nil {
		panic(err)
	}
	if err := metrics.Watch("api", t); err != nil { // its breakers
		panic(err)
	}
	if err := metrics.Watch("memory", store); err != nil { // its keys, read at each scrape
		panic(err)
	}
	login := throttler.Policy{Name: "login", Limit: 2, Window: time.Minute}
	for range 3 {
		_, _ = t.Allow(context.Background(), "client-42", login) // the key is never a label
	}

	families, err := registry.Gather()
	if err != nil {
		panic(err)
	}
	for _, f := range families {
		switch f.GetName() {
		case "throttlekit_decisions_total", "throttlekit_breakers_open", "throttlekit_memory_keys":
		default:
			continue
		}
		for _, m := range f.GetMetric() {
			fmt.Print(f.GetName())
			for _, l := range m.GetLabel() {
				fmt.Printf(" %s=%s", l.GetName(), l.GetValue())
			}
			fmt.Println(":", m.GetCounter().GetValue()+m.GetGauge().GetValue())
		}
	}
	// Output:
	// throttlekit_breakers_open store=default: 0
	// throttlekit_decisions_total op=take policy=login result=allowed source=primary: 2
	// throttlekit_decisions_total op=take policy=login result=denied source=primary: 1
	// throttlekit_memory_keys backend=memory: 1
}
