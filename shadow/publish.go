package shadow

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// publisher is the goroutine that passes drops to Options.Publish, so that a caller never runs the
// hook. A caller that drops a call appends it to its worker's outbox (worker.outbox), under the
// lock it already holds: no lock, allocation or hook of its own on the caller's path, once the
// outbox has grown. The publisher takes each outbox whole, in rounds, and calls the hook outside
// every lock.
//
// The workers publish their comparisons themselves: they are the shadow's own goroutines already,
// and queueing every Result again would copy each one twice and hold up to Workers*QueueSize more
// of them (measured: a caller in a tight loop ran at a third of the speed).
type publisher struct {
	// Read by every caller that drops a call: kept apart from what the publisher writes on
	// every round.
	_        [64]byte
	wake     chan struct{} // capacity 1
	sleeping atomic.Bool   // parked until woken; a producer must signal wake
	_        [64]byte

	closing atomic.Bool // the outboxes are closed: one more round, then exit
	discard atomic.Bool // Close gave up draining: count, do not publish
	// discarded counts the drops taken from the outboxes but not published because Close gave
	// up draining.
	discarded atomic.Uint64
	done      chan struct{} // closed when the goroutine returns

	// Flush waits for a round that started after it was called to end.
	mu        sync.Mutex
	started   uint64 // rounds begun
	finished  uint64 // rounds ended
	roundDone chan struct{}
	exited    bool

	// spares, owned by the goroutine, hold each worker's list last published, to leave in that
	// worker's outbox next time: each worker's two lists keep their capacity.
	spares [][]call
}

func newPublisher(workers int) *publisher {
	return &publisher{wake: make(chan struct{}, 1), done: make(chan struct{}), spares: make([][]call, workers)}
}

// wakeFor says whether, and how, to wake the publisher after an outbox went from before to after
// entries. As a worker's queue wakes its worker, the first entry wakes a sleeping publisher, and
// reaching wakeLen wakes a napping one, so that a nap does not let the outbox fill.
func (p *publisher) wakeFor(before, after, wakeLen int) (wake, force bool) {
	if before < wakeLen && after >= wakeLen {
		return true, true
	}
	return before == 0 && after > 0, false
}

// signal wakes the publisher if it sleeps, or always if force: a producer pays a channel send only
// when the publisher has gone to sleep or an outbox is filling.
func (p *publisher) signal(force bool) {
	if force {
		p.sleeping.Store(false)
	} else if !p.sleeping.Load() || !p.sleeping.CompareAndSwap(true, false) {
		return
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// publishLoop is the publisher's goroutine. Like a worker, it naps between rounds unless it is
// busy, and sleeps until signalled after a few rounds that found nothing.
func (b *Backend) publishLoop() {
	p := b.pub
	defer func() {
		p.mu.Lock()
		p.exited = true
		if p.roundDone != nil {
			close(p.roundDone)
			p.roundDone = nil
		}
		p.mu.Unlock()
		close(p.done)
	}()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	naps := 0
	for {
		// Read before the round: once closing is set the outboxes take nothing more, so
		// this round then empties them for good.
		last := p.closing.Load()
		p.mu.Lock()
		p.started++
		p.mu.Unlock()
		n := 0
		for i, w := range b.workers {
			n += b.deliver(w, &p.spares[i])
		}
		p.mu.Lock()
		p.finished++
		if p.roundDone != nil {
			close(p.roundDone)
			p.roundDone = nil
		}
		p.mu.Unlock()
		switch {
		case last:
			return
		case n >= b.wakeLen:
			naps = 0
			continue
		case n > 0:
			// A few drops: nap before the next round rather than take every worker's
			// lock again for the next few, which would move those locks' cache lines
			// away from the callers on every drop. A filling outbox cuts the nap short.
			naps = 0
		default:
			naps++
		}
		if naps <= maxNaps {
			timer.Reset(nap)
			select {
			case <-p.wake:
				timer.Stop()
			case <-timer.C:
			}
			continue
		}
		// Set sleeping, then look once more: a producer that appended before it could see
		// the flag is found here; one that appends after sees the flag and signals.
		p.sleeping.Store(true)
		if b.outboxesEmpty() && !p.closing.Load() {
			<-p.wake
		}
		p.sleeping.Store(false)
	}
}

// deliver publishes the drops waiting in w's outbox, leaving spare there in their place, and
// returns how many it took.
func (b *Backend) deliver(w *worker, spare *[]call) int {
	p := b.pub
	w.mu.Lock()
	list := w.outbox
	if len(list) == 0 {
		w.mu.Unlock()
		return 0
	}
	w.outbox = (*spare)[:0]
	w.mu.Unlock()
	for i := range list {
		if p.discard.Load() {
			p.discarded.Add(uint64(len(list) - i))
			break
		}
		c := &list[i]
		r := c.result()
		r.Kinds = Dropped
		b.publish(&r)
	}
	// The entries are not cleared: the list is reused, and holds at most QueueSize keys alive
	// meanwhile.
	*spare = list
	return len(list)
}

func (b *Backend) outboxesEmpty() bool {
	for _, w := range b.workers {
		w.mu.Lock()
		n := len(w.outbox)
		w.mu.Unlock()
		if n > 0 {
			return false
		}
	}
	return true
}

// publish hands r to Options.Publish, recovering and counting a panic: a broken hook must not take
// down a worker or the publisher.
func (b *Backend) publish(r *Result) {
	defer func() {
		if recover() != nil {
			b.publishPanics.Add(1)
		}
	}()
	b.opts.Publish(*r)
}

// flush waits until a round that began after it was called has ended: that round took every drop
// queued before.
func (p *publisher) flush(ctx context.Context) error {
	p.mu.Lock()
	target := p.started + 1
	for p.finished < target {
		if p.exited {
			p.mu.Unlock()
			return errClosed
		}
		ch := p.roundDone
		if ch == nil {
			ch = make(chan struct{})
			p.roundDone = ch
		}
		p.mu.Unlock()
		p.signal(true)
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("shadow: flush: %w", ctx.Err())
		}
		p.mu.Lock()
	}
	p.mu.Unlock()
	return nil
}

// stopPublishing closes the outboxes, so that a drop from now on is counted in PublishDropped at
// once, and tells the publisher to empty them and return.
func (b *Backend) stopPublishing() {
	p := b.pub
	if p == nil {
		return
	}
	for _, w := range b.workers {
		w.mu.Lock()
		w.outboxClosed = true
		w.mu.Unlock()
	}
	p.closing.Store(true)
	p.signal(true)
}
