package cputime

import (
	"runtime"
	"testing"
)

// Measure locks a serial benchmark's goroutine to its thread and returns the
// function that reports the CPU time the thread used per op (cpu-ns/op). It
// reports nothing where the thread's CPU clock cannot be read.
func Measure(b *testing.B) func() {
	if !Supported {
		return func() {}
	}
	runtime.LockOSThread()
	start := Thread()
	return func() {
		used := Thread() - start
		runtime.UnlockOSThread()
		b.ReportMetric(float64(used)/float64(b.N), "cpu-ns/op")
	}
}
