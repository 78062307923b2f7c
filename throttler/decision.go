package throttler

import "time"

// Decision is the state of one key's window after an operation, as the
// backend saw it in the same single call that decided.
type Decision struct {
	// Allowed reports, for Take, whether the cost was admitted and counted.
	// For Peek and Refund it reports whether one more unit would be admitted.
	Allowed bool
	// Degraded reports that the primary backend did not make this decision:
	// the fallback did, or the Throttler's failure mode did (then ResetAt is
	// zero and Used and Remaining are not known).
	Degraded bool
	// WouldDeny reports that the policy would have denied the call but does
	// not enforce it for this key (Policy.EnforcedBy, Policy.DryRun): the store
	// counted it as the denial it would have been (nothing), and it is
	// answered Allowed, with no RetryAfter. For Peek and Refund: one more
	// unit would be denied if the policy were enforced.
	WouldDeny bool
	// nMembers counts a composite's members' own Decisions (see Members).
	// Beside the three bools, it takes no room of its own: a Decision is
	// copied on every call's way back, and a larger one costs every call.
	nMembers uint8
	// Limit is the policy's capacity (Policy.Capacity: Limit, or a token
	// bucket's Burst), the same whichever part of a Throttler answered.
	Limit int64
	// Used is how many units the open window has counted. From a fallback
	// that counts a share (Options.FallbackFleetSize), it is Limit -
	// Remaining: the share's use and the other processes' shares.
	Used int64
	// Remaining is Limit - Used, never below zero (a lowered Limit can leave
	// Used above it).
	Remaining int64
	// ResetAt is when the window ends: identical for every call inside one
	// window. For a key with no open window it is now + Window, when a
	// window opened now would end. Zero only in a degraded decision made
	// without any backend, when the state is not known.
	ResetAt time.Time
	// RetryAfter is how long a denied caller should wait: the least wait
	// after which its Take would be admitted if nothing else happened
	// (ResetAt - now for a fixed window). At most ResetAt - now, except on
	// a sliding-window counter, whose ResetAt is the end of the current
	// window while the previous one may still weigh after it. Zero when
	// Allowed.
	RetryAfter time.Duration
	// At is the instant the Throttler read its clock (Options.Clock) for
	// the call that returned this Decision: the now that ResetAt and
	// RetryAfter were computed from, a fallback's and a failure mode's
	// answer included, so that a caller needs no clock reading of its own.
	// It may be zero in a Decision returned with an error.
	At time.Time
	// members are a composite's members' own Decisions.
	members *memberDecisions
}
