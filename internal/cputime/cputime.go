// Package cputime reads the CPU time the calling thread, or the whole
// process, has used. Benchmarks report it beside ns/op: on a machine shared
// with other work the wall clock also counts the time other processes held
// the CPU. Lock the goroutine to its thread (runtime.LockOSThread) around a
// Thread measurement.
package cputime
