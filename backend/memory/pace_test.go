package memory

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The pace at fixed instants (Lag 1s, SweepEvery 1s: a window of 1 s): how
// far behind the latest call's now, moved on by all the real time since, a
// sweep without a call takes the callers' clock 3 s (of real time) after
// the last sample.
func TestPaceBehind(t *testing.T) {
	for _, tc := range []struct {
		name    string
		samples []sample // {now, mono}, in ms
		behind  int64
	}{
		{"one call", []sample{{0, 0}}, 3000},
		{"calls over less than a window", []sample{{0, 0}, {900, 900}}, 3000},
		{"a clock that stands still", []sample{{0, 0}, {0, 1000}, {0, 2000}}, 3000},
		{"a real clock", []sample{{0, 0}, {1000, 1000}, {2000, 2000}}, 0},
		// Judged from the sample a window before the latest: 700 ms in 1 s.
		{"a real clock, its latest call 300 ms late", []sample{{0, 0}, {1000, 1000}, {1700, 2000}}, 900},
		{"a clock at half pace", []sample{{0, 0}, {500, 1000}, {1000, 2000}}, 1500},
		{"a clock at a third of the pace, over a window", []sample{{0, 0}, {333, 1000}, {667, 2000}}, 3000 - 3000*334/1000},
		{"a clock at a third of the pace, over 2 s", []sample{{0, 0}, {333, 1000}, {1000, 3000}}, 3000},
		{"a clock that ran ahead", []sample{{0, 0}, {3000, 1000}, {6000, 2000}}, 0},
		{"kept pace, then stood still 1.5 s", []sample{{0, 0}, {1000, 1000}, {2000, 2000}, {2000, 3500}}, 3000},
		{"kept pace, then stood still 0.5 s", []sample{{0, 0}, {1000, 1000}, {2000, 2000}, {2000, 2500}}, 1000},
		{"a late sample adds nothing", []sample{{0, 0}, {1000, 1000}, {2000, 2000}, {0, 1500}}, 0},
		{"two calls seen at one instant: the lower counts", []sample{{0, 0}, {1000, 1000}, {2000, 2000}, {1000, 2000}}, 3000},
		{"nows at the ends of int64, falling", []sample{{0, 0}, {math.MaxInt64, 1000}, {math.MinInt64, 2000}}, 3000},
		{"nows at the ends of int64, rising", []sample{{math.MinInt64, 0}, {0, 1000}, {math.MaxInt64, 2000}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPace(time.Second, time.Second)
			for _, x := range tc.samples {
				p.record(x)
			}
			assert.Equal(t, tc.behind, p.behind(p.last.mono+3000))
			assert.Zero(t, p.behind(p.last.mono), "no real time since the latest call")
		})
	}
}
