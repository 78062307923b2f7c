//go:build !linux

package cputime

import "time"

// Supported reports whether Thread and Process read real clocks here.
const Supported = false

// Thread returns 0: this system's thread CPU clock is not read.
func Thread() time.Duration { return 0 }

// Process returns 0: this system's process CPU clock is not read.
func Process() time.Duration { return 0 }
