package sleep

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Fake is a clock that sleeping moves, for tests that run waits at fixed
// instants: give its Now to a Throttler as its Clock and its Sleep to what
// waits, and a wait takes no real time. It is safe for concurrent use.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
}

// NewFake returns a Fake clock at t0.
func NewFake(t0 time.Time) *Fake { return &Fake{now: t0} }

// Now returns the clock's instant.
func (f *Fake) Now() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.now }

// Add moves the clock by d without a sleep.
func (f *Fake) Add(d time.Duration) { f.mu.Lock(); f.now = f.now.Add(d); f.mu.Unlock() }

// Set moves the clock to t, back too, without a sleep.
func (f *Fake) Set(t time.Time) { f.mu.Lock(); f.now = t; f.mu.Unlock() }

// Sleep records d and moves the clock by it, then returns ctx's error.
func (f *Fake) Sleep(ctx context.Context, d time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sleeps = append(f.sleeps, d)
	f.now = f.now.Add(d)
	return ctx.Err()
}

// Sleeps returns the sleeps so far, in order.
func (f *Fake) Sleeps() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.sleeps)
}
