package throttler_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// routing is a backend whose Traits.Route sends every call to to, named
// store; its own methods fail: a Throttler that calls them skipped Route.
// It is comparable, as Route's check of the backend held needs.
type routing struct {
	plain
	store string
	to    throttler.Backend
}

var errCalledDirectly = errors.New("called directly, not through Route")

func (routing) Take(context.Context, string, throttler.Policy, int64, time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, errCalledDirectly
}

func (b routing) Traits() throttler.Traits {
	return throttler.Traits{
		InProcess: true,
		Store:     func(throttler.Op, string, throttler.Policy) string { return "not " + b.store },
		Route: func(self throttler.Backend, _ throttler.Op, _ string, _ throttler.Policy) (string, throttler.Backend) {
			if self != throttler.Backend(b) {
				return b.store, nil
			}
			return b.store, b.to
		},
	}
}

// counting counts its Takes and answers with err.
type counting struct {
	plain
	takes int
	err   error
}

func (c *counting) Take(context.Context, string, throttler.Policy, int64, time.Time) (throttler.Decision, error) {
	c.takes++
	return throttler.Decision{Allowed: c.err == nil}, c.err
}

// A Throttler over a backend with Route names the call's store and makes
// the call from Route's one answer; the fallback answers a failure of the
// routed backend, never that backend again; a wrapper that embeds the
// router, promoting its Traits, is never skipped.
func TestTraitsRoute(t *testing.T) {
	ctx, p := context.Background(), throttler.PerMinute(5)
	t0 := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	to := &counting{}
	var last throttler.Observation
	th, err := throttler.New(routing{store: "shard 2", to: to}, &throttler.Options{Clock: func() time.Time { return t0 },
		Observe: func(o throttler.Observation) { last = o }})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := th.Allow(ctx, "k", p); err != nil || !d.Allowed || to.takes != 1 || last.Store != "shard 2" {
		t.Fatalf("Allow = %+v, %v; routed takes %d, store %q; want allowed, 1, \"shard 2\"", d, err, to.takes, last.Store)
	}

	down := &counting{err: throttler.StoreFailure("", errors.New("connection refused"))}
	fallback := &counting{}
	th, err = throttler.New(routing{store: "shard 2", to: down}, &throttler.Options{Clock: func() time.Time { return t0 }, Fallback: fallback})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := th.Allow(ctx, "k", p); err != nil || !d.Degraded || down.takes != 1 || fallback.takes != 1 {
		t.Fatalf("Allow = %+v, %v; routed takes %d, fallback takes %d; want the fallback's, once each", d, err, down.takes, fallback.takes)
	}

	// A wrapper that embeds the router gets its calls: Route only names.
	w := &stamping{routing: routing{store: "shard 2", to: to}}
	th, err = throttler.New(w, &throttler.Options{Clock: func() time.Time { return t0 },
		Observe: func(o throttler.Observation) { last = o }})
	if err != nil {
		t.Fatal(err)
	}
	before := to.takes
	if _, err := th.Allow(ctx, "k", p); err != nil || w.takes != 1 || to.takes != before || last.Store != "shard 2" {
		t.Fatalf("through a wrapper: err %v, wrapper takes %d, routed takes %d, store %q; want the wrapper's call", err, w.takes, to.takes-before, last.Store)
	}
}

// stamping embeds a routing backend, promoting its Traits, and makes its
// own Takes.
type stamping struct {
	routing
	takes int
}

func (s *stamping) Take(context.Context, string, throttler.Policy, int64, time.Time) (throttler.Decision, error) {
	s.takes++
	return throttler.Decision{Allowed: true}, nil
}
