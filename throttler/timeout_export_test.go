package throttler

import (
	"context"
	"time"
)

// SetCallContext replaces how th derives a backend call's context from the
// caller's (context.WithTimeout with Options.Timeout), so that tests choose
// when a call's deadline passes and when its caller looks.
func SetCallContext(th *Throttler, f func(context.Context, time.Duration) (context.Context, context.CancelFunc)) {
	th.callContext = f
}

// DetachedCalls is how many of th's detached calls are still running: 0
// once every one has handed its answer over.
func DetachedCalls(th *Throttler) int64 { return th.detached.Load() }
