package shed_test

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/httplimit"
	"github.com/throttlekit/throttlekit/internal/cputime"
	"github.com/throttlekit/throttlekit/shed"
	"github.com/throttlekit/throttlekit/throttler"
)

// benchWorker is a Worker at rest (sheds nothing: Admit draws no random
// number) or shedding half the reads (Admit draws one per Read request).
func benchWorker(b *testing.B, shedding bool) *shed.Worker {
	w, u := newWorker(b, shed.WorkerOptions{})
	if shedding {
		u.set(1)
		w.Update(at(0))
		for s := 1; s <= 88; s++ { // amount 60/120: reads dropped with chance 1/2
			w.Update(at(s))
		}
		if w.Stats().DropChance[shed.Read] != 0.5 {
			b.Fatalf("read drop chance %v, want 0.5", w.Stats().DropChance[shed.Read])
		}
	}
	return w
}

// BenchmarkWorkerAdmit is the worker shedder's per-request cost on the hot
// path: Admit, and Done for an admitted request, from every P at once.
func BenchmarkWorkerAdmit(b *testing.B) {
	for _, bc := range []struct {
		name     string
		shedding bool
	}{{"rest", false}, {"shedding", true}} {
		b.Run(bc.name+"/serial", func(b *testing.B) {
			w := benchWorker(b, bc.shedding)
			b.ReportAllocs()
			report := cputime.Measure(b)
			for b.Loop() {
				if w.Admit(shed.Read) {
					w.Done()
				}
			}
			report(b.N)
		})
		b.Run(bc.name+"/parallel", func(b *testing.B) {
			w := benchWorker(b, bc.shedding)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if w.Admit(shed.Read) {
						w.Done()
					}
				}
			})
		})
	}
}

// discard is a ResponseWriter that keeps nothing but its header map, which
// each request starts empty.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(int)             {}

// BenchmarkMiddleware is a request's cost through the chain on the memory
// backend (holding leases), one limiter added at a time, against the bare
// handler: every request is admitted (the limits are never reached), so
// each limiter does all its work, and leases are released.
func BenchmarkMiddleware(b *testing.B) {
	store, err := memory.New(nil)
	if err != nil {
		b.Fatal(err)
	}
	th := newThrottler(b, store, failOpen)
	worker, _ := newWorker(b, shed.WorkerOptions{})
	fleet, err := shed.NewFleet(th, &shed.FleetOptions{Capacity: throttler.MaxConcurrencyLimit})
	if err != nil {
		b.Fatal(err)
	}
	key := httplimit.KeyByHeader("Client")
	conc, err := httplimit.Concurrency(th, throttler.ConcurrencyPolicy{Name: "inflight", Limit: 1000, TTL: time.Minute}, key, nil)
	if err != nil {
		b.Fatal(err)
	}
	rate, err := httplimit.Rate(th, throttler.Policy{Name: "api", Limit: throttler.MaxLimit, Window: time.Hour}, key, nil)
	if err != nil {
		b.Fatal(err)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	for _, bc := range []struct {
		name string
		o    *shed.Options
	}{
		{"handler", nil},
		{"worker", &shed.Options{Worker: worker}},
		{"worker+fleet", &shed.Options{Worker: worker, Fleet: fleet}},
		{"worker+fleet+concurrency", &shed.Options{Worker: worker, Fleet: fleet, Concurrency: conc}},
		{"all-four", &shed.Options{Worker: worker, Fleet: fleet, Concurrency: conc, Rate: rate}},
		{"rate-alone", &shed.Options{Rate: rate}},
	} {
		h := http.Handler(ok)
		if bc.o != nil {
			mw, err := shed.Middleware(bc.o)
			if err != nil {
				b.Fatal(err)
			}
			h = mw(ok)
		}
		for _, par := range []bool{false, true} {
			name := bc.name + "/serial"
			if par {
				name = bc.name + "/parallel"
			}
			b.Run(name, func(b *testing.B) {
				var client atomic.Int64
				one := func(pb func() bool) {
					r := newRequest("GET", "/v1/things", "Client", fmt.Sprint("client-", client.Add(1)))
					w := &discard{h: http.Header{}}
					for pb() {
						clear(w.h)
						h.ServeHTTP(w, r)
					}
				}
				b.ReportAllocs()
				if par {
					b.RunParallel(func(pb *testing.PB) { one(pb.Next) })
				} else {
					report := cputime.Measure(b)
					one(b.Loop)
					report(b.N)
				}
			})
		}
	}
}
