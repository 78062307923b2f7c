package shadow

import (
	"runtime"
	"testing"

	"github.com/throttlekit/throttlekit/internal/cputime"
)

// measureCPU locks the benchmark's goroutine to its thread and returns the function that reports,
// per op, the CPU the caller used (caller-cpu-ns/op) and the whole process used (cpu-ns/op: the
// caller plus the shadow's goroutines and the runtime): on a machine shared with other work,
// wall-clock ns/op says more about the neighbours than about the code. It reports nothing where the
// CPU clocks cannot be read.
func measureCPU(b *testing.B) func() {
	if !cputime.Supported {
		return func() {}
	}
	runtime.LockOSThread()
	thread, process := cputime.Thread(), cputime.Process()
	return func() {
		thread, process = cputime.Thread()-thread, cputime.Process()-process
		runtime.UnlockOSThread()
		b.ReportMetric(float64(thread)/float64(b.N), "caller-cpu-ns/op")
		b.ReportMetric(float64(process)/float64(b.N), "cpu-ns/op")
	}
}
