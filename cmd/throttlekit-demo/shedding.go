package main

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit/httplimit"
	"github.com/throttlekit/throttlekit/shed"
	"github.com/throttlekit/throttlekit/throttler"
)

// shedding configures the demo's Stripe part: /exports (slow, Read for GET
// and Write for POST) and POST /charges (critical) behind the four
// limiters, on the same memory backend.
type shedding struct {
	workers     int           // the worker shedder's requests at once at utilization 1
	fleet       int64         // the fleet's capacity, every class together
	share       float64       // the part of it non-critical traffic may hold
	inflight    int64         // exports in flight per client
	work        time.Duration // how long an export takes
	delay, ramp time.Duration // the worker shedder's constants
	rate        throttler.Policy
	charges     throttler.Policy
}

// defaultShedding is the demo's Stripe part with Stripe's shedder
// constants, and /exports and /charges limited to limit per window per
// client.
func defaultShedding(limit int64, window time.Duration) shedding {
	return shedding{
		workers: 4, fleet: 5, share: 0.8, inflight: 2, work: 5 * time.Second,
		delay: 28 * time.Second, ramp: 120 * time.Second,
		rate:    throttler.Policy{Name: "exports", Limit: limit, Window: window},
		charges: throttler.Policy{Name: "charges", Limit: limit, Window: window},
	}
}

// shedAPI is the Stripe part, built.
type shedAPI struct {
	worker *shed.Worker
	fleet  *shed.Fleet
	// load is a pretend utilization (float64 bits) that PUT
	// /admin/utilization sets: the worker shedder sees the larger of it
	// and the real one (exports in flight over workers).
	load atomic.Uint64
	// exporting counts the exports past every limiter, in their handler:
	// what holds a fleet slot and a concurrency lease, where the worker
	// shedder's in-flight count also counts requests still on their way to them.
	exporting atomic.Int64
}

// addShedding adds /exports, POST /charges, PUT /admin/utilization and GET
// /admin/shedding to mux. The worker shedder it returns needs its ticks
// (Worker.Run).
func addShedding(mux *http.ServeMux, th *throttler.Throttler, sh shedding) (*shedAPI, error) {
	if sh.workers <= 0 {
		return nil, fmt.Errorf("demo: -workers must be at least 1, got %d", sh.workers)
	}
	api := &shedAPI{}
	var err error
	workers := float64(sh.workers)
	api.worker, err = shed.NewWorker(&shed.WorkerOptions{
		Workers: sh.workers, Delay: sh.delay, Ramp: sh.ramp,
		Utilization: func() float64 {
			return max(float64(api.worker.Stats().InFlight)/workers, math.Float64frombits(api.load.Load()))
		},
	})
	if err != nil {
		return nil, err
	}
	if api.fleet, err = shed.NewFleet(th, &shed.FleetOptions{Capacity: sh.fleet, Share: sh.share}); err != nil {
		return nil, err
	}
	critical := func(r *http.Request) bool { return r.Method == http.MethodPost && r.URL.Path == "/charges" }
	ietf := &httplimit.Options{IETFHeaders: true}
	inflight, err := httplimit.Concurrency(th, throttler.ConcurrencyPolicy{Name: "exports-inflight", Limit: sh.inflight, TTL: time.Minute + sh.work}, clientKey, nil)
	if err != nil {
		return nil, fmt.Errorf("/exports: %w", err)
	}
	exportRate, err := httplimit.Rate(th, sh.rate, clientKey, ietf)
	if err != nil {
		return nil, fmt.Errorf("/exports: %w", err)
	}
	exports, err := shed.Middleware(&shed.Options{
		Critical: critical, Worker: api.worker, Fleet: api.fleet, Concurrency: inflight, Rate: exportRate,
	})
	if err != nil {
		return nil, fmt.Errorf("/exports: %w", err)
	}
	chargeRate, err := httplimit.Rate(th, sh.charges, clientKey, ietf)
	if err != nil {
		return nil, fmt.Errorf("/charges: %w", err)
	}
	charges, err := shed.Middleware(&shed.Options{Critical: critical, Worker: api.worker, Fleet: api.fleet, Rate: chargeRate})
	if err != nil {
		return nil, fmt.Errorf("/charges: %w", err)
	}
	export := exports(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		api.exporting.Add(1)
		defer api.exporting.Add(-1)
		select {
		case <-time.After(sh.work):
		case <-r.Context().Done():
			return
		}
		writeJSON(w, map[string]any{"export": "done"})
	}))
	mux.Handle("GET /exports", export)
	mux.Handle("POST /exports", export)
	mux.Handle("POST /charges", charges(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]any{"charged": true})
	})))
	mux.HandleFunc("PUT /admin/utilization", func(w http.ResponseWriter, r *http.Request) {
		v, err := strconv.ParseFloat(r.URL.Query().Get("value"), 64)
		if err != nil || !(v >= 0 && v <= 1) {
			http.Error(w, "value must be a utilization from 0 to 1", http.StatusBadRequest)
			return
		}
		api.load.Store(math.Float64bits(v))
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /admin/shedding", func(w http.ResponseWriter, r *http.Request) {
		st := api.worker.Stats()
		drop := map[string]float64{}
		for _, c := range []shed.Class{shed.TestMode, shed.Read, shed.Write, shed.Critical} {
			drop[c.String()] = st.DropChance[c]
		}
		writeJSON(w, map[string]any{
			"in_flight": st.InFlight, "pretend_utilization": math.Float64frombits(api.load.Load()),
			"shed_amount": st.ShedAmount, "drop_chance": drop,
		})
	})
	return api, nil
}

// printShedding prints the Stripe part's limits and commands to try.
func printShedding(w io.Writer, base string, sh shedding) {
	fmt.Fprintf(w, "\nStripe's four limiters, in this order, on GET|POST /exports (each takes %v) and POST /charges (critical):\n", sh.work)
	fmt.Fprintf(w, "  worker shedder  %d workers; sheds after %v of utilization above 0.8, all but critical %v later\n", sh.workers, sh.delay, sh.ramp)
	fmt.Fprintf(w, "  fleet shedder   %d requests at once, of which non-critical traffic may hold %d\n", sh.fleet, int64(math.Floor(sh.share*float64(sh.fleet)+1e-9)))
	fmt.Fprintf(w, "  concurrency     %d exports in flight per client\n", sh.inflight)
	fmt.Fprintf(w, "  rate            %v; %v\n", sh.rate, sh.charges)
	fmt.Fprintf(w, "A refusal names its limiter in %s: 503 for the shedders, 429 for the limits.\n", shed.HeaderLimiter)
	fmt.Fprintf(w, "\nTry it:\n")
	for _, c := range sheddingCommands(base, sh) {
		fmt.Fprintf(w, "  # %s\n  %s\n", c[0], c[1])
	}
}

func sheddingCommands(base string, sh shedding) [][2]string {
	status := `curl -s -o /dev/null -w '%{http_code} %header{` + shed.HeaderLimiter + `}\n'`
	return [][2]string{
		{fmt.Sprintf("concurrency: %d exports of one client at once; the one over %d gets 429 concurrency", sh.inflight+1, sh.inflight),
			fmt.Sprintf("for i in $(seq %d); do %s -H 'Authorization: token bob' %s/exports & done; wait", sh.inflight+1, status, base)},
		{fmt.Sprintf("fleet: %d clients at once; beyond the non-critical share they get 503 fleet-shedder, a charge still passes", sh.fleet),
			fmt.Sprintf("for i in $(seq %d); do %s -H \"Authorization: token c$i\" %s/exports & done; sleep 1; %s -X POST %s/charges; wait", sh.fleet, status, base, status, base)},
		{"worker: pretend the process is saturated",
			fmt.Sprintf("curl -X PUT '%s/admin/utilization?value=1'", base)},
		{fmt.Sprintf("watch the shedding amount: it reaches 0 after %v, then test-mode traffic goes first, then reads, then writes", sh.delay),
			fmt.Sprintf("curl -s %s/admin/shedding", base)},
		{"a test-mode export once shedding has started: 503 worker-shedder (or 200, by chance, early on)",
			fmt.Sprintf("%s -H 'X-Test-Mode: 1' %s/exports", status, base)},
		{"back to normal: traffic comes back as slowly",
			fmt.Sprintf("curl -X PUT '%s/admin/utilization?value=0'", base)},
	}
}
