//go:build !unix

package flags

// openNonblock is 0 where there are no FIFOs to open without waiting.
const openNonblock = 0
