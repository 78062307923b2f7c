package otel_test

import (
	"context"
	"fmt"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/metrics/otel"
	"github.com/throttlekit/throttlekit/throttler"
)

// A Throttler reports every call to the adapter's instruments; a reader (here
// the SDK's manual reader; in production a periodic exporter) collects them.
func Example() {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = provider.Shutdown(ctx) }()

	metrics, err := otel.New(provider, nil)
	if err != nil {
		panic(err)
	}
	store, err := memory.New(nil)
	if err != nil {
		panic(err)
	}
	t, err := throttler.New(store, &throttler.Options{Observe: metrics.Observe})
	if err != nil {
		panic(err)
	}
	login := throttler.Policy{Name: "login", Limit: 2, Window: time.Minute}
	for range 3 {
		_, _ = t.Allow(ctx, "client-42", login) // the key is never an attribute
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		panic(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "throttlekit.decisions" {
				for _, p := range sum.DataPoints {
					result, _ := p.Attributes.Value("throttlekit.result")
					fmt.Printf("%s %s result=%s: %d\n", m.Name, m.Unit, result.AsString(), p.Value)
				}
			}
		}
	}
	// Unordered output:
	// throttlekit.decisions {decision} result=allowed: 2
	// throttlekit.decisions {decision} result=denied: 1
}
