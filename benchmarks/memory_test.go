// Package benchmarks compares throttlekit with peer libraries in one run. It
// is its own module so the peers never enter users' go.sum.
package benchmarks

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sethvargo/go-limiter/memorystore"
	"golang.org/x/time/rate"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/cputime"
	"github.com/throttlekit/throttlekit/throttler"
)

// The limits are high enough that every call is admitted: the benchmarks
// measure the cost of counting in existing state.
const memLimit = 1 << 40

// memoryPeer is one limiter under test, taking one unit for a key.
type memoryPeer struct {
	name string
	new  func(b *testing.B) func(key string) bool
}

// memNow is the time the limiters that take one are given: a clock that a
// goroutine moves every millisecond, as a service's clock moves. Reading
// time.Now on each call would measure the clock instead: it costs about
// 90 ns on this machine's kvm-clock (the time-now row), more than most of
// the limiters. go-limiter takes no time; it reads the clock itself on each
// call, and its figures include that.
func memNow() time.Time { return time.Unix(0, memClock().Load()) }

var memClock = sync.OnceValue(func() *atomic.Int64 {
	var ns atomic.Int64
	ns.Store(time.Now().UnixNano())
	go func() {
		for t := range time.Tick(time.Millisecond) {
			ns.Store(t.UnixNano())
		}
	}()
	return &ns
})

// throttlekitPeer is the memory backend under one policy.
func throttlekitPeer(name string, p throttler.Policy) memoryPeer {
	return memoryPeer{"throttlekit-" + name, func(b *testing.B) func(string) bool {
		// Room for a million keys: the default bound holds 786,432.
		m, err := memory.New(&memory.Options{MaxKeys: 1 << 21})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = m.Close() })
		ctx := context.Background()
		log := p.Algorithm == throttler.SlidingLog
		return func(k string) bool {
			d, err := m.Take(ctx, k, p, 1, memNow())
			if err != nil || !d.Allowed {
				return false
			}
			if log && d.Remaining < 1000 {
				// A log holds at most 10,000 units a window, which a
				// hot key takes in a few ms: refunded in bulk, so
				// that every Take is admitted (one Refund per 9,000
				// Takes, popping about as many entries as they made).
				_, err = m.Refund(ctx, k, p, 9000, d.ResetAt, memNow())
			}
			return err == nil
		}
	}}
}

var memoryPeers = []memoryPeer{
	throttlekitPeer("fixed-window", throttler.Policy{Name: "bench", Limit: memLimit, Window: time.Hour}),
	throttlekitPeer("token-bucket", throttler.Policy{Name: "bench", Limit: memLimit, Window: time.Second, Algorithm: throttler.TokenBucket}),
	throttlekitPeer("sliding-window", throttler.Policy{Name: "bench", Limit: memLimit, Window: time.Second, Algorithm: throttler.SlidingWindow}),
	throttlekitPeer("sliding-log", throttler.Policy{Name: "bench", Limit: throttler.MaxLogLimit, Window: time.Second, Algorithm: throttler.SlidingLog}),
	{"x-time-rate-map", func(b *testing.B) func(string) bool {
		// The usual way to key x/time/rate: a map of limiters behind a
		// mutex. Each is a token bucket (float64 tokens).
		var mu sync.Mutex
		limiters := map[string]*rate.Limiter{}
		return func(k string) bool {
			mu.Lock()
			l, ok := limiters[k]
			if !ok {
				l = rate.NewLimiter(rate.Limit(memLimit/3600), memLimit)
				limiters[k] = l
			}
			mu.Unlock()
			return l.AllowN(memNow(), 1)
		}
	}},
	{"go-limiter-memorystore", func(b *testing.B) func(string) bool {
		// A fixed window per key, aligned to the key's first call.
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
	{"time-now", func(b *testing.B) func(string) bool {
		// Not a limiter: what reading the clock costs here.
		return func(string) bool { return time.Now().UnixNano() != 0 }
	}},
}

// memKeys are made on first use, so that benchmarks of one hot key run
// without the garbage collector scanning them: the first n of 1,000,000.
func memKeys(n int) []string { return memAllKeys()[:n] }

var memAllKeys = sync.OnceValue(func() []string {
	k := make([]string, 1_000_000)
	for i := range k {
		k[i] = fmt.Sprint("client-", i)
	}
	return k
})

// memSetKeys is how many keys a set holds.
func memSetKeys(set string) int {
	switch set {
	case "100kKeys":
		return 100_000
	case "1MKeys":
		return 1_000_000
	}
	return 1
}

// memSeq is the order in which clients arrive: one hot key, or 2^20 draws
// at random from 100,000 or 1,000,000 keys, which each goroutine walks
// from its own start. Clients do not arrive in the order their state was
// made, which would let the peers' heap objects, allocated in that order,
// stream from memory.
func memSeq(set string) []string {
	if set == "HotKey" {
		return []string{"client-0"}
	}
	keys := memKeys(memSetKeys(set))
	rng := rand.New(rand.NewPCG(1, 2))
	seq := make([]string, 1<<20)
	for i := range seq {
		seq[i] = keys[rng.IntN(len(keys))]
	}
	return seq
}

// memWarm returns the peer's take with every key's state made.
func memWarm(b *testing.B, peer memoryPeer, set string) func(string) bool {
	take := peer.new(b)
	keys := memKeys(memSetKeys(set))
	for _, k := range keys {
		if !take(k) {
			b.Fatal("denied while warming")
		}
	}
	runtime.GC() // the earlier limiters' state, not this one's, is garbage
	return take
}

var memSets = []string{"HotKey", "100kKeys", "1MKeys"}

// BenchmarkMemoryTake: each limiter on its own, one unit from existing
// state, for a hot key and for 100k keys in random order, on 1 goroutine
// and on 64.
func BenchmarkMemoryTake(b *testing.B) {
	for _, set := range memSets {
		seq := memSeq(set)
		mask := len(seq) - 1
		for _, g := range []int{1, 64} {
			for _, peer := range memoryPeers {
				b.Run(fmt.Sprintf("%s/%dg/%s", set, g, peer.name), func(b *testing.B) {
					take := memWarm(b, peer, set)
					b.ReportAllocs()
					if g == 1 {
						for i := 0; b.Loop(); i++ {
							if !take(seq[i&mask]) {
								b.Fatal("denied")
							}
						}
						return
					}
					b.SetParallelism(max(1, g/runtime.GOMAXPROCS(0)))
					var next atomic.Int64
					b.ResetTimer()
					b.RunParallel(func(pb *testing.PB) {
						for i := int(next.Add(1)) * 104729; pb.Next(); i++ {
							if !take(seq[i&mask]) {
								b.Error("denied")
								return
							}
						}
					})
				})
			}
		}
	}
}

// BenchmarkMemoryTakeInterleaved runs the limiters side by side in one
// benchmark, because on a shared machine whose load moves by 2x between
// runs only figures taken together compare. Each round gives every
// limiter a turn on the same keys, starting with another limiter each
// round; the metrics are medians over rounds of each one's ns per call and
// of each throttlekit algorithm's ratio to each peer in the same round, so
// rounds that other work disturbed (and the turns that first read the
// round's keys) drop out.
//
// On 1 goroutine a turn is 1,000 calls timed by the thread's own CPU time (the goroutine is locked
// to its thread), which other processes' load does not inflate; an iteration is 20 rounds. On 64
// goroutines a turn is 20 ms of all of them taking as fast as they can: ns per call is the turn's
// wall time over the calls made, the inverse of throughput on the machine's cores; an iteration is
// one round.
func BenchmarkMemoryTakeInterleaved(b *testing.B) {
	if !cputime.Supported {
		b.Skip("no thread CPU clock here")
	}
	for _, set := range memSets {
		seq := memSeq(set)
		mask := len(seq) - 1
		for _, g := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/%dg", set, g), func(b *testing.B) {
				takes := make([]func(string) bool, len(memoryPeers))
				for p, peer := range memoryPeers {
					takes[p] = memWarm(b, peer, set)
				}
				costs := make([][]float64, len(takes)) // per round, ns per call
				var denied atomic.Bool
				turn := func(take func(string) bool, start int) float64 {
					const calls = 1000
					t0 := cputime.Thread()
					for i := start; i < start+calls; i++ {
						if !take(seq[i&mask]) {
							denied.Store(true)
						}
					}
					return float64(cputime.Thread()-t0) / calls
				}
				if g > 1 {
					turn = func(take func(string) bool, start int) float64 {
						return memThroughputTurn(take, seq, g, start, 20*time.Millisecond, &denied)
					}
				}
				if g == 1 {
					runtime.LockOSThread()
					defer runtime.UnlockOSThread()
				}
				rounds := 1 // per iteration: a 64-goroutine round takes 20 ms per limiter
				if g == 1 {
					rounds = 20
				}
				b.ResetTimer()
				for round := 0; b.Loop(); {
					for range rounds {
						// Each round starts with another limiter: the
						// first to walk a round's keys reads their bytes
						// from memory, the others from the cache.
						for j := range takes {
							p := (j + round) % len(takes)
							costs[p] = append(costs[p], turn(takes[p], round*1000))
						}
						round++
					}
				}
				b.StopTimer()
				if denied.Load() {
					b.Fatal("a call was denied")
				}
				for p, peer := range memoryPeers {
					b.ReportMetric(memMedian(costs[p]), peer.name+"-ns/op")
				}
				// Ratios: a throttlekit algorithm's time per call over a
				// peer's, below 1 when throttlekit is faster.
				for p, peer := range memoryPeers {
					alg, ours := strings.CutPrefix(peer.name, "throttlekit-")
					for q, other := range memoryPeers {
						if !ours || strings.HasPrefix(other.name, "throttlekit-") || other.name == "time-now" {
							continue
						}
						r := make([]float64, len(costs[p]))
						for i := range r {
							r[i] = costs[p][i] / costs[q][i]
						}
						short := strings.TrimSuffix(strings.TrimSuffix(other.name, "-map"), "-memorystore")
						b.ReportMetric(memMedian(r), alg+"/"+short)
					}
				}
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// memThroughputTurn has g goroutines call take for d, each walking seq from
// its own start, and returns the wall time per call.
func memThroughputTurn(take func(string) bool, seq []string, g, start int, d time.Duration, denied *atomic.Bool) float64 {
	mask := len(seq) - 1
	var stop atomic.Bool
	var calls atomic.Int64
	var wg sync.WaitGroup
	t0 := time.Now()
	for j := range g {
		wg.Go(func() {
			n := 0
			for i := start + j*104729; !stop.Load(); {
				for range 64 {
					if !take(seq[i&mask]) {
						denied.Store(true)
					}
					i++
				}
				n += 64
			}
			calls.Add(int64(n))
		})
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	return float64(time.Since(t0).Nanoseconds()) / float64(calls.Load())
}

func memMedian(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}
