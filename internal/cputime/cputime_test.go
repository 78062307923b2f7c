package cputime

import (
	"runtime"
	"testing"
)

// Work on the thread moves both clocks forward, and the process's is never
// behind the thread's.
func TestClocksCountWork(t *testing.T) {
	if !Supported {
		t.Skip("no CPU clocks here")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	thread, process := Thread(), Process()
	x := 0
	for i := range 10_000_000 {
		x ^= i
	}
	_ = x
	if Thread() <= thread || Process() <= process {
		t.Errorf("thread %v -> %v, process %v -> %v: work was not counted", thread, Thread(), process, Process())
	}
	if Process() < Thread() {
		t.Errorf("the process (%v) used less CPU than one of its threads (%v)", Process(), Thread())
	}
}
