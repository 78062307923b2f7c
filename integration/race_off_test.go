//go:build !race

package integration

// raceDetector says the tests run under the race detector, which slows
// every call several times: load figures are measured without it.
const raceDetector = false
