package shadow

import (
	"runtime"
	"syscall"
	"testing"
	"time"
)

// cpuClock measures the CPU time of the calling goroutine (locked to its
// thread) and of the whole process: on a machine shared with other work,
// wall-clock ns/op says more about the neighbours than about the code.
type cpuClock struct{ thread, process time.Duration }

func cpuNow() cpuClock {
	var t, p syscall.Rusage
	_ = syscall.Getrusage(1 /* RUSAGE_THREAD */, &t)
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &p)
	d := func(r *syscall.Rusage) time.Duration {
		return time.Duration(r.Utime.Nano() + r.Stime.Nano())
	}
	return cpuClock{d(&t), d(&p)}
}

// measureCPU locks the benchmark's goroutine to its thread and returns the
// function that reports, per op, the CPU the caller used (caller-cpu-ns/op)
// and the whole process used (cpu-ns/op: the caller plus the shadow's
// goroutines and the runtime).
func measureCPU(b *testing.B) func() {
	runtime.LockOSThread()
	start := cpuNow()
	return func() {
		end := cpuNow()
		runtime.UnlockOSThread()
		b.ReportMetric(float64(end.thread-start.thread)/float64(b.N), "caller-cpu-ns/op")
		b.ReportMetric(float64(end.process-start.process)/float64(b.N), "cpu-ns/op")
	}
}
