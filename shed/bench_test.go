package shed_test

import (
	"testing"

	"github.com/throttlekit/throttlekit/shed"
)

// benchWorker is a Worker at rest (sheds nothing: Admit draws no random
// number) or shedding half the reads (Admit draws one per Read request).
func benchWorker(b *testing.B, shedding bool) *shed.Worker {
	w, u := newWorker(b, shed.WorkerOptions{})
	if shedding {
		u.set(1)
		w.Update(at(0))
		for s := 1; s <= 88; s++ { // amount 60/120: reads dropped with chance 1/2
			w.Update(at(s))
		}
		if w.DropChance(shed.Read) != 0.5 {
			b.Fatalf("read drop chance %v, want 0.5", w.DropChance(shed.Read))
		}
	}
	return w
}

// BenchmarkWorkerAdmit is the worker shedder's per-request cost on the hot
// path: Admit, and Done for an admitted request, from every P at once.
func BenchmarkWorkerAdmit(b *testing.B) {
	for _, bc := range []struct {
		name     string
		shedding bool
	}{{"rest", false}, {"shedding", true}} {
		b.Run(bc.name+"/serial", func(b *testing.B) {
			w := benchWorker(b, bc.shedding)
			b.ReportAllocs()
			for b.Loop() {
				if w.Admit(shed.Read) {
					w.Done()
				}
			}
		})
		b.Run(bc.name+"/parallel", func(b *testing.B) {
			w := benchWorker(b, bc.shedding)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if w.Admit(shed.Read) {
						w.Done()
					}
				}
			})
		})
	}
}

func BenchmarkDefaultClassifier(b *testing.B) {
	r := newRequest("GET", "/v1/charges")
	b.ReportAllocs()
	for b.Loop() {
		if shed.DefaultClassifier(r) != shed.Read {
			b.Fatal("not a read")
		}
	}
}
