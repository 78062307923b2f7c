package shadow

import (
	"github.com/throttlekit/throttlekit/throttler"
)

// Traits are the control's: the control answers every call, on the caller's path, and the
// candidate's failures never reach the caller, so only the control's stores may trip a Throttler's
// breakers, and only the control's calls decide whether a Throttler needs a timeout context or
// detaches them. The candidate is called in the background. Composites (throttler.All) only when
// the candidate takes them too: each call goes to both as it is.
func (b *Backend) Traits() throttler.Traits { return b.controlTraits }
