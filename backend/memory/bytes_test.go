package memory_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

// BenchmarkBytesPerKey reports the heap a state costs, for keys like "client-123456" under each
// algorithm: with 100,000 and 700,000 keys (tables between growths, none full), and with as many
// keys as the default bound (shards fill unevenly, so the fullest evict, and the second tier holds
// what they evicted; the metric counts the states held). A log holds one entry. An iteration fills
// a new Backend; the metric is the heap it holds over the states it holds.
func BenchmarkBytesPerKey(b *testing.B) {
	for _, n := range []int{100_000, 700_000, memory.DefaultMaxKeys} {
		for _, alg := range []throttler.Algorithm{throttler.FixedWindow, throttler.TokenBucket, throttler.SlidingWindow, throttler.SlidingLog} {
			b.Run(fmt.Sprintf("%s/%d", alg, n), func(b *testing.B) {
				p := throttler.Policy{Name: "p", Limit: 10, Window: time.Hour, Algorithm: alg}
				keys := make([]string, n)
				for i := range keys {
					keys[i] = "client-" + strconv.Itoa(i)
				}
				var perKey float64
				for b.Loop() {
					runtime.GC()
					var before, after runtime.MemStats
					runtime.ReadMemStats(&before)
					m, err := memory.New(nil)
					if err != nil {
						b.Fatal(err)
					}
					for _, k := range keys {
						if _, err := m.Take(context.Background(), k, p, 1, t0); err != nil {
							b.Fatal(err)
						}
					}
					runtime.GC()
					runtime.ReadMemStats(&after)
					perKey = float64(after.HeapAlloc-before.HeapAlloc) / float64(m.Len())
					runtime.KeepAlive(m)
					_ = m.Close()
				}
				b.ReportMetric(perKey, "bytes/key")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}
