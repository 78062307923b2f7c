package outbound_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/outbound"
	"github.com/throttlekit/throttlekit/throttler"
)

// gateway stands for a payment gateway that allows limit calls in any
// window, by its own clock, and refuses the rest with 429.
type gateway struct {
	limit    int
	window   time.Duration
	mu       sync.Mutex
	accepted []time.Time
	refused  int
}

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	for len(g.accepted) > 0 && now.Sub(g.accepted[0]) >= g.window {
		g.accepted = g.accepted[1:]
	}
	if len(g.accepted) >= g.limit {
		g.refused++
		w.Header().Set("Retry-After", "1")
		http.Error(w, "slow down", http.StatusTooManyRequests)
		return
	}
	g.accepted = append(g.accepted, now)
	io.WriteString(w, "charged")
}

// A payment client shared by the workers of a service. The gateway allows
// 5 calls in any 200ms; 4 workers with 3 payments each push harder. The
// Transport makes each payment wait for capacity, so none is refused. Every
// process of the service builds the same client over one shared store
// (backend/redis; the memory backend here), so the limit holds across the
// fleet, and a pause that the gateway asks of one worker stops them all.
func Example() {
	gw := &gateway{limit: 5, window: 100 * time.Millisecond}
	srv := httptest.NewServer(gw)
	defer srv.Close()

	store, err := memory.New(nil) // redis.New(client, nil) for a fleet
	if err != nil {
		log.Fatal(err)
	}
	th, err := throttler.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	tr, err := outbound.New(th, &outbound.Options{
		// Under the gateway's limit: the time added to its window covers
		// the time a call takes to reach it, a new connection's included
		// (docs/outbound.md, "The margin"); generous here, so that the
		// example holds on a loaded machine.
		Policy: throttler.Policy{Name: "gateway", Limit: 5, Window: 600 * time.Millisecond, Algorithm: throttler.SlidingLog},
		// A payment refused with a pause is sent again after it: it
		// carries an Idempotency-Key, so that is safe.
		Retries: 1,
	})
	if err != nil {
		log.Fatal(err)
	}
	payments := &http.Client{Transport: tr, Timeout: 10 * time.Second}

	var paid atomic.Int64
	var wg sync.WaitGroup
	for worker := range 4 {
		wg.Go(func() {
			for i := range 3 {
				req, err := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader("amount=1000&currency=sgd"))
				if err != nil {
					log.Fatal(err)
				}
				req.Header.Set("Idempotency-Key", fmt.Sprintf("charge-%d-%d", worker, i))
				resp, err := payments.Do(req)
				if err != nil {
					log.Print(err) // the gateway's error, or the context's
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					paid.Add(1)
				}
			}
		})
	}
	wg.Wait()
	fmt.Printf("paid %d of 12; the gateway refused %d\n", paid.Load(), gw.refused)
	// Output: paid 12 of 12; the gateway refused 0
}

// Per-merchant limits: a gateway that limits each merchant's calls apart
// gets a key per merchant, under one policy (or a policy per merchant).
func ExampleOptions_route() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	store, err := memory.New(nil)
	if err != nil {
		log.Fatal(err)
	}
	th, err := throttler.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	perMerchant := throttler.PerMinute(600).Named("gateway-merchant")
	tr, err := outbound.New(th, &outbound.Options{
		Policy: perMerchant,
		Route: func(r *http.Request) (outbound.Route, error) {
			m := r.Header.Get("X-Merchant")
			if m == "" {
				return outbound.Route{}, errors.New("request has no X-Merchant")
			}
			return outbound.Route{Key: r.URL.Host + "/" + m}, nil // the zero Policy: Options.Policy
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: tr}

	req, err := http.NewRequest(http.MethodGet, srv.URL+"/balance", nil)
	if err != nil {
		log.Fatal(err)
	}
	req.Header.Set("X-Merchant", "m-42")
	resp, err := client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	d, err := th.Peek(context.Background(), req.URL.Host+"/m-42", perMerchant)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("merchant m-42 used", d.Used, "of", d.Limit)

	req.Header.Del("X-Merchant")
	_, err = client.Do(req)
	fmt.Println(err != nil && strings.Contains(err.Error(), "outbound: Options.Route: request has no X-Merchant"))
	// Output:
	// merchant m-42 used 1 of 600
	// true
}
