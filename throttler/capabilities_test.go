package throttler_test

import (
	"context"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

// plain is a backend without Traits or lease methods.
type plain struct{}

func (plain) Take(context.Context, string, throttler.Policy, int64, time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, nil
}
func (plain) Peek(context.Context, string, throttler.Policy, time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, nil
}
func (plain) Refund(context.Context, string, throttler.Policy, int64, time.Time, time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, nil
}

// plainLeases has the lease methods and no Traits.
type plainLeases struct{ plain }

func (plainLeases) Acquire(context.Context, string, throttler.ConcurrencyPolicy, throttler.LeaseID, time.Time) (throttler.Decision, error) {
	return throttler.Decision{Allowed: true}, nil
}
func (plainLeases) Release(context.Context, string, throttler.ConcurrencyPolicy, throttler.LeaseID, time.Time) (bool, throttler.Decision, error) {
	return true, throttler.Decision{}, nil
}

// declared says its traits.
type declared struct {
	plain
	t throttler.Traits
}

func (d declared) Traits() throttler.Traits { return d.t }

// declaredLeases says its traits and has the lease methods.
type declaredLeases struct {
	plainLeases
	t throttler.Traits
}

func (d declaredLeases) Traits() throttler.Traits { return d.t }

func TestTraitsOf(t *testing.T) {
	mem, err := memory.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	named := func(op throttler.Op, key string, _ throttler.Policy) string {
		if op == throttler.OpPeek {
			return "replicas of " + key
		}
		return "store of " + key
	}
	leaseNamed := func(key string, _ throttler.ConcurrencyPolicy) string { return "leases of " + key }
	tests := []struct {
		name                     string
		b                        throttler.Backend
		inProcess, blind, leases bool
		take, peek, lease        string
	}{
		{name: "the memory backend", b: mem, inProcess: true, leases: true},
		{name: "a backend without Traits", b: plain{}},
		{name: "lease methods without Traits hold leases", b: plainLeases{}, leases: true},
		{name: "a wrapper over a backend without leases", b: declaredLeases{t: throttler.Traits{}}},
		{name: "Leases without the methods is not believed", b: declared{t: throttler.Traits{Leases: true}}},
		{name: "everything declared", b: declaredLeases{t: throttler.Traits{InProcess: true, IgnoresContext: true, Leases: true, Store: named, LeaseStore: leaseNamed}},
			inProcess: true, blind: true, leases: true, take: "store of k", peek: "replicas of k", lease: "leases of k"},
	}
	p, cp := throttler.PerMinute(1), throttler.Concurrent(3, time.Second)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := throttler.TraitsOf(tc.b)
			if got.InProcess != tc.inProcess || got.IgnoresContext != tc.blind || got.Leases != tc.leases {
				t.Errorf("InProcess %v IgnoresContext %v Leases %v; want %v %v %v",
					got.InProcess, got.IgnoresContext, got.Leases, tc.inProcess, tc.blind, tc.leases)
			}
			if s := got.Store(throttler.OpTake, "k", p); s != tc.take {
				t.Errorf("Store(take) = %q, want %q", s, tc.take)
			}
			if s := got.Store(throttler.OpPeek, "k", p); s != tc.peek {
				t.Errorf("Store(peek) = %q, want %q", s, tc.peek)
			}
			if s := got.LeaseStore("k", cp); s != tc.lease {
				t.Errorf("LeaseStore = %q, want %q", s, tc.lease)
			}
			th, err := throttler.New(tc.b, nil)
			if err != nil {
				t.Fatal(err)
			}
			if th.SupportsLeases() != tc.leases {
				t.Errorf("SupportsLeases %v: the Throttler decides apart from TraitsOf", th.SupportsLeases())
			}
		})
	}
}
