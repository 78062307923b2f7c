package outbound_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/throttlekit/throttlekit/throttler"
)

// TestCompositePacesToEveryLimit: a partner allows 2 requests per 40ms and
// 5 per 200ms, taken as one composite. Every request is sent, each after
// waiting for both limits, and every admission shows each member counting
// exactly the admissions inside its own window: a request held back by one
// member spent nothing in the other. (Real time, as Wait sleeps it: the
// check holds however the calls are spread.)
func TestCompositePacesToEveryLimit(t *testing.T) {
	members := []throttler.Policy{
		throttler.Policy{Name: "partner-s", Limit: 2, Window: 40 * time.Millisecond},
		throttler.Policy{Name: "partner-m", Limit: 5, Window: 200 * time.Millisecond},
	}
	p := throttler.All(members...)
	admitted := sendWaiting(t, p, 7)
	for i, d := range admitted {
		for j, md := range d.Members() {
			opened := md.ResetAt.Add(-members[j].Window)
			inWindow := int64(0)
			for _, e := range admitted[:i+1] {
				if !e.At.Before(opened) {
					inWindow++
				}
			}
			assert.Equal(t, inWindow, md.Used, "admission %d, member %d: counts its window's admissions, no more", i, j)
			assert.LessOrEqual(t, md.Used, members[j].Limit)
		}
	}
	assert.GreaterOrEqual(t, admitted[5].At.Sub(admitted[0].At), members[1].Window,
		"the sixth waits for the longer window")
}
