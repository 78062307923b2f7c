package flags_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/flags/internal/flagstest"
	"github.com/throttlekit/throttlekit/throttler"
)

var enforceAt = time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)

// wantRefused is the set of keys in a p-percent rollout of group, from the
// bucketing function itself.
func wantRefused(group string, p int, keys []string) map[string]bool {
	want := map[string]bool{}
	for _, k := range keys {
		if flags.Bucket(group, k) <= p {
			want[k] = true
		}
	}
	return want
}

func checkRefused(t *testing.T, what string, got, want map[string]bool) {
	t.Helper()
	for k := range want {
		if !got[k] {
			t.Errorf("%s: key %q is in the rollout and was not refused", what, k)
		}
	}
	for k := range got {
		if !want[k] {
			t.Errorf("%s: key %q is outside the rollout and was refused", what, k)
		}
	}
}

// TestEnforcementRefusesExactlyTheBucketedKeys ramps a limit's enforcement
// 0 → 1 → 10 → 50 → 100 and rolls it back to 0: at every step the refused
// keys are exactly those the bucketing puts in the rollout, so a raise
// keeps every key refused before, and the rollback refuses none at once.
func TestEnforcementRefusesExactlyTheBucketedKeys(t *testing.T) {
	const group = "limit-api"
	keys := flagstest.Keys(2000)
	pct, err := flags.NewPercentFor(group, 0)
	if err != nil {
		t.Fatal(err)
	}
	e, err := flags.Enforcement(pct)
	if err != nil {
		t.Fatal(err)
	}
	var before map[string]bool
	for i, p := range []int{0, 1, 10, 50, 100, 0} {
		if err := pct.Set(p); err != nil {
			t.Fatal(err)
		}
		got := flagstest.Refused(t, e, keys, enforceAt.Add(time.Duration(i)*time.Hour))
		want := wantRefused(group, p, keys)
		checkRefused(t, fmt.Sprintf("at %d%%", p), got, want)
		if p > 0 && p < 100 && (len(got) == 0 || len(got) == len(keys)) {
			t.Fatalf("at %d%%: %d of %d keys refused: the bucketing is not exercised", p, len(got), len(keys))
		}
		if i > 0 && p > 0 {
			for k := range before {
				if !got[k] {
					t.Fatalf("raising to %d%% released key %q", p, k)
				}
			}
		}
		before = got
	}
}

// TestEnforcementFromAFile: a rollout file drives enforcement as it does a
// router, in the file's group.
func TestEnforcementFromAFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limit.json")
	if err := os.WriteFile(path, []byte(`{"percent": 25}`), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := flags.NewFile(path, &flags.FileOptions{GroupID: "limit-file"})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	e, err := flags.Enforcement(f)
	if err != nil {
		t.Fatal(err)
	}
	keys := flagstest.Keys(1000)
	checkRefused(t, "file at 25%", flagstest.Refused(t, e, keys, enforceAt), wantRefused("limit-file", 25, keys))
}

func TestEnforcementNeedsARollout(t *testing.T) {
	if _, err := flags.Enforcement(nil); err == nil {
		t.Error("a nil rollout was accepted")
	}
	if _, err := flags.Enforcement((*flags.Percent)(nil)); err == nil {
		t.Error("a nil *Percent was accepted")
	}
	pct, _ := flags.NewPercent(0)
	e, _ := flags.Enforcement(pct)
	p := throttler.PerMinute(1).EnforcedBy(e)
	if err := p.Validate(); err != nil {
		t.Errorf("a policy enforced by a rollout is invalid: %v", err)
	}
}
