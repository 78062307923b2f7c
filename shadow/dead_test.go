package shadow

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// A dead candidate costs each worker one Timeout per batch, not one per call: a hot key's calls,
// all on one worker, are accounted within Timeout × calls / Workers (the bound a candidate that
// fails every call in Timeout would meet with the keys spread evenly), and Flush returns. A
// candidate that ignores its context is abandoned at the deadline. Once the candidate answers
// again, the calls are compared. Run with -race.
func TestDeadCandidateKeepsUp(t *testing.T) {
	const (
		calls   = 200
		workers = 4
		timeout = 20 * time.Millisecond
	)
	for _, tc := range []struct {
		name string
		// dead blocks a call while the candidate is dead.
		dead func(ctx context.Context, revive <-chan struct{}) error
	}{
		{"honours its context", func(ctx context.Context, revive <-chan struct{}) error {
			select {
			case <-revive:
				return errors.New("answered after the candidate revived")
			case <-ctx.Done():
				return ctx.Err()
			}
		}},
		{"ignores its context", func(_ context.Context, revive <-chan struct{}) error {
			<-revive
			return errors.New("answered after the candidate revived")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			revive := make(chan struct{})
			var alive atomic.Bool
			var once sync.Once
			wake := func() { alive.Store(true); once.Do(func() { close(revive) }) }
			var mu sync.Mutex
			var errs []error // of the calls that timed out or were dropped
			candidate := &hooked{Backend: mem(t), before: func(ctx context.Context, _ throttler.Op, _ string) error {
				if alive.Load() {
					return nil
				}
				return tc.dead(ctx, revive)
			}}
			s, err := New(mem(t), candidate, &Options{
				Workers: workers, Timeout: timeout,
				Publish: func(r Result) {
					if r.Kinds&(Dropped|CandidateError) != 0 {
						mu.Lock()
						errs = append(errs, r.CandidateErr)
						mu.Unlock()
					}
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				wake() // an abandoned call returns before goleak looks
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			}()
			big := throttler.Policy{Name: "hot", Limit: 1 << 20, Window: time.Hour}
			for range calls {
				if _, err := s.Take(context.Background(), "hot", big, 1, t0); err != nil {
					t.Fatal(err)
				}
			}
			bound := timeout * calls / workers
			ctx, cancel := context.WithTimeout(context.Background(), bound)
			defer cancel()
			if err := s.Flush(ctx); err != nil {
				st := s.Stats()
				t.Fatalf("Flush within %v: %v; %d of %d calls accounted", bound, err, st.Results, calls)
			}
			st := s.Stats()
			timedOut, dropped := st.ByKind[CandidateError], st.ByKind[Dropped]
			if st.Results != calls || timedOut == 0 || timedOut+dropped != calls || st.Compared != 0 {
				t.Fatalf("Results %d, candidate errors %d, dropped %d, compared %d; want %d results, all timeouts or drops",
					st.Results, timedOut, dropped, st.Compared, calls)
			}
			mu.Lock()
			for _, err := range errs {
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("CandidateErr %v, want context.DeadlineExceeded", err)
					break
				}
			}
			if len(errs) != calls {
				t.Errorf("%d timeouts and drops published, want %d", len(errs), calls)
			}
			mu.Unlock()

			// The candidate answers again: the next calls are compared (an abandoned
			// call returns first, and the runner takes calls again).
			wake()
			waitFor(t, "a call compared after the candidate revived", func() bool {
				_, _ = s.Take(context.Background(), "after", big, 1, t0)
				flush(t, s)
				return s.Stats().Compared > 0
			})
		})
	}
}
