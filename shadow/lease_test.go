package shadow

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/backend/backendtest"
	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/leasetest"
	"github.com/throttlekit/throttlekit/throttler"
)

var two = throttler.ConcurrencyPolicy{Name: "exports", Limit: 2, TTL: time.Minute}

// leaseHooked is hooked with leases: before runs ahead of every call, lease calls included, and may
// block or fail them.
type leaseHooked struct {
	*hooked
	leases throttler.LeaseBackend
}

func newLeaseHooked(t *testing.T, before func(ctx context.Context, op throttler.Op, key string) error) *leaseHooked {
	m := mem(t)
	return &leaseHooked{hooked: &hooked{Backend: m, before: before}, leases: m}
}

func (h *leaseHooked) Acquire(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (throttler.Decision, error) {
	if err := h.enter(ctx, throttler.OpAcquire, key, throttler.Policy{}, int64(id), now); err != nil {
		return throttler.Decision{}, err
	}
	return h.leases.Acquire(ctx, key, p, id, now)
}

func (h *leaseHooked) Release(ctx context.Context, key string, p throttler.ConcurrencyPolicy, id throttler.LeaseID, now time.Time) (bool, throttler.Decision, error) {
	if err := h.enter(ctx, throttler.OpRelease, key, throttler.Policy{}, int64(id), now); err != nil {
		return false, throttler.Decision{}, err
	}
	return h.leases.Release(ctx, key, p, id, now)
}

// results collects what Publish sees.
type results struct {
	mu  sync.Mutex
	all []Result
}

func (r *results) publish(x Result) { r.mu.Lock(); r.all = append(r.all, x); r.mu.Unlock() }

func (r *results) get() []Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Result(nil), r.all...)
}

func TestShadowLeaseConformance(t *testing.T) {
	stores := map[string][2]*memory.Backend{}
	var mu sync.Mutex
	backendtest.RunLeases(t, func(t *testing.T) backendtest.LeaseStore {
		mu.Lock()
		defer mu.Unlock()
		s, ok := stores[t.Name()]
		if !ok { // every backend of one case reaches the same stores
			s = [2]*memory.Backend{mem(t), mem(t)}
			stores[t.Name()] = s
		}
		return newShadow(t, s[0], s[1], nil)
	})
}

// Every lease call is mirrored with its LeaseID, so the candidate holds what the control holds, and
// the pairs compare.
func TestLeasesMirrored(t *testing.T) {
	ctx := context.Background()
	control, candidate := mem(t), mem(t)
	var got results
	s := newShadow(t, control, candidate, &Options{Workers: 1, Publish: got.publish})
	steps := []struct {
		acquire bool
		id      throttler.LeaseID
		allowed bool
		held    bool
	}{
		{true, 1, true, false},
		{true, 2, true, false},
		{true, 3, false, false}, // the limit is 2
		{false, 1, true, true},
		{false, 1, true, false}, // released already
		{false, 3, true, false}, // never held
	}
	for i, st := range steps {
		now := t0.Add(time.Duration(i) * time.Second)
		var d throttler.Decision
		var held bool
		var err error
		if st.acquire {
			d, err = s.Acquire(ctx, "k", two, st.id, now)
		} else {
			held, d, err = s.Release(ctx, "k", two, st.id, now)
		}
		if err != nil || d.Allowed != st.allowed || held != st.held {
			t.Fatalf("step %d: %+v held %v, %v; want allowed %v held %v", i, d, held, err, st.allowed, st.held)
		}
	}
	flush(t, s)
	rs := got.get()
	if len(rs) != len(steps) {
		t.Fatalf("%d results, want %d", len(rs), len(steps))
	}
	for i, r := range rs {
		st := steps[i]
		op := throttler.OpRelease
		if st.acquire {
			op = throttler.OpAcquire
		}
		if r.Op != op || r.Key != "k" || r.Concurrency != two || r.Lease != st.id || r.ControlHeld != st.held || r.CandidateHeld != st.held ||
			r.Kinds != 0 || r.Control != r.Candidate || r.Policy != (throttler.Policy{}) || r.Cost != 0 {
			t.Errorf("result %d: %+v", i, r)
		}
	}
	if st := s.Stats(); st.Compared != uint64(len(steps)) || st.Mismatched != 0 {
		t.Errorf("Stats: %+v", st)
	}
	now := t0.Add(time.Minute / 2)
	if c, d := leasetest.Holds(t, control, "k", two, now), leasetest.Holds(t, candidate, "k", two, now); c != 1 || d != 1 {
		t.Errorf("control holds %d leases, candidate %d; want lease 2 on both", c, d)
	}
}

// A lease the candidate grants where the control did not (it denied, or failed) is released on the
// candidate at once: nobody will release it.
func TestLeaseTheControlDidNotGrantIsUndone(t *testing.T) {
	ctx := context.Background()
	down := errors.New("connection refused")
	for _, tc := range []struct {
		name     string
		control  func(t *testing.T) *leaseHooked
		wantKind Kind
	}{
		{"control denies", func(t *testing.T) *leaseHooked {
			c := newLeaseHooked(t, nil)
			for id := range throttler.LeaseID(2) { // the control's own leases, never mirrored
				if _, err := c.Acquire(ctx, "k", two, id+100, t0); err != nil {
					t.Fatal(err)
				}
			}
			return c
		}, AllowedDiffers | UsedDiffers | ResetAtDiffers},
		{"control fails", func(t *testing.T) *leaseHooked {
			return newLeaseHooked(t, func(context.Context, throttler.Op, string) error { return down })
		}, ControlError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			candidate := mem(t)
			var got results
			s := newShadow(t, tc.control(t), candidate, &Options{Publish: got.publish})
			d, err := s.Acquire(ctx, "k", two, 1, t0.Add(time.Second))
			if d.Allowed || err != nil && !errors.Is(err, down) {
				t.Fatalf("Acquire = %+v, %v; want not granted", d, err)
			}
			flush(t, s)
			rs := got.get()
			if len(rs) != 1 || rs[0].Kinds != tc.wantKind || !rs[0].Candidate.Allowed {
				t.Fatalf("results %+v; want one, %v, the candidate granting", rs, tc.wantKind)
			}
			if n := leasetest.Holds(t, candidate, "k", two, t0.Add(time.Second)); n != 0 {
				t.Errorf("the candidate holds %d leases; want the one the control did not grant released", n)
			}
		})
	}
}

// A Release that one store held and the other did not is a difference of the leases held before the
// call, though the decisions after it agree.
func TestReleaseHeldDiffers(t *testing.T) {
	ctx := context.Background()
	control := mem(t)
	var got results
	s := newShadow(t, control, mem(t), &Options{Publish: got.publish})
	if _, err := control.Acquire(ctx, "k", two, 5, t0); err != nil { // not through the shadow
		t.Fatal(err)
	}
	held, _, err := s.Release(ctx, "k", two, 5, t0)
	if err != nil || !held {
		t.Fatalf("Release = %v, %v", held, err)
	}
	flush(t, s)
	rs := got.get()
	if len(rs) != 1 || rs[0].Kinds != UsedDiffers || !rs[0].ControlHeld || rs[0].CandidateHeld || rs[0].Control != rs[0].Candidate {
		t.Fatalf("results %+v; want one UsedDiffers from held alone", rs)
	}
}

func TestLeaseBadInputIsNotMirrored(t *testing.T) {
	ctx := context.Background()
	candidate := newLeaseHooked(t, nil)
	s := newShadow(t, mem(t), candidate, nil)
	if _, err := s.Acquire(ctx, "k", two, 0, t0); !errors.Is(err, throttler.ErrInvalidLease) {
		t.Fatalf("Acquire: %v", err)
	}
	if _, _, err := s.Release(ctx, "", two, 1, t0); !errors.Is(err, throttler.ErrInvalidKey) {
		t.Fatalf("Release: %v", err)
	}
	flush(t, s)
	if n := len(candidate.received()); n != 0 || s.Stats().Results != 0 {
		t.Fatalf("candidate got %d calls, %d results; want none", n, s.Stats().Results)
	}
}

// A shadow holds leases when its control does, and mirrors them when the candidate does too.
func TestShadowHoldsLeasesWhenItsControlDoes(t *testing.T) {
	ctx := context.Background()
	noLeases := &hooked{Backend: mem(t)} // a Backend without the lease methods

	s := newShadow(t, noLeases, mem(t), nil)
	if s.Traits().Leases {
		t.Fatal("Traits().Leases over a control without leases")
	}
	if _, err := s.Acquire(ctx, "k", two, 1, t0); !errors.Is(err, throttler.ErrLeasesUnsupported) {
		t.Fatalf("Acquire: %v", err)
	}
	if th, err := throttler.New(s, nil); err != nil || th.SupportsLeases() {
		t.Fatalf("a Throttler over it supports leases: %v", err)
	}

	s = newShadow(t, mem(t), noLeases, nil)
	if !s.Traits().Leases {
		t.Fatal("a control with leases, a candidate without: the control serves them")
	}
	if d, err := s.Acquire(ctx, "k", two, 1, t0); err != nil || !d.Allowed {
		t.Fatalf("Acquire = %+v, %v", d, err)
	}
	flush(t, s)
	if n := len(noLeases.received()); n != 0 || s.Stats().Results != 0 {
		t.Fatalf("mirrored to a candidate without leases: %d calls", n)
	}
}

// A lease call dropped by a full queue is published with its lease.
func TestDroppedLeaseCall(t *testing.T) {
	ctx := context.Background()
	g := newGate()
	var got results
	s := newShadow(t, mem(t), newLeaseHooked(t, g.before), &Options{Workers: 1, QueueSize: 1, Timeout: time.Minute, Publish: got.publish})
	_, _ = s.Take(ctx, "first", pol, 1, t0)
	<-g.arrived // the worker now holds "first"
	for id := range throttler.LeaseID(2) {
		if _, err := s.Acquire(ctx, "k", two, id+1, t0); err != nil {
			t.Fatal(err)
		}
	}
	close(g.release)
	flush(t, s)
	var dropped []Result
	for _, r := range got.get() {
		if r.Kinds == Dropped {
			dropped = append(dropped, r)
		}
	}
	if len(dropped) != 1 || dropped[0].Op != throttler.OpAcquire || dropped[0].Lease != 2 || dropped[0].Concurrency != two || !dropped[0].Control.Allowed {
		t.Fatalf("dropped %+v; want lease 2's Acquire", dropped)
	}
}
