package memory_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

// What each algorithm admits around a window boundary, at 10 per minute,
// to a client that sends a request at 0:00, then 10 at 0:59, 10 at 1:01
// and 10 at 1:30; each cell is how many were admitted. The output is the
// table in docs/algorithms.md ("Across a window boundary"): this example
// keeps it true.
func Example_acrossAWindowBoundary() {
	fmt.Print(boundaryTable())
	// Output:
	// | the client sends | fixed window | token bucket | sliding log | sliding window |
	// |---|---|---|---|---|
	// | 1 at 0:00 | 1 | 1 | 1 | 1 |
	// | 10 at 0:59 | 9 | 10 | 9 | 9 |
	// | 10 at 1:01 | 10 | 0 | 1 | 0 |
	// | 10 at 1:30 | 0 | 5 | 0 | 5 |
	// | RetryAfter of the first denied at 1:01 | none denied | 4s | 58s | 5s |
	// | most admitted in any 60 s | 19 | 15 | 10 | 14 |
}

// TestAlgorithmsDocShowsTheBoundaryTable: the table in docs/algorithms.md
// is the one the code computes.
func TestAlgorithmsDocShowsTheBoundaryTable(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "algorithms.md"))
	if err != nil {
		t.Fatal(err)
	}
	if table := boundaryTable(); !strings.Contains(string(doc), "\n"+table) {
		t.Errorf("docs/algorithms.md does not hold the table that the algorithms compute:\n%s", table)
	}
}

// boundaryTable runs the requests of Example_acrossAWindowBoundary through
// each algorithm on a memory backend and returns the Markdown table.
func boundaryTable() string {
	ctx := context.Background()
	b, err := memory.New(nil)
	if err != nil {
		panic(err)
	}
	// On a minute, so that the sliding-window counter's epoch-aligned
	// windows are [0:00, 1:00) and [1:00, 2:00).
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	bursts := []struct {
		at time.Duration
		n  int
	}{{0, 1}, {59 * time.Second, 10}, {61 * time.Second, 10}, {90 * time.Second, 10}}
	limit := throttler.PerMinute(10)
	policies := []throttler.Policy{
		limit, // fixed window, opened by the request at 0:00
		limit.WithAlgorithm(throttler.TokenBucket),   // burst 10: one token every 6 s
		limit.WithAlgorithm(throttler.SlidingLog),    // at most 10 in any minute
		limit.WithAlgorithm(throttler.SlidingWindow), // the previous minute weighs by its overlap
	}

	admitted := make([][]int, len(policies))     // per policy, per burst
	at := make([][]time.Duration, len(policies)) // per policy, each admitted request
	waits := make([]string, len(policies))       // per policy, the first denial's wait at 1:01
	for i, p := range policies {
		for _, burst := range bursts {
			n := 0
			for range burst.n {
				d, err := b.Take(ctx, "alice", p, 1, start.Add(burst.at))
				if err != nil {
					panic(err)
				}
				if d.Allowed {
					n++
					at[i] = append(at[i], burst.at)
				} else if burst.at == 61*time.Second && waits[i] == "" {
					waits[i] = d.RetryAfter.String()
				}
			}
			admitted[i] = append(admitted[i], n)
		}
	}

	var out strings.Builder
	fmt.Fprintln(&out, "| the client sends | fixed window | token bucket | sliding log | sliding window |")
	fmt.Fprintln(&out, "|---|---|---|---|---|")
	row := func(label string, cell func(i int) any) {
		cells := []string{label}
		for i := range policies {
			cells = append(cells, fmt.Sprint(cell(i)))
		}
		fmt.Fprintf(&out, "| %s |\n", strings.Join(cells, " | "))
	}
	for j, burst := range bursts {
		m := int(burst.at / time.Second)
		row(fmt.Sprintf("%d at %d:%02d", burst.n, m/60, m%60), func(i int) any { return admitted[i][j] })
	}
	row("RetryAfter of the first denied at 1:01", func(i int) any {
		if waits[i] == "" {
			return "none denied"
		}
		return waits[i]
	})
	row("most admitted in any 60 s", func(i int) any {
		most := 0
		for k, from := range at[i] {
			n := 0
			for _, t := range at[i][k:] {
				if t < from+time.Minute {
					n++
				}
			}
			most = max(most, n)
		}
		return most
	})
	return out.String()
}
