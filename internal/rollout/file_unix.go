//go:build unix

package rollout

import "syscall"

// openNonblock keeps the open of a FIFO from waiting for a writer; the
// file's type is checked right after.
const openNonblock = syscall.O_NONBLOCK
