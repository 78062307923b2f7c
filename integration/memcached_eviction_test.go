package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/throttlekit/throttlekit/throttler"
)

// TestMemcachedEviction measures the weakness that motivates migrating: a
// Memcached with little memory (-m 4), filled with unrelated cache items,
// evicts live limiter windows, and those clients get a fresh window.
// docs/backends-memcached.md quotes the figures this test logs.
//
// 3 groups of 200 idle clients take one unit each in an open 1-hour window,
// then make no request while unrelated items are written; each group takes
// again after a third, two thirds and all of the fill. 500 active clients
// take one unit after every fifteenth of the fill. A client got a fresh
// window when a Take reports fewer units than it took (its counter was
// evicted) or a new ResetAt (its head was evicted).
//
// Memcached evicts within a slab class (items of similar size), so the fill
// is measured twice: with small items of the limiter's own size class
// (session flags, counters), and with 4 KB items of another class.
func TestMemcachedEviction(t *testing.T) {
	const memMB, idleGroups, perIdleGroup, active = 4, 3, 200, 500
	const idle = idleGroups * perIdleGroup
	fills := []struct {
		name      string
		valueSize int
		times     float64 // bytes written, as a multiple of the server's memory
	}{
		{"small", 40, 1.5},
		{"4KB", 4096, 3},
	}
	for _, fill := range fills {
		t.Run(fill.name+"-items", func(t *testing.T) {
			s := memcachedStart(t, "-m", fmt.Sprint(memMB))
			c := memcachedClient(t, time.Second, s.addr)
			b := memcachedNew(t, c, nil)
			p := throttler.Policy{Name: "evict", Limit: 1000, Window: time.Hour}
			t0 := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
			ctx := context.Background()
			idleKey := func(i int) string { return fmt.Sprintf("idle-%04d", i) }
			activeKey := func(i int) string { return fmt.Sprintf("active-%04d", i) }

			// take takes one unit at now and reports whether the window is
			// the first one with all the units taken so far.
			take := func(key string, now time.Time, want int64) (bool, error) {
				d, err := b.Take(ctx, key, p, 1, now)
				if err != nil {
					return false, err
				}
				return d.Allowed && d.Used == want && d.ResetAt.Equal(t0.Add(p.Window)), nil
			}
			memcachedParallel(t, idle+active, func(n int) error {
				key := idleKey(n)
				if n >= idle {
					key = activeKey(n - idle)
				}
				if ok, err := take(key, t0, 1); err != nil || !ok {
					return fmt.Errorf("first take of %s: ok %v, %v", key, ok, err)
				}
				return nil
			})

			value := []byte(strings.Repeat("v", fill.valueSize))
			itemBytes := 56 + len("fill:00000000") + fill.valueSize // as Memcached counts, about
			total := int(fill.times * memMB * (1 << 20) / float64(itemBytes))
			const rounds = 15
			var activeLost atomic.Int64
			lost := make([]atomic.Bool, active)
			var idleReport []string
			idleLost := make([]int64, idleGroups)
			for r := 0; r < rounds; r++ {
				from, to := total*r/rounds, total*(r+1)/rounds
				memcachedParallel(t, to-from, func(n int) error {
					return c.Set(&memcache.Item{Key: fmt.Sprintf("fill:%08d", from+n), Value: value})
				})
				// 2s apart: past CacheFor, so every head is read again.
				now := t0.Add(time.Duration(r+1) * 2 * time.Second)
				memcachedParallel(t, active, func(i int) error {
					ok, err := take(activeKey(i), now, int64(r+2))
					if err == nil && !ok && !lost[i].Swap(true) {
						activeLost.Add(1)
					}
					return err
				})
				if (r+1)%(rounds/idleGroups) != 0 {
					continue
				}
				g := (r+1)/(rounds/idleGroups) - 1
				var n atomic.Int64
				memcachedParallel(t, perIdleGroup, func(i int) error {
					ok, err := take(idleKey(g*perIdleGroup+i), now, 2)
					if err == nil && !ok {
						n.Add(1)
					}
					return err
				})
				idleLost[g] = n.Load()
				idleReport = append(idleReport, fmt.Sprintf("after %.1fx: %d of %d (%.0f%%)",
					fill.times*float64(r+1)/rounds, n.Load(), perIdleGroup, 100*float64(n.Load())/perIdleGroup))
			}
			t.Logf("memcached -m %d, %d items of %d-byte values written (%.1fx its memory): "+
				"idle clients with a fresh window %s; active clients %d of %d (%.0f%%)",
				memMB, total, fill.valueSize, fill.times, strings.Join(idleReport, ", "),
				activeLost.Load(), active, 100*float64(activeLost.Load())/active)
			last := idleLost[idleGroups-1]
			if fill.valueSize < 100 && last == 0 {
				t.Errorf("filling %.1fx the memory with items of the limiter's size evicted no idle window: the weakness must be visible", fill.times)
			}
			if fill.valueSize < 100 && activeLost.Load()*perIdleGroup*2 >= last*active {
				// Reading the head fetches the counter too, so Memcached's
				// LRU sees active windows as used (incr alone does not count).
				t.Errorf("active clients lost %d of %d windows, idle ones %d of %d: activity should protect a window", activeLost.Load(), active, last, perIdleGroup)
			}
		})
	}
}

// memcachedParallel runs f(0..n-1) on 16 goroutines and fails the test on
// the first error.
func memcachedParallel(t *testing.T, n int, f func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	next := make(chan int)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					once.Do(func() { first = err })
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	if first != nil {
		t.Fatal(first)
	}
}
