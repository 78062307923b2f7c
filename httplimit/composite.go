package httplimit

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// errNoComposites refuses a composite policy (throttler.All) on a Throttler
// that cannot take one, when the middleware is built.
var errNoComposites = fmt.Errorf("httplimit: Rate got a composite policy, but its Throttler's backend takes none "+
	"(Throttler.SupportsComposites): %w", throttler.ErrInvalidPolicy)

// bindingOf is the member of the composite p that binds d (see
// throttler.Decision.Binding), or p itself for a single policy or a
// Decision that names no member (a failure mode's).
func bindingOf(p throttler.Policy, d throttler.Decision) throttler.Policy {
	b := d.Binding()
	for i, m := range p.Members() {
		if i == b {
			return m
		}
	}
	return p
}

// setCompositeHeaders is setRateHeaders for a composite p. X-RateLimit-*
// are the binding member's (its name as the resource, its Limit and Used)
// but for Remaining, the least of the members', and the reset, which
// keeps its promise: a client that returns then is admitted if nobody else
// spent. A denied answer's is the binding member's (its RetryAfter is the
// longest); an admitted answer that leaves a member nothing names the
// latest reset of those members, each by its own algorithm (resetOf);
// another names the binding ResetAt. RateLimit-Policy lists every member
// in order, RateLimit names the binding one. A member not shown (in dry run
// for the key) is in none of them.
func setCompositeHeaders(h http.Header, p throttler.Policy, d throttler.Decision, ietf bool, shown audience) {
	bp := bindingOf(p, d)
	reset := time.Time{}
	if !d.ResetAt.IsZero() {
		reset = resetOf(bp, d)
	}
	if d.Allowed && d.Remaining == 0 && !reset.IsZero() {
		var ms [throttler.MaxMembers]throttler.Policy
		for i, m := range p.Members() {
			ms[i] = m
		}
		for i, md := range d.Members() {
			if r := resetOf(ms[i], md); md.Remaining == 0 && r.After(reset) && shown.shown(ms[i]) {
				reset = r
			}
		}
	}
	setHeaders(h, bp.Name, d, reset)
	if !ietf || reset.IsZero() {
		return
	}
	var list []string
	for i, m := range p.Members() {
		if shown.shown(m) {
			list = append(list, fmt.Sprintf("%q;q=%d;w=%d", memberName(m, i), m.Limit, ceilSeconds(m.Window)))
		}
	}
	h.Set("RateLimit-Policy", strings.Join(list, ", "))
	h.Set("RateLimit", fmt.Sprintf("%q;r=%d;t=%d", memberName(bp, d.Binding()), d.Remaining, ceilSeconds(reset.Sub(d.At))))
}

// memberName is a composite's member's name in the IETF headers: its Name,
// or for an unnamed one its position, "default-1" for the first.
func memberName(p throttler.Policy, i int) string {
	if p.Name != "" {
		return p.Name
	}
	return "default-" + strconv.Itoa(i+1)
}
