package shadow

import (
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// compareMembers is compare for a composite's members (throttler.All): the
// kinds by which any member's Decision differs, each member compared as a
// single policy's; the members' count differing (one side answered the
// composite, the other did not) is AllowedDiffers and UsedDiffers. Nothing
// for two single policies' Decisions.
func compareMembers(control, candidate throttler.Decision, usedTol int64, resetTol time.Duration) Kind {
	var k Kind
	var cands [throttler.MaxMembers]throttler.Decision
	n := 0
	for i, d := range candidate.Members() {
		cands[i], n = d, i+1
	}
	seen := 0
	for i, c := range control.Members() {
		seen = i + 1
		if i < n {
			k |= compare(c, cands[i], usedTol, resetTol)
		}
	}
	if seen != n {
		k |= AllowedDiffers | UsedDiffers
	}
	return k
}
