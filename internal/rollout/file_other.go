//go:build !unix

package rollout

// openNonblock is 0 where there are no FIFOs to open without waiting.
const openNonblock = 0
