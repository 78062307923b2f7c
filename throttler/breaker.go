package throttler

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Breakers, one per store.
//
// A backend names the store that serves a call through its Traits (Store,
// LeaseStore); a backend that does not is one store. A breaker is
//
//   - closed (openUntil 0): calls reach the store. BreakerThreshold
//     consecutive store failures open it until BreakerCooldown from now.
//     Calls already in flight when a run of failures began fail with it
//     (a store's blip, or this process starved of CPU past every call's
//     deadline) and count as its first failure only: the run must go on
//     in calls started after it began.
//   - open (now < openUntil): calls skip the store.
//   - half-open (the cooldown is over): one caller wins probing and calls
//     the store; the others keep skipping it until that probe succeeds
//     (closed) or fails (open for another cooldown). A probe that ends for
//     another reason (a key's bad state, the caller's context) lets the
//     next caller probe.
//
// Time is the monotonic clock (Throttler.mono), never Options.Clock: the
// window clock may step, and a cooldown must last what it says.

// maxBreakers bounds the stores a Throttler tracks. Stores are few and fixed
// by configuration; a backend that names more (a bug, such as a name per
// key) gets its excess counted by the shared breaker rather than growing
// the map without bound.
const maxBreakers = 1024

type breaker struct {
	failures  atomic.Int64 // consecutive store failures
	runFrom   atomic.Int64 // monotonic ns of the first of them
	openUntil atomic.Int64 // monotonic ns until which the store is skipped; 0: closed
	probing   atomic.Bool  // half-open: the probe is out
}

// admit reports whether a call may reach the store, and whether it is the
// half-open breaker's probe. A closed breaker costs one atomic load.
func (b *breaker) admit(mono func() time.Duration) (ok, probe bool) {
	until := b.openUntil.Load()
	if until == 0 {
		return true, false
	}
	now := int64(mono())
	if now < until || !b.probing.CompareAndSwap(false, true) {
		return false, false
	}
	// The probe that just ended may have closed or reopened the breaker
	// between the load and the CAS: look again now that no one else can.
	switch until = b.openUntil.Load(); {
	case until == 0:
		b.probing.Store(false)
		return true, false
	case now < until:
		b.probing.Store(false)
		return false, false
	}
	return true, true
}

// succeeded records a call the store answered. Only the probe closes an
// open breaker: any other success was admitted before it opened. A closed
// breaker is written only when it has failures to forget, so that healthy
// calls on many cores do not fight over its cache line.
func (b *breaker) succeeded(probe bool) {
	if probe {
		b.failures.Store(0)
		b.openUntil.Store(0)
		b.probing.Store(false)
		return
	}
	if b.openUntil.Load() == 0 && b.failures.Load() != 0 {
		b.failures.Store(0)
	}
}

// started is when a call began, on the monotonic clock, for a breaker that
// had failures then; 0 for one that had none.
func (b *breaker) started(mono func() time.Duration) int64 {
	if b.failures.Load() == 0 {
		return 0
	}
	return int64(mono())
}

// failed records a store failure of a call that began at started (see
// started): it opens a closed breaker at the threshold, and reopens a
// half-open one for another cooldown. A call that began before the run of
// failures did adds nothing to it: when every call in flight fails at once,
// that is one event, and only calls made after it tell whether the store
// is still failing.
func (b *breaker) failed(probe bool, started int64, mono func() time.Duration, threshold int64, cooldown time.Duration) {
	now := int64(mono())
	until := max(now+int64(cooldown), 1) // 0 means closed
	if probe {
		b.openUntil.Store(until)
		b.probing.Store(false)
		return
	}
	if b.failures.Load() != 0 && started < b.runFrom.Load() {
		return
	}
	n := b.failures.Add(1)
	if n == 1 {
		b.runFrom.Store(now)
	}
	if n >= threshold {
		// Only a closed breaker opens here: the failures of calls admitted
		// before it opened do not stretch its cooldown.
		b.openUntil.CompareAndSwap(0, until)
	}
}

// inconclusive ends a call that said nothing about the store: a probe's
// turn passes to the next caller.
func (b *breaker) inconclusive(probe bool) {
	if probe {
		b.probing.Store(false)
	}
}

// breakerFor returns the breaker of store ("" is the backend's only store).
// Reads take no lock: the map is replaced, never changed, when a store is
// first seen.
func (t *Throttler) breakerFor(store string) *breaker {
	if store == "" {
		return &t.breaker
	}
	if m := t.breakers.Load(); m != nil {
		if b, ok := (*m)[store]; ok {
			return b
		}
	}
	return t.addBreaker(store)
}

func (t *Throttler) addBreaker(store string) *breaker {
	t.breakersMu.Lock()
	defer t.breakersMu.Unlock()
	var old map[string]*breaker
	if m := t.breakers.Load(); m != nil {
		old = *m
	}
	if b, ok := old[store]; ok {
		return b
	}
	if len(old) >= maxBreakers {
		return &t.breaker
	}
	m := make(map[string]*breaker, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	b := new(breaker)
	m[store] = b
	t.breakers.Store(&m)
	return b
}

// errTooManyDetached is a call refused because MaxDetached abandoned calls
// still run: a limit of this process, like a full table, and no news about
// the call's store.
var errTooManyDetached = fmt.Errorf("%w: too many calls still waiting on the backend", ErrUnavailable)

// isStoreFailure reports whether err, from a primary call whose own Timeout
// expired (timedOut) or not, is a failure of the store itself, the only
// kind that counts toward a breaker. It says yes only to what it knows:
//   - an error matching ErrUnavailable (backends mark the failures they
//     know to be their store's with StoreFailure),
//   - the Throttler's own Timeout expiring,
//   - a network error (net.Error, io.EOF, a refused, reset or broken
//     connection),
//
// and no to anything marked as one key's (ErrKeyState) and to every
// other error: bad input, a full in-process table, contention on one key.
func isStoreFailure(err error, timedOut bool) bool {
	switch {
	case errors.Is(err, ErrKeyState), errors.Is(err, errTooManyDetached):
		return false
	case errors.Is(err, ErrUnavailable):
		return true
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		// context.DeadlineExceeded is a net.Error too: only the
		// Throttler's own deadline is the store's failure.
		return timedOut && errors.Is(err, context.DeadlineExceeded)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return true
	}
	var ne net.Error
	return errors.As(err, &ne)
}

// failedStore is the store a backend named in its failure (see
// StoreFailure), or "".
func failedStore(err error) string {
	var f *storeFailure
	if errors.As(err, &f) {
		return f.store
	}
	return ""
}

// breakersState is what the Throttler needs beside its backend: the shared
// breaker, the per-store ones, and the monotonic clock.
type breakersState struct {
	breaker    breaker // the backend's only store, and any store named ""
	breakers   atomic.Pointer[map[string]*breaker]
	breakersMu sync.Mutex // serialises additions to breakers
	// mono is the monotonic time since the Throttler was built: cooldowns
	// are measured on it. Tests replace it.
	mono func() time.Duration
}
