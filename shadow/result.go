package shadow

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// Kind is a set of the ways one control/candidate pair can disagree, combined with |; test for one
// with k&AllowedDiffers != 0. The zero Kind means the pair matched. String gives the names the
// metrics use as labels.
type Kind uint16

// The kinds of a Result. The difference kinds, AllowedDiffers, UsedDiffers, ResetAtDiffers and
// RetryAfterDiffers, say how two decisions disagree, and a pair may carry several (Allowed and Used
// usually differ together); CandidateError, ControlError and Dropped say why there was nothing to
// compare; Reordered marks a difference explained by the order of calls, Late one explained by it
// once the control's own delay is counted.
const (
	// AllowedDiffers: the candidate would have allowed what the control denied, or the reverse.
	AllowedDiffers Kind = 1 << iota
	// UsedDiffers: Used or Remaining differ by more than Options.UsedTolerance, or (a Release)
	// one store held the lease and the other did not.
	UsedDiffers
	// ResetAtDiffers: ResetAt differs by more than Options.ResetAtTolerance.
	ResetAtDiffers
	// CandidateError: the candidate returned an error, timed out or panicked; see
	// Result.CandidateErr.
	CandidateError
	// ControlError: the control returned an error, so there was no decision to compare. The
	// candidate was still called, to keep its counts warm.
	ControlError
	// Dropped: the call was never mirrored, because the worker's queue was full, the Backend
	// was closed, or an earlier call taken with it timed out (see Options.Timeout). The
	// candidate's counts now lag.
	Dropped
	// RetryAfterDiffers: both denied (or both allowed with a RetryAfter) but RetryAfter differs
	// by more than Options.ResetAtTolerance: the two stores would send the client back at
	// different times, which a token bucket's or a log's state can do while Allowed, Used and
	// ResetAt agree.
	RetryAfterDiffers
	// Reordered: the decisions differ (the Result keeps the difference kinds that say how), but
	// no more than two exact stores differ when they count the key's calls in different orders,
	// within the bounds Options.ReorderSpan and Options.ReorderUnits (see Options.ReorderSpan
	// for the rule). Calls of one key made by several processes reach the control in one order
	// and the candidate in another, since each process mirrors its own calls after the control
	// answers; so a call can be counted after more (or fewer) of the others' units, or, near
	// the end of a window, in the next window by one store and in the last by the other. Such a
	// pair is not a mismatch: it is counted apart (Stats.ByKind[Reordered]) and never passed to
	// Options.Ignore. Only rate operations (Take, Peek, Refund) are ever Reordered.
	Reordered
	// Late: the decisions differ beyond the Reordered bounds, but within them once the call's
	// whole delay is counted (Result.Elapsed instead of Result.Lag): the control answered late,
	// after a slow round trip or a process starved of CPU, so the two stores counted the call at
	// instants further apart than its now and its lag say. Like a Reordered pair it is counted
	// apart (Stats.ByKind[Late]), never as a mismatch nor passed to Options.Ignore; a share of
	// Late pairs says the serving path is slow, not that the stores disagree.
	Late
)

// differs is every kind that means the two decisions disagree.
const differs = AllowedDiffers | UsedDiffers | ResetAtDiffers | RetryAfterDiffers

// explained is every kind that makes a difference something other than a mismatch.
const explained = Reordered | Late

// The names are exported as metric labels: never change one.
var kindNames = [...]string{
	"allowed", "used", "reset_at", "candidate_error", "control_error", "dropped", "retry_after",
	"reordered", "late",
}

// kinds lists every single-bit Kind, in bit order.
var kinds = [...]Kind{
	AllowedDiffers, UsedDiffers, ResetAtDiffers, CandidateError, ControlError, Dropped,
	RetryAfterDiffers, Reordered, Late,
}

// String lists the kinds in k joined by "|", for example "allowed|used"; "match" for the zero Kind.
func (k Kind) String() string {
	if k == 0 {
		return "match"
	}
	var parts []string
	for i, x := range kinds {
		if k&x != 0 {
			parts = append(parts, kindNames[i])
			k &^= x
		}
	}
	if k != 0 {
		parts = append(parts, "kind("+strconv.Itoa(int(k))+")")
	}
	return strings.Join(parts, "|")
}

// Result is one comparison: the call, both answers and how they differ. It is a value; nothing in
// it changes after it is published.
type Result struct {
	Op  throttler.Op
	Key string
	// Policy and Cost are a rate operation's (OpTake, OpPeek, OpRefund); Concurrency and Lease
	// a lease operation's (OpAcquire, OpRelease).
	Policy throttler.Policy
	Cost   int64
	// Receipt is a Refund's: the ResetAt of the Take it refunds, given to both stores.
	Receipt     time.Time
	Concurrency throttler.ConcurrencyPolicy
	Lease       throttler.LeaseID
	Now         time.Time

	// Control is what the caller received.
	Control    throttler.Decision
	ControlErr error
	// Candidate is the candidate's answer to the same call; zero when the call was dropped or
	// the candidate failed.
	Candidate throttler.Decision
	// CandidateErr is the candidate's failure, wrapped with the call. A timeout
	// (Options.Timeout, or a call dropped because an earlier one of its batch timed out)
	// matches context.DeadlineExceeded with errors.Is, which tells a slow candidate from a
	// failing one; a panic is recovered and its value given in the message.
	CandidateErr error
	// ControlHeld and CandidateHeld are a Release's answers: whether each store held the lease.
	// When they differ, the stores disagreed on the leases held before the call, and the pair
	// counts as UsedDiffers.
	ControlHeld, CandidateHeld bool

	// Lag, for a pair whose decisions differ, bounds how long the call took from the control's
	// answer to the candidate's: at least the queue's wait and the candidate's round trip
	// (measured from when the worker last found its queue, at most a nap of 0.5 ms or a wake-up
	// before the call was queued). Zero when the pair matched or the candidate was not asked.
	Lag time.Duration
	// Elapsed, for a pair whose decisions differ when Options.ReorderSpan is set, is the time
	// from when the shadow received the call (before it asked the control) to the candidate's
	// answer: Lag plus the control's own round trip and any wait for a CPU in between. Zero
	// otherwise.
	Elapsed time.Duration
	// Kinds says how the pair differs; zero means it matched.
	Kinds Kind
	// Ignored reports that Options.Ignore accepted the difference: it is published but not
	// counted as a mismatch.
	Ignored bool
}

// Mismatch reports whether the decisions disagree by a real difference: Kinds holds a difference
// kind, and the pair is neither Reordered, Late nor Ignored. It is what Stats.Mismatched counts and
// LastMismatches keeps, and what a Publish hook that logs differences wants.
func (r Result) Mismatch() bool {
	return r.Kinds&differs != 0 && r.Kinds&explained == 0 && !r.Ignored
}

// compared reports whether both sides answered, so that their decisions could be compared.
func (r Result) compared() bool {
	return r.Kinds&(CandidateError|ControlError|Dropped) == 0
}

// compare returns how the candidate's decision differs from the control's.
func compare(control, candidate throttler.Decision, usedTol int64, resetTol time.Duration) Kind {
	var k Kind
	if control.Allowed != candidate.Allowed {
		k |= AllowedDiffers
	}
	if abs(control.Used-candidate.Used) > usedTol || abs(control.Remaining-candidate.Remaining) > usedTol {
		k |= UsedDiffers
	}
	if abs(int64(control.ResetAt.Sub(candidate.ResetAt))) > int64(resetTol) {
		k |= ResetAtDiffers
	}
	// A RetryAfter difference beside an Allowed one says nothing more: a decision that allows
	// has no wait.
	if control.Allowed == candidate.Allowed && abs(int64(control.RetryAfter-candidate.RetryAfter)) > int64(resetTol) {
		k |= RetryAfterDiffers
	}
	return k | compareMembers(control, candidate, usedTol, resetTol)
}

// reorder holds the bounds of Options.ReorderSpan and ReorderUnits, and the tolerances by which a
// composite's member differs at all (Options.UsedTolerance and ResetAtTolerance).
type reorder struct {
	span     time.Duration
	units    int64
	usedTol  int64
	resetTol time.Duration
}

// explains reports whether r's difference (r.Kinds within differs, a rate operation's) is one that
// exact stores give when they count the key's calls in different orders, within the bounds; the
// rule is Options. ReorderSpan's.
func (o reorder) explains(r *Result) bool {
	c, k := r.Control, r.Candidate
	if o.span <= 0 {
		return false
	}
	if r.Policy.Composite() {
		return o.explainsMembers(r)
	}
	if c.Limit != k.Limit {
		return false
	}
	// Others' calls made up to span before or after this one at the control, and those it
	// overtook or was overtaken by while it waited for the candidate.
	span := o.span + r.Lag
	// Units counted beyond the Limit were never admitted (a store's concurrent overshoots,
	// reported by a denial that reverts them): the orders that explain a difference are in what
	// each store admitted.
	used := max(abs(min(c.Used, c.Limit)-min(k.Used, k.Limit)), abs(c.Remaining-k.Remaining))
	slack := span // how far ResetAt and RetryAfter may differ
	earlier := c.ResetAt
	if k.ResetAt.Before(earlier) {
		earlier = k.ResetAt
	}
	switch {
	case !r.Now.Before(earlier.Add(-span)):
		// At the end of the earlier window (or state): one store may have counted the call,
		// or calls before it, in a window the other had already ended and replaced.
		slack += r.Policy.Window
	case used > o.units:
		return false
	case r.Policy.Algorithm != throttler.FixedWindow && c.Limit > 0:
		// A bucket's refill, a log's ages and a sliding window's wait depend on the units
		// counted: the units of the bound move them by up to the time those units take to
		// refill. (A tolerance, not an answer: a float cannot overflow here.)
		slack += time.Duration(math.Ceil(float64(r.Policy.Window) * min(1, float64(o.units)/float64(c.Limit))))
	}
	// As in compare, a RetryAfter beside an Allowed difference says nothing: a decision that
	// allows has no wait.
	return abs(int64(c.ResetAt.Sub(k.ResetAt))) <= int64(slack) &&
		(c.Allowed != k.Allowed || abs(int64(c.RetryAfter-k.RetryAfter)) <= int64(slack))
}

// explainsLate reports whether r's difference, not explained by its Lag, is explained once its
// whole delay is (Elapsed in place of Lag): the rule of Late.
func (o reorder) explainsLate(r *Result) bool {
	if r.Elapsed <= r.Lag {
		return false
	}
	late := *r
	late.Lag = r.Elapsed
	return o.explains(&late)
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
