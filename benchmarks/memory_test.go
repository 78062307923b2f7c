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
		m, err := memory.New(nil)
		if err != nil {
			b.Fatal(err)
		}
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
// for 100k keys, on one goroutine and in parallel. Keys are taken at a prime
// stride: clients do not arrive in the order their windows were made, which
// would let the peers' heap objects, allocated in that order, stream from
// memory.
func BenchmarkMemoryTake(b *testing.B) {
	const stride = 7919
	for _, set := range []string{"HotKey", "100kKeys"} {
		for _, peer := range memoryPeers {
			// warm returns the keys and the peer's take, every key's window open.
			warm := func(b *testing.B) ([]string, func(string) bool) {
				keys := []string{"client-0"}
				if set == "100kKeys" {
					keys = memKeys()
				}
				take := peer.new(b)
				for _, k := range keys {
					take(k)
				}
				b.ReportAllocs()
				b.ResetTimer()
				return keys, take
			}
			b.Run(set+"/"+peer.name, func(b *testing.B) {
				keys, take := warm(b)
				for i := 0; b.Loop(); i += stride {
					if !take(keys[i%len(keys)]) {
						b.Fatal("denied")
					}
				}
			})
			b.Run(set+"/Parallel/"+peer.name, func(b *testing.B) {
				keys, take := warm(b)
				b.RunParallel(func(pb *testing.PB) {
					for i := 0; pb.Next(); i += stride {
						if !take(keys[i%len(keys)]) {
							b.Error("denied")
							return
						}
					}
				})
			})
		}
	}
}

// BenchmarkMemoryTakeInterleaved runs the peers in turns of 1,000 calls
// inside one benchmark and reports each peer's ns/op as a metric. On a
// shared machine whose load moves by 2x between separate runs, only figures
// taken side by side like this can be compared.
func BenchmarkMemoryTakeInterleaved(b *testing.B) {
	const turn = 1000
	for _, keys := range []string{"HotKey", "100kKeys"} {
		for _, parallel := range []bool{false, true} {
			name := keys
			if parallel {
				name += "/Parallel"
			}
			b.Run(name, func(b *testing.B) {
				ks := []string{"client-0"}
				if keys == "100kKeys" {
					ks = memKeys()
				}
				takes := make([]func(string) bool, len(memoryPeers))
				for i, peer := range memoryPeers {
					takes[i] = peer.new(b)
					for _, k := range ks {
						takes[i](k)
					}
				}
				var mu sync.Mutex
				spent := make([]time.Duration, len(takes))
				calls := make([]int64, len(takes))
				run := func(next func() bool, start int) {
					local := make([]time.Duration, len(takes))
					n := make([]int64, len(takes))
					i := start
					for more := true; more; {
						for p, take := range takes {
							t0 := time.Now()
							for j := 0; j < turn; j++ {
								if !take(ks[i%len(ks)]) {
									b.Error("denied")
									return
								}
								i += 7919
							}
							local[p] += time.Since(t0)
							n[p] += turn
						}
						more = next()
					}
					mu.Lock()
					for p := range takes {
						spent[p] += local[p]
						calls[p] += n[p]
					}
					mu.Unlock()
				}
				b.ResetTimer()
				if parallel {
					var g int64
					b.RunParallel(func(pb *testing.PB) {
						mu.Lock()
						g++
						start := int(g) * 104729
						mu.Unlock()
						if pb.Next() {
							run(pb.Next, start)
						}
					})
					// Per-goroutine time over ops: ns per op per goroutine;
					// divide by GOMAXPROCS for the wall time per op.
				} else {
					i := 0
					for b.Loop() {
						run(func() bool { return false }, i)
						i += turn
					}
				}
				for p, peer := range memoryPeers {
					b.ReportMetric(float64(spent[p].Nanoseconds())/float64(calls[p]), peer.name+"-ns/op")
				}
			})
		}
	}
}
