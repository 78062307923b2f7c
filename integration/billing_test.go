package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/throttlekit/throttlekit/outbound"
	"github.com/throttlekit/throttlekit/throttler"
)

// Billing day: the workers of a payment service call a gateway
// that allows billingN calls per window and answers 429 beyond, through
// outbound Transports sharing one Redis. Each client stands for a process:
// its own Redis client, backend, Throttler, Transport and connections.
//
// The clock: the gateway counts arrivals on its own clock, the limiter
// admissions on the Throttler's (both the machine's here). A call admitted
// at a reaches the gateway at a+δ: the rest of the Redis call that admitted
// it, a Redis round trip to peek for a pause, the HTTP call. So the
// limiter's window is the gateway's plus billingMargin, which must exceed
// δ: a gateway window then never holds more calls than a limiter window
// admitted. The margin costs margin/window of the throughput, so the window
// is long enough for the margin to be small (a real gateway's window is a
// minute, where a margin of a second or two costs a few percent). δ is a
// few milliseconds on a quiet machine; on a shared 2-core machine under
// -race a burst of calls queues for the CPU and δ has been seen above
// 700ms: a run whose δ exceeded the margin cannot prove the gateway's
// count, and says so instead of failing (the limiter's own count, checked
// on the admission instants, must still hold).
const (
	billingN       = 200              // the gateway's calls per window
	billingWindow  = 10 * time.Second // the gateway's window, on its own clock
	billingMargin  = 600 * time.Millisecond
	billingClients = 8
	billingWorkers = 16 // per client
	// billingBurst is the token bucket's capacity: what it holds can go at
	// once, so the refill leaves room for it in every window.
	billingBurst = 2
	// billingPauseName is the Transports' default PauseName.
	billingPauseName = "outbound-pause"
)

// billingTrace follows one request through its Transport: the instant
// (the Throttler's now) of the Take that admitted it and of its last peek
// for a pause. It travels in the request's context, which reaches the
// backend.
type billingTrace struct{ admitted, peeked atomic.Int64 }

type billingTraceKey struct{}

func billingTraceOf(ctx context.Context) *billingTrace {
	tr, _ := ctx.Value(billingTraceKey{}).(*billingTrace)
	return tr
}

// billingLedger is every admission of a fleet, from the backends' view:
// the now of each Take of the rate policy that admitted, less the ones
// refunded.
type billingLedger struct {
	policy string
	mu     sync.Mutex
	at     []time.Time
	flight time.Duration // the longest from an admitted Take's now to its answer
}

func (l *billingLedger) add(at time.Time, flight time.Duration) {
	l.mu.Lock()
	l.at = append(l.at, at)
	l.flight = max(l.flight, flight)
	l.mu.Unlock()
}

// remove takes back one admission as the store's Refund does: a fixed
// window or a bucket counts no instants, and a sliding log removes its
// newest live unit (logged after now less the window) logged no later than
// by (the refund's receipt less the window), which need not be the
// refunding request's own (another request may have been admitted at the
// same instant or, from a clock behind, an earlier one since). The store
// compares whole milliseconds, so the ledger does too: compared to the
// nanosecond, an admission later in by's millisecond than by itself (every
// one, by is a whole millisecond) was passed over for an older one, and
// the ledger kept an instant the store no longer counted; the check below
// then saw N+1 admissions in a window that the store never held (fresh-clone
// CI runs: 201 in 10.5977 s and in 10.5983 s). by is zero for the other
// algorithms.
func (l *billingLedger) remove(own, by, now time.Time, window time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := slices.IndexFunc(l.at, own.Equal)
	if !by.IsZero() {
		i = -1
		for j, at := range l.at {
			ms := at.UnixMilli()
			live := ms > now.UnixMilli()-window.Milliseconds()
			if live && ms <= by.UnixMilli() && (i < 0 || at.After(l.at[i])) {
				i = j
			}
		}
	}
	if i >= 0 {
		l.at = slices.Delete(l.at, i, i+1)
	}
}

// sorted returns the admissions, oldest first, and the longest flight.
func (l *billingLedger) sorted() ([]time.Time, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Clone(l.at)
	slices.SortFunc(out, time.Time.Compare)
	return out, l.flight
}

// billingStore is a client's Redis backend, recording admissions in the
// fleet's ledger and in each request's trace.
type billingStore struct {
	throttler.Backend
	ledger *billingLedger
}

func (s billingStore) Take(ctx context.Context, key string, p throttler.Policy, cost int64, now time.Time) (throttler.Decision, error) {
	d, err := s.Backend.Take(ctx, key, p, cost, now)
	if err == nil && d.Allowed && p.Name == s.ledger.policy {
		s.ledger.add(now, time.Since(now)) // the Throttler's clock is time.Now
		if tr := billingTraceOf(ctx); tr != nil {
			tr.admitted.Store(now.UnixNano())
		}
	}
	return d, err
}

func (s billingStore) Peek(ctx context.Context, key string, p throttler.Policy, now time.Time) (throttler.Decision, error) {
	if tr := billingTraceOf(ctx); tr != nil && p.Name == billingPauseName {
		tr.peeked.Store(now.UnixNano())
	}
	return s.Backend.Peek(ctx, key, p, now)
}

func (s billingStore) Refund(ctx context.Context, key string, p throttler.Policy, cost int64, receipt, now time.Time) (throttler.Decision, error) {
	d, err := s.Backend.Refund(ctx, key, p, cost, receipt, now)
	if tr := billingTraceOf(ctx); err == nil && tr != nil && p.Name == s.ledger.policy {
		var by time.Time
		if p.Algorithm == throttler.SlidingLog {
			by = receipt.Add(-p.Window)
		}
		s.ledger.remove(time.Unix(0, tr.admitted.Load()), by, now, p.Window)
	}
	return d, err
}

// billingGateway allows limit calls in any window by its own clock (a
// sliding log of the calls it accepted: the strictest reading of "N per
// window", so a limiter that satisfies it satisfies any windowing), and
// refuses the rest with 429 and Retry-After. Lowered, it refuses every
// call until an instant.
type billingGateway struct {
	limit  int
	window time.Duration

	mu          sync.Mutex
	accepted    []time.Time // in the last window, oldest first
	closedUntil time.Time   // refuse everything before it
	arrivals    []billingArrival
}

type billingArrival struct {
	at       time.Time
	worker   string
	status   int
	admitted time.Time // when the limiter admitted the call
	peeked   time.Time // when its Transport last peeked for a pause
}

func (g *billingGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/warm-up" {
		return // opens a connection, counts nothing
	}
	unix := func(h string) time.Time {
		n, _ := strconv.ParseInt(r.Header.Get(h), 10, 64)
		return time.Unix(0, n)
	}
	g.mu.Lock()
	now := time.Now() // under the lock: arrivals are ordered by their time
	a := billingArrival{at: now, worker: r.Header.Get("X-Worker"), status: http.StatusOK,
		admitted: unix("X-Admitted"), peeked: unix("X-Peeked")}
	var retryAt time.Time
	for len(g.accepted) > 0 && now.Sub(g.accepted[0]) >= g.window {
		g.accepted = g.accepted[1:]
	}
	switch {
	case now.Before(g.closedUntil):
		a.status, retryAt = http.StatusTooManyRequests, g.closedUntil
	case len(g.accepted) >= g.limit:
		a.status, retryAt = http.StatusTooManyRequests, g.accepted[0].Add(g.window)
	default:
		g.accepted = append(g.accepted, now)
	}
	g.arrivals = append(g.arrivals, a)
	g.mu.Unlock()
	if a.status != http.StatusOK {
		// Whole seconds, rounded up: never earlier than the gateway means.
		w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(retryAt.Sub(now).Seconds())), 10))
		http.Error(w, "rate limit exceeded", a.status)
		return
	}
	io.WriteString(w, "charged")
}

// lower makes the gateway refuse every call from now until until.
func (g *billingGateway) lower(until time.Time) {
	g.mu.Lock()
	g.closedUntil = until
	g.mu.Unlock()
}

func (g *billingGateway) Arrivals() []billingArrival {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.arrivals)
}

// traced tells the gateway, in headers, what the request's trace holds.
type traced struct{ base http.RoundTripper }

func (s traced) RoundTrip(r *http.Request) (*http.Response, error) {
	if tr := billingTraceOf(r.Context()); tr != nil {
		r = r.Clone(r.Context())
		r.Header.Set("X-Admitted", strconv.FormatInt(tr.admitted.Load(), 10))
		r.Header.Set("X-Peeked", strconv.FormatInt(tr.peeked.Load(), 10))
	}
	return s.base.RoundTrip(r)
}

// billingProcess is one client of the gateway: its limited client, and the
// connections under it.
type billingProcess struct {
	client *http.Client
	base   *http.Transport
}

// billingFleet builds n clients, each as a process of its own would: a
// Redis client, a backend, a Throttler failing closed (a remote limit must
// hold while the store is down) and a Transport with o.
func billingFleet(t *testing.T, addr string, n int, o outbound.Options, ledger *billingLedger, calls *billingCalls) []billingProcess {
	t.Helper()
	clients := make([]billingProcess, n)
	for i := range clients {
		store := billingStore{Backend: redisNew(t, redisClient(t, addr), nil), ledger: ledger}
		th, err := throttler.New(store, &throttler.Options{
			FailClosed: true,
			Timeout:    3 * time.Second, // a shared 2-core machine under -race
			Observe:    calls.observe,
		})
		require.NoError(t, err)
		base := &http.Transport{MaxIdleConnsPerHost: billingWorkers}
		t.Cleanup(base.CloseIdleConnections)
		o := o
		o.Base = traced{base}
		tr, err := outbound.New(th, &o)
		require.NoError(t, err)
		clients[i] = billingProcess{client: &http.Client{Transport: tr}, base: base}
	}
	return clients
}

// billingWarmUp opens each client's connections to the gateway, as a
// service running before billing day has them, outside the limit.
func billingWarmUp(t *testing.T, clients []billingProcess, url string) {
	t.Helper()
	var wg sync.WaitGroup
	for _, c := range clients {
		for range billingWorkers {
			wg.Go(func() {
				req, err := http.NewRequest(http.MethodGet, url+"/warm-up", nil)
				if err != nil {
					panic(err)
				}
				resp, err := c.base.RoundTrip(req)
				if assert.NoError(t, err) {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		}
	}
	wg.Wait()
}

// billingCalls counts the store calls of a fleet, by operation, and
// keeps their latencies.
type billingCalls struct {
	take, peek, refund atomic.Int64
	mu                 sync.Mutex
	latency            []time.Duration
}

func (c *billingCalls) observe(o throttler.Observation) {
	c.mu.Lock()
	c.latency = append(c.latency, o.Latency)
	c.mu.Unlock()
	switch o.Op {
	case throttler.OpTake:
		c.take.Add(1)
	case throttler.OpPeek:
		c.peek.Add(1)
	case throttler.OpRefund:
		c.refund.Add(1)
	}
}

func (c *billingCalls) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.latency
	if len(l) == 0 {
		return "none"
	}
	slices.Sort(l)
	return fmt.Sprintf("%d takes, %d peeks, %d refunds (latency p50 %v, p99 %v)", c.take.Load(), c.peek.Load(), c.refund.Load(),
		l[len(l)/2].Round(time.Microsecond), l[len(l)*99/100].Round(time.Microsecond))
}

// billingCounts is what the workers of a run saw.
type billingCounts struct {
	sent, ok atomic.Int64
	deadline atomic.Int64 // waits that would have outlasted the run
	// unavailable counts the calls refused because a store call failed or
	// timed out (the Throttlers fail closed); the worker tries again.
	unavailable atomic.Int64
	errs        sync.Map // unexpected error text -> count
}

func (c *billingCounts) unexpected() []string {
	var out []string
	c.errs.Range(func(k, v any) bool {
		out = append(out, fmt.Sprintf("%v (x%d)", k, v.(*atomic.Int64).Load()))
		return true
	})
	return out
}

// billingPush runs workers per client, each sending payments one after
// another, as fast as its Transport lets it, until ctx ends.
func billingPush(ctx context.Context, clients []billingProcess, url string, workers int) *billingCounts {
	var c billingCounts
	var wg sync.WaitGroup
	for ci, client := range clients {
		for wi := range workers {
			worker := fmt.Sprintf("%d/%d", ci, wi)
			wg.Go(func() {
				for i := 0; ctx.Err() == nil; i++ {
					rctx := context.WithValue(ctx, billingTraceKey{}, &billingTrace{})
					req, err := http.NewRequestWithContext(rctx, http.MethodPost, url, strings.NewReader("amount=1000&currency=sgd"))
					if err != nil {
						panic(err)
					}
					req.Header.Set("X-Worker", worker)
					req.Header.Set("Idempotency-Key", fmt.Sprintf("%s/%d", worker, i))
					resp, err := client.client.Do(req)
					switch {
					case err == nil:
						c.sent.Add(1)
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode == http.StatusOK {
							c.ok.Add(1)
						}
					case errors.Is(err, throttler.ErrWouldExceedDeadline):
						c.deadline.Add(1)
						return // the run ends before this worker could send again
					case ctx.Err() != nil:
						return
					case errors.Is(err, throttler.ErrUnavailable):
						c.unavailable.Add(1)
						// As a real worker would, try again a little later:
						// while the Throttler's breaker is open, the call
						// fails at once.
						select {
						case <-ctx.Done():
						case <-time.After(50 * time.Millisecond):
						}
					default:
						n, _ := c.errs.LoadOrStore(err.Error(), new(atomic.Int64))
						n.(*atomic.Int64).Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	return &c
}

// billingAddr is where the clients reach rc: its address on Docker's
// network when the host reaches it, which skips the userland proxy of the
// published port (under load it added tens of milliseconds to a call,
// all of it on δ); else its published port.
func billingAddr(rc *redisContainer) string {
	direct := net.JoinHostPort(rc.IP, "6379")
	if c, err := net.DialTimeout("tcp", direct, time.Second); err == nil {
		c.Close()
		return direct
	}
	return rc.Addr
}

func TestBillingDay(t *testing.T) {
	rc := redisStart(t)
	addr := billingAddr(rc)
	t.Logf("Redis at %s", addr)
	limiterWindow := billingWindow + billingMargin
	for _, tc := range []struct {
		name string
		p    throttler.Policy
		run  time.Duration
		// The rate is measured as k calls per the mean time the gateway
		// took to see k more, after the first skip (a bucket's first
		// burst). A log admits N at once, then each slot again a limiter
		// window later: k = N, and the run must see its second round.
		k, skip int
		// ideal is the rate the policy allows, as a share of N per window.
		ideal float64
	}{
		// At most Burst + Limit in any limiter window, so Limit = N - Burst.
		{"token-bucket", throttler.Policy{Name: "billing-tb", Limit: billingN - billingBurst, Window: limiterWindow,
			Algorithm: throttler.TokenBucket, Burst: billingBurst}, 6 * time.Second, billingN / 4, billingBurst,
			float64(billingN-billingBurst) / billingN * float64(billingWindow) / float64(limiterWindow)},
		{"sliding-log", throttler.Policy{Name: "billing-log", Limit: billingN, Window: limiterWindow,
			Algorithm: throttler.SlidingLog}, limiterWindow + 1500*time.Millisecond, billingN, 0,
			float64(billingWindow) / float64(limiterWindow)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gw := &billingGateway{limit: billingN, window: billingWindow}
			srv := httptest.NewServer(gw)
			defer srv.Close()
			ledger := &billingLedger{policy: tc.p.Name}
			var calls billingCalls
			clients := billingFleet(t, addr, billingClients, outbound.Options{Policy: tc.p}, ledger, &calls)
			billingWarmUp(t, clients, srv.URL)

			ctx, cancel := context.WithTimeout(context.Background(), tc.run)
			defer cancel()
			c := billingPush(ctx, clients, srv.URL+"/charges", billingWorkers)
			assert.Empty(t, c.unexpected(), "unexpected errors")

			// The limiter's own count, on the instants it admitted at:
			// never more than N in a limiter window, less what the store
			// cannot see: the ms its instants are truncated to, and how
			// far out of order calls reach it. A Take stamped t that
			// reaches the store after one stamped t' > t finds the units
			// that ended by t' dropped (a sliding log's admitted Take
			// drops them), so it may be admitted beside them within t'-t
			// of their end; t'-t is under its own flight, from its now to
			// its answer (a CI run: 201 in 10.598 s of a 10.6 s window,
			// with no refund at all).
			admitted, flight := ledger.sorted()
			for i := 0; i+billingN < len(admitted); i++ {
				if span := admitted[i+billingN].Sub(admitted[i]); span < limiterWindow-time.Millisecond-flight {
					t.Fatalf("the limiter admitted %d calls in %v, within its window of %v less the longest flight %v",
						billingN+1, span, limiterWindow, flight)
				}
			}
			t.Logf("longest flight of an admitted Take: %v", flight)

			arrivals := gw.Arrivals()
			var accepted []time.Time
			var delays []time.Duration
			for _, a := range arrivals {
				if a.status == http.StatusOK {
					accepted = append(accepted, a.at)
				}
				delays = append(delays, a.at.Sub(a.admitted))
			}
			refused := len(arrivals) - len(accepted)
			require.Greater(t, len(accepted), tc.skip+tc.k, "too few calls to measure a rate")
			var gaps time.Duration
			n := 0
			for i := tc.skip; i+tc.k < len(accepted); i++ {
				gaps += accepted[i+tc.k].Sub(accepted[i])
				n++
			}
			meanGap := gaps / time.Duration(n)
			rate := float64(tc.k) / float64(billingN) * float64(billingWindow) / float64(meanGap)
			slices.Sort(delays)
			worst := delays[len(delays)-1]
			t.Logf("%s: %d clients x %d workers for %v; the gateway (N=%d per %v) saw %d calls, refused %d; achieved rate %.1f%% of N (%d calls every %v; the policy's ideal %.1f%%); store calls %v, %d refused by a failing store; admission to arrival p50 %v, p99 %v, max %v (margin %v)",
				tc.name, billingClients, billingWorkers, tc.run, billingN, billingWindow, len(arrivals), refused,
				100*rate, tc.k, meanGap.Round(time.Millisecond), 100*tc.ideal, &calls, c.unavailable.Load(),
				delays[len(delays)/2].Round(time.Microsecond), delays[len(delays)*99/100].Round(time.Microsecond), worst.Round(time.Microsecond), billingMargin)
			if refused > 0 && worst > billingMargin {
				t.Skipf("inconclusive: a call reached the gateway %v after it was admitted, more than the margin of %v: this machine is too loaded to prove the gateway's count", worst, billingMargin)
			}
			assert.Zero(t, refused, "the gateway refused calls: more than N reached it in one of its windows")
			assert.GreaterOrEqual(t, rate, 0.9, "the achieved rate is under 90%% of N")
		})
	}

	t.Run("gateway-pause", func(t *testing.T) {
		billingTestPause(t, addr)
	})
	t.Run("deadlines", func(t *testing.T) {
		billingTestDeadlines(t, addr)
	})
}

// billingTestPause: the gateway's limit is lowered; it answers 429 with
// Retry-After until an instant. The first client told records the pause in
// Redis; from then on, no worker of any client calls before that instant.
func billingTestPause(t *testing.T, addr string) {
	const (
		workers = 8
		lowerAt = time.Second     // after the start
		closed  = 2 * time.Second // how long the gateway refuses
		run     = lowerAt + closed + time.Second
	)
	gw := &billingGateway{limit: 10_000, window: billingWindow}
	srv := httptest.NewServer(gw)
	defer srv.Close()
	var recordedMu sync.Mutex
	var recorded time.Time // when the first pause was in Redis
	ledger := &billingLedger{policy: "billing-pause"}
	var calls billingCalls
	clients := billingFleet(t, addr, billingClients, outbound.Options{
		Policy:  throttler.PerSecond(200).Named("billing-pause").WithBurst(20),
		Retries: 1, // the refused payment is sent again after the pause
		OnPause: func(p outbound.Pause) {
			now := time.Now() // after the Take that stored it returned
			recordedMu.Lock()
			if p.Err == nil && recorded.IsZero() {
				recorded = now
			}
			recordedMu.Unlock()
		},
	}, ledger, &calls)
	billingWarmUp(t, clients, srv.URL)

	start := time.Now()
	until := start.Add(lowerAt + closed)
	time.AfterFunc(lowerAt, func() { gw.lower(until) })
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(run))
	defer cancel()
	c := billingPush(ctx, clients, srv.URL+"/charges", workers)
	assert.Empty(t, c.unexpected(), "unexpected errors")

	recordedMu.Lock()
	defer recordedMu.Unlock()
	require.False(t, recorded.IsZero(), "no pause was recorded")
	var first429, last429, resumed time.Time
	refused := 0
	refusedBy := map[string]int{}
	var ignored []billingArrival
	for _, a := range gw.Arrivals() {
		if a.status == http.StatusTooManyRequests {
			if first429.IsZero() {
				first429 = a.at
			}
			last429 = a.at
			refused++
			refusedBy[a.worker]++
			// Its Transport peeked for a pause after the pause was stored:
			// it must have seen it.
			if a.peeked.After(recorded) {
				ignored = append(ignored, a)
			}
		}
		if !a.at.Before(until) && resumed.IsZero() {
			resumed = a.at
		}
	}
	require.False(t, first429.IsZero(), "the gateway never refused")
	t.Logf("gateway closed for %v, 8 clients x %d workers: %d calls refused, from %d workers; the pause was in Redis %v after the first 429 arrived; the last refused call (checked before that) arrived %v after it; the first call after the Retry-After instant arrived %v after it; store calls %v, %d refused by a failing store",
		closed, workers, refused, len(refusedBy), recorded.Sub(first429).Round(time.Microsecond),
		last429.Sub(recorded).Round(time.Microsecond), resumed.Sub(until).Round(time.Microsecond), &calls, c.unavailable.Load())
	for w, n := range refusedBy {
		assert.Equal(t, 1, n, "worker %s was refused %d times: it sent again during the pause", w, n)
	}
	assert.Empty(t, ignored, "calls sent during the pause by Transports that checked after it was stored")
	require.False(t, resumed.IsZero(), "no call after the pause")
	assert.Greater(t, c.ok.Load(), int64(0))
}

// billingTestDeadlines: Waits on Redis whose contexts end first return
// within a small bound, and leave no goroutine behind.
func billingTestDeadlines(t *testing.T, addr string) {
	const bound = 250 * time.Millisecond // scheduling under -race on a busy machine
	leaks := faultLeaks()
	rcl := redisClient(t, addr)
	th, err := throttler.New(redisNew(t, rcl, nil), &throttler.Options{FailClosed: true, Timeout: 3 * time.Second})
	require.NoError(t, err)
	p := throttler.PerMinute(1).Named("billing-deadline")
	ctx := context.Background()
	_, err = th.Allow(ctx, "gw", p)
	require.NoError(t, err)

	// A deadline before the earliest admission: at once.
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	start := time.Now()
	_, err = th.Wait(dctx, "gw", p)
	cancel()
	require.ErrorIs(t, err, throttler.ErrWouldExceedDeadline)
	assert.Less(t, time.Since(start), bound)

	// Many waiters, one sleeping and the rest queued, canceled together.
	const waiters = 16
	cctx, cancelAll := context.WithCancel(ctx)
	errs := make(chan error, waiters)
	for range waiters {
		go func() { _, err := th.Wait(cctx, "gw", p); errs <- err }()
	}
	// Let them reach their wait (the head asleep, the rest queued); the
	// bound below holds whatever state each one is in.
	time.Sleep(200 * time.Millisecond)
	require.Empty(t, errs, "a waiter returned before its context ended")
	canceled := time.Now()
	cancelAll()
	var worst time.Duration
	for range waiters {
		require.ErrorIs(t, <-errs, context.Canceled)
		worst = max(worst, time.Since(canceled))
	}
	t.Logf("%d waiters on Redis returned at most %v after their cancellation", waiters, worst)
	assert.Less(t, worst, bound)
	require.NoError(t, rcl.Close())
	goleak.VerifyNone(t, leaks...)
}
