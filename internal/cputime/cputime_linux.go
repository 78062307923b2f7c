package cputime

import (
	"syscall"
	"time"
	"unsafe"
)

// Supported reports whether Thread and Process read real clocks here.
const Supported = true

// Clock ids of clock_gettime(2), which the syscall package does not name.
const (
	clockProcessCPUTime = 2 // CLOCK_PROCESS_CPUTIME_ID
	clockThreadCPUTime  = 3 // CLOCK_THREAD_CPUTIME_ID
)

// Thread is the CPU time the calling thread has used, to the nanosecond
// (getrusage counts in coarser steps).
func Thread() time.Duration { return clock(clockThreadCPUTime) }

// Process is the CPU time every thread of the process has used.
func Process() time.Duration { return clock(clockProcessCPUTime) }

func clock(id uintptr) time.Duration {
	var ts syscall.Timespec
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, id, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		return 0
	}
	return time.Duration(ts.Nano())
}
