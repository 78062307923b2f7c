// Package benchmarks compares throttlekit with peer libraries in one run. It
// is its own module so the peers never enter users' go.sum.
package benchmarks

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sethvargo/go-limiter/memorystore"
	"golang.org/x/time/rate"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

// The limit is high enough that every call is admitted: the benchmarks
// measure the cost of counting in an existing window.
const memLimit = 1 << 40

// memKeys are made on first use, so that benchmarks of one hot key run
// without the garbage collector scanning them.
var memKeys = sync.OnceValue(func() []string {
	k := make([]string, 100_000)
	for i := range k {
		k[i] = fmt.Sprint("client-", i)
	}
	return k
})

// memoryPeer is one limiter under test, taking one unit for a key.
type memoryPeer struct {
	name string
	new  func(b *testing.B) func(key string) bool
}

var memoryPeers = []memoryPeer{
	{"throttlekit", func(b *testing.B) func(string) bool {
		m := memory.New(nil)
		p := throttler.Policy{Name: "bench", Limit: memLimit, Window: time.Hour}
		now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
		ctx := context.Background()
		return func(k string) bool {
			d, err := m.Take(ctx, k, p, 1, now)
			return err == nil && d.Allowed
		}
	}},
	{"x-time-rate-map", func(b *testing.B) func(string) bool {
		// The usual way to key x/time/rate: a map of limiters behind a mutex.
		var mu sync.Mutex
		limiters := map[string]*rate.Limiter{}
		now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
		return func(k string) bool {
			mu.Lock()
			l, ok := limiters[k]
			if !ok {
				l = rate.NewLimiter(rate.Limit(memLimit/3600), memLimit)
				limiters[k] = l
			}
			mu.Unlock()
			return l.AllowN(now, 1)
		}
	}},
	{"go-limiter-memorystore", func(b *testing.B) func(string) bool {
		s, err := memorystore.New(&memorystore.Config{Tokens: memLimit, Interval: time.Hour, SweepInterval: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = s.Close(context.Background()) })
		ctx := context.Background()
		return func(k string) bool {
			_, _, _, ok, err := s.Take(ctx, k)
			return err == nil && ok
		}
	}},
}

// BenchmarkMemoryTake: one unit from an existing window, for a hot key and
// for 100k keys, on one goroutine and in parallel.
func BenchmarkMemoryTake(b *testing.B) {
	for _, keys := range []struct {
		name string
		keys []string
	}{{"HotKey", []string{"client-0"}}, {"100kKeys", nil}} {
		for _, peer := range memoryPeers {
			b.Run(keys.name+"/"+peer.name, func(b *testing.B) {
				keys := keys
				if keys.keys == nil {
					keys.keys = memKeys()
				}
				take := peer.new(b)
				for _, k := range keys.keys {
					take(k)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					if !take(keys.keys[i%len(keys.keys)]) {
						b.Fatal("denied")
					}
				}
			})
			b.Run(keys.name+"/Parallel/"+peer.name, func(b *testing.B) {
				keys := keys
				if keys.keys == nil {
					keys.keys = memKeys()
				}
				take := peer.new(b)
				for _, k := range keys.keys {
					take(k)
				}
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					i := 0
					for pb.Next() {
						if !take(keys.keys[i%len(keys.keys)]) {
							b.Error("denied")
							return
						}
						i += 7919
					}
				})
			})
		}
	}
}
