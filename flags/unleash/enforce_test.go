package unleash

import (
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/flags/internal/flagstest"
)

// TestEnforcementFollowsTheFeature: an Unleash feature drives a limit's
// enforcement, refusing exactly the keys its flexibleRollout buckets in,
// as it ramps and when it is switched off.
func TestEnforcementFollowsTheFeature(t *testing.T) {
	f := newFakeUnleash(t)
	f.set(flexible("feat", "feat", 30))
	ps, wait := percentSource(t, f, "")
	e, err := flags.Enforcement(ps)
	if err != nil {
		t.Fatal(err)
	}
	keys := flagstest.Keys(1000)
	at := time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)
	for i, p := range []int{30, 60, 0} {
		if i > 0 {
			def := flexible("feat", "feat", p)
			if p == 0 {
				def = flexible("feat", "feat", 60)
				def["enabled"] = false // rolled back by switching the feature off
			}
			f.set(def)
			wait()
		}
		if ps.Percent() != p {
			t.Fatalf("the source reads %d%%, want %d%%", ps.Percent(), p)
		}
		got := flagstest.Refused(t, e, keys, at.Add(time.Duration(i)*time.Hour))
		n := 0
		for _, k := range keys {
			want := flags.Bucket("feat", k) <= p
			if got[k] != want {
				t.Fatalf("at %d%%: key %q refused %v, its bucket says %v", p, k, got[k], want)
			}
			if want {
				n++
			}
		}
		if p > 0 && n == 0 {
			t.Fatalf("at %d%%: no key in the rollout", p)
		}
	}
}
