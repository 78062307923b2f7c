package shadow

import (
	"strconv"
	"strings"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// Kind is a set of the ways one control/candidate pair can disagree. The
// zero Kind means the pair matched.
type Kind uint8

// The kinds of difference. A Result may carry several (Allowed and Used
// usually differ together).
const (
	// AllowedDiffers: the candidate would have allowed what the control
	// denied, or the reverse.
	AllowedDiffers Kind = 1 << iota
	// UsedDiffers: Used or Remaining differ by more than
	// Options.UsedTolerance.
	UsedDiffers
	// ResetAtDiffers: ResetAt differs by more than Options.ResetAtTolerance.
	ResetAtDiffers
	// CandidateError: the candidate returned an error, timed out or
	// panicked; see Result.CandidateErr.
	CandidateError
	// ControlError: the control returned an error, so there was no decision
	// to compare. The candidate was still called, to keep its counts warm.
	ControlError
	// Dropped: the call was never mirrored, because the worker's queue was
	// full or the Backend was closed. The candidate's counts now lag.
	Dropped
	// RetryAfterDiffers: both denied (or both allowed with a RetryAfter)
	// but RetryAfter differs by more than Options.ResetAtTolerance: the two
	// stores would send the client back at different times, which a token
	// bucket's or a log's state can do while Allowed, Used and ResetAt agree.
	RetryAfterDiffers

	// Differs is every kind that means the two decisions disagree.
	Differs = AllowedDiffers | UsedDiffers | ResetAtDiffers | RetryAfterDiffers
)

var kindNames = [...]string{"allowed", "used", "reset_at", "candidate_error", "control_error", "dropped", "retry_after"}

// kinds lists every single-bit Kind, in bit order.
var kinds = [...]Kind{AllowedDiffers, UsedDiffers, ResetAtDiffers, CandidateError, ControlError, Dropped, RetryAfterDiffers}

// Has reports whether k contains every kind in x.
func (k Kind) Has(x Kind) bool { return k&x == x }

// String lists the kinds in k joined by "|", for example "allowed|used";
// "match" for the zero Kind.
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

// Result is one comparison: the call, both answers and how they differ. It
// is a value; nothing in it changes after it is published.
type Result struct {
	Op  throttler.Op
	Key string
	// Policy and Cost are a rate operation's (OpTake, OpPeek, OpRefund);
	// Concurrency and Lease a lease operation's (OpAcquire, OpRelease).
	Policy      throttler.Policy
	Cost        int64
	Concurrency throttler.ConcurrencyPolicy
	Lease       throttler.LeaseID
	Now         time.Time

	// Control is what the caller received.
	Control    throttler.Decision
	ControlErr error
	// Candidate is the candidate's answer to the same call; zero when the
	// call was dropped or the candidate failed.
	Candidate    throttler.Decision
	CandidateErr error
	// ControlHeld and CandidateHeld are a Release's answers: whether each
	// store held the lease. When they differ, the stores disagreed on the
	// leases held before the call, and the pair counts as UsedDiffers.
	ControlHeld, CandidateHeld bool

	// Kinds says how the pair differs; zero means it matched.
	Kinds Kind
	// Ignored reports that Options.Ignore accepted the difference: it is
	// published but not counted as a mismatch.
	Ignored bool
}

// Mismatch reports whether the decisions disagree and the difference was not
// ignored.
func (r Result) Mismatch() bool { return r.Kinds&Differs != 0 && !r.Ignored }

// Compared reports whether both sides answered, so that their decisions
// could be compared.
func (r Result) Compared() bool {
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
	// A RetryAfter difference beside an Allowed one says nothing more: a
	// decision that allows has no wait.
	if control.Allowed == candidate.Allowed && abs(int64(control.RetryAfter-candidate.RetryAfter)) > int64(resetTol) {
		k |= RetryAfterDiffers
	}
	return k
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
