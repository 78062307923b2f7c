package cputime

import "runtime"

// MetricReporter is the part of a *testing.B that Measure reports to: taking
// it rather than *testing.B keeps package testing out of non-test code.
type MetricReporter interface {
	ReportMetric(n float64, unit string)
}

// Measure locks a serial benchmark's goroutine to its thread and returns the
// function that reports to b the CPU time the thread used per op
// (cpu-ns/op) over the benchmark's n ops (its b.N, once the loop is done).
// It reports nothing where the thread's CPU clock cannot be read.
func Measure(b MetricReporter) (report func(n int)) {
	if !Supported {
		return func(int) {}
	}
	runtime.LockOSThread()
	start := Thread()
	return func(n int) {
		used := Thread() - start
		runtime.UnlockOSThread()
		b.ReportMetric(float64(used)/float64(n), "cpu-ns/op")
	}
}
