package flags

import (
	"errors"
	"testing"

	"github.com/throttlekit/throttlekit/flags/internal/flagstest"
)

var testKeys = flagstest.Keys

// percent is NewPercent for a p the test knows is valid.
func percent(t testing.TB, p int) *Percent {
	t.Helper()
	s, err := NewPercent(p)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestPercentSet(t *testing.T) {
	tests := []struct {
		name    string
		start   int
		set     int
		wantErr bool
		want    int
	}{
		{"raise", 10, 50, false, 50},
		{"to zero", 50, 0, false, 0},
		{"to all", 0, 100, false, 100},
		{"negative", 30, -1, true, 30},
		{"above 100", 30, 101, true, 30},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := percent(t, tt.start)
			s.SetMirror(true)
			err := s.Set(tt.set)
			if (err != nil) != tt.wantErr || (err != nil && !errors.Is(err, ErrPercent)) {
				t.Fatalf("Set(%d) error = %v, want error %v", tt.set, err, tt.wantErr)
			}
			if got := s.Percent(); got != tt.want {
				t.Errorf("Percent() = %d, want %d", got, tt.want)
			}
			if !s.Mirroring() {
				t.Error("Set turned mirroring off")
			}
		})
	}
}

// TestNewPercentErrors: NewPercent and NewPercentFor refuse what Set
// refuses, with the same error.
func TestNewPercentErrors(t *testing.T) {
	tests := []struct {
		group   string
		p       int
		want    string // "" for no error
		wantGrp string
	}{
		{"", 0, "", DefaultGroupID},
		{"g", 42, "", "g"},
		{"g", 100, "", "g"},
		{"", -1, "flags: percentage must be within [0, 100]: got -1", ""},
		{"g", 101, "flags: percentage must be within [0, 100]: got 101", ""},
		{"g", 150, "flags: percentage must be within [0, 100]: got 150", ""},
	}
	for _, tt := range tests {
		s, err := NewPercentFor(tt.group, tt.p)
		if tt.want != "" {
			if s != nil || err == nil || err.Error() != tt.want || !errors.Is(err, ErrPercent) {
				t.Errorf("NewPercentFor(%q, %d) = %v, %v; want error %q", tt.group, tt.p, s, err, tt.want)
			}
			if setErr := percent(t, 0).Set(tt.p); setErr == nil || setErr.Error() != err.Error() {
				t.Errorf("Set(%d) = %v; NewPercentFor said %v", tt.p, setErr, err)
			}
			if _, err2 := NewPercent(tt.p); err2 == nil || err2.Error() != tt.want {
				t.Errorf("NewPercent(%d) error = %v, want %q", tt.p, err2, tt.want)
			}
			continue
		}
		if err != nil || s.Percent() != tt.p || s.GroupID() != tt.wantGrp || s.Mirroring() {
			t.Errorf("NewPercentFor(%q, %d) = %v, %v", tt.group, tt.p, s, err)
		}
	}
}

// TestRampOnlyAddsKeys: raising the percentage keeps every new key new, and
// zero sends every key back.
func TestRampOnlyAddsKeys(t *testing.T) {
	s := percent(t, 0)
	keys := testKeys(5000)
	prev := make([]bool, len(keys))
	for _, p := range []int{1, 5, 25, 50, 90, 100} {
		if err := s.Set(p); err != nil {
			t.Fatal(err)
		}
		for i, k := range keys {
			now := s.UseNew(k)
			if prev[i] && !now {
				t.Fatalf("key %q left the new backend when the rollout rose to %d%%", k, p)
			}
			prev[i] = now
		}
	}
	for i, k := range keys {
		if !prev[i] {
			t.Fatalf("key %q is old at 100%%", k)
		}
	}
	s.Set(0)
	for _, k := range keys {
		if s.UseNew(k) {
			t.Fatalf("key %q is new at 0%%", k)
		}
	}
}

func TestPercentSetMirror(t *testing.T) {
	p := percent(t, 10)
	if p.Mirroring() {
		t.Error("mirroring on by default")
	}
	p.SetMirror(true)
	if !p.Mirroring() || p.Percent() != 10 {
		t.Errorf("after SetMirror(true): Mirroring = %v, Percent = %d", p.Mirroring(), p.Percent())
	}
	p.SetMirror(false)
	if p.Mirroring() {
		t.Error("SetMirror(false) left mirroring on")
	}
}

type rolloutFunc func(string) bool

func (f rolloutFunc) UseNew(k string) bool { return f(k) }
