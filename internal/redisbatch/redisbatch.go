// Package redisbatch is the test switch of backend/redis's batching, for
// its tests and the integration module's.
package redisbatch

import "sync/atomic"

// Always, while true, makes every Backend built then send every operation
// through a batch (batch.lua), a lone one included, so that a suite of
// sequential calls (backendtest.Run) checks the answers of batches. It is
// for tests only: a lone call then waits for a goroutine.
var Always atomic.Bool
