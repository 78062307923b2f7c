package shadow_test

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/shadow"
	"github.com/throttlekit/throttlekit/throttler"
)

// The old store serves; the new one receives every call and is compared. Here the new store has
// lost the first window (as an evicting Memcached would), so its decisions diverge and the shadow
// says how.
func Example() {
	ctx := context.Background()
	p := throttler.Policy{Name: "api", Limit: 2, Window: time.Minute}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

	old, err := memory.New(nil)
	if err != nil {
		panic(err)
	}
	candidate, err := memory.New(nil)
	if err != nil {
		panic(err)
	}
	_, _ = old.Take(ctx, "alice", p, 2, t0) // only the old store saw these

	// Publish runs on the shadow's own goroutine; hand results over to the metrics or, here, to
	// the printing below.
	results := make(chan shadow.Result, 16)
	s, err := shadow.New(old, candidate, &shadow.Options{Publish: func(r shadow.Result) { results <- r }})
	if err != nil {
		panic(err)
	}
	defer s.Close()

	d, err := s.Take(ctx, "alice", p, 1, t0.Add(time.Second))
	fmt.Println("caller gets:", d.Allowed, d.Remaining, err)

	_ = s.Flush(ctx) // wait for the comparison
	r := <-results
	fmt.Printf("%s %s: control allowed=%v used=%d, candidate allowed=%v used=%d\n",
		r.Op, r.Key, r.Control.Allowed, r.Control.Used, r.Candidate.Allowed, r.Candidate.Used)
	fmt.Printf("mismatch %v: %v\n", r.Mismatch(), r.Kinds)
	st := s.Stats()
	fmt.Printf("compared %d, mismatched %d, allowed differs %d\n",
		st.Compared, st.Mismatched, st.ByKind[shadow.AllowedDiffers])
	// Output:
	// caller gets: false 0 <nil>
	// take alice: control allowed=false used=2, candidate allowed=true used=1
	// mismatch true: allowed|used|reset_at
	// compared 1, mismatched 1, allowed differs 1
}
