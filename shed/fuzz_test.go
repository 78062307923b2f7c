package shed_test

import (
	"math"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/shed"
)

// FuzzWorker feeds the controller any utilization at any instants: the
// amount stays within [-Delay/Ramp, 1], every drop chance within [0, 1],
// less important classes are never shed less than more important ones, and
// critical traffic never is.
func FuzzWorker(f *testing.F) {
	f.Add(1.0, int64(1_000), 0.0, int64(500), 0.75, int64(-3_000))
	f.Add(math.NaN(), int64(28_000), math.Inf(1), int64(1<<62), -1.0, int64(1))
	f.Fuzz(func(t *testing.T, u1 float64, d1 int64, u2 float64, d2 int64, u3 float64, d3 int64) {
		var u float64
		w, err := shed.NewWorker(&shed.WorkerOptions{Utilization: func() float64 { return u }})
		if err != nil {
			t.Fatal(err)
		}
		now := t0
		w.Update(now)
		for _, step := range []struct {
			u float64
			d int64
		}{{u1, d1}, {u2, d2}, {u3, d3}, {u1, d1}} {
			u = step.u
			now = now.Add(time.Duration(step.d) * time.Millisecond)
			w.Update(now)
			st := w.Stats()
			if s := st.ShedAmount; !(s >= -28.0/120-1e-12 && s <= 1) {
				t.Fatalf("amount %v out of [-28/120, 1]", s)
			}
			test, read, write := st.DropChance[shed.TestMode], st.DropChance[shed.Read], st.DropChance[shed.Write]
			if !(0 <= write && write <= read && read <= test && test <= 1) || st.DropChance[shed.Critical] != 0 {
				t.Fatalf("drop chances test %v read %v write %v critical %v", test, read, write, st.DropChance[shed.Critical])
			}
		}
	})
}
