package shadow

import (
	"github.com/throttlekit/throttlekit/throttler"
)

var _ throttler.Stores = (*Backend)(nil)

// Store names the control's store for key under p (see throttler.Stores): the
// control answers every call, and the candidate's failures never reach the
// caller, so only the control's stores may trip a Throttler's breakers.
func (b *Backend) Store(op throttler.Op, key string, p throttler.Policy) string {
	return throttler.StoreOf(b.control, op, key, p)
}

// IgnoresContext reports whether the control's calls, the ones made on the
// caller's path, may outlive their context (see throttler.ContextBlind).
func (b *Backend) IgnoresContext() bool { return throttler.IgnoresContext(b.control) }
