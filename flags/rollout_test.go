package flags

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	unleash "github.com/Unleash/unleash-client-go/v4"
	ucontext "github.com/Unleash/unleash-client-go/v4/context"
)

// testKeys returns n distinct keys of several shapes, including ones longer
// than Bucket's stack buffer and non-ASCII ones.
func testKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		switch i % 4 {
		case 0:
			keys[i] = "user-" + strconv.Itoa(i)
		case 1:
			keys[i] = fmt.Sprintf("203.0.%d.%d", i/256%256, i%256)
		case 2:
			keys[i] = "clé-ü-" + strconv.Itoa(i*7919)
		default:
			keys[i] = strings.Repeat("k", 150+i%100) + strconv.Itoa(i)
		}
	}
	return keys
}

// TestBucketMatchesUnleashClient finds each key's bucket through the real
// Unleash client's evaluation of flexibleRollout (a binary search over
// features rolled out to 1..100%) and compares it with Bucket.
func TestBucketMatchesUnleashClient(t *testing.T) {
	const group = "ratelimit-redis"
	f := newFakeUnleash(t)
	features := make([]map[string]any, 0, 101)
	for p := 0; p <= 100; p++ {
		features = append(features, flexible("p"+strconv.Itoa(p), group, p))
	}
	f.set(features...)
	c, wait := f.client(t, time.Hour)
	wait()
	enabled := func(p int, key string) bool {
		return c.IsEnabled("p"+strconv.Itoa(p), unleash.WithContext(ucontext.Context{UserId: key}))
	}
	keys := testKeys(10000)
	hist := make([]int, 101)
	for _, key := range keys {
		// The smallest p for which the client says yes is the bucket.
		lo, hi := 1, 100
		for lo < hi {
			mid := (lo + hi) / 2
			if enabled(mid, key) {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		if got := Bucket(group, key); got != lo {
			t.Fatalf("Bucket(%q, %q) = %d, Unleash client puts it in %d", group, key, got, lo)
		}
		if enabled(0, key) {
			t.Fatalf("client enables %q at 0%%", key)
		}
		hist[lo]++
	}
	// Every bucket is used: the search above is not trivially satisfied.
	for b := 1; b <= 100; b++ {
		if hist[b] == 0 {
			t.Errorf("no key in bucket %d", b)
		}
	}
}

func TestPercentMatchesUnleashClient(t *testing.T) {
	const group = "g1"
	percents := []int{0, 1, 10, 25, 50, 75, 99, 100}
	f := newFakeUnleash(t)
	var features []map[string]any
	for _, p := range percents {
		features = append(features, flexible("p"+strconv.Itoa(p), group, p))
	}
	f.set(features...)
	c, wait := f.client(t, time.Hour)
	wait()
	keys := testKeys(10000)
	for _, p := range percents {
		t.Run(strconv.Itoa(p), func(t *testing.T) {
			s := NewPercentFor(group, p)
			n := 0
			for _, key := range keys {
				want := c.IsEnabled("p"+strconv.Itoa(p), unleash.WithContext(ucontext.Context{UserId: key}))
				if got := s.UseNew(key); got != want {
					t.Fatalf("UseNew(%q) at %d%% = %v, Unleash client says %v", key, p, got, want)
				}
				if want {
					n++
				}
			}
			if share := n * 100 / len(keys); share < p-2 || share > p+2 {
				t.Errorf("%d%% rollout routes %d%% of keys", p, share)
			}
		})
	}
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
		{"clamped low start", -5, 7, false, 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewPercent(tt.start)
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

func TestNewPercentClamps(t *testing.T) {
	for _, tt := range []struct{ in, want int }{{-3, 0}, {0, 0}, {42, 42}, {100, 100}, {250, 100}} {
		if got := NewPercent(tt.in).Percent(); got != tt.want {
			t.Errorf("NewPercent(%d).Percent() = %d, want %d", tt.in, got, tt.want)
		}
	}
	if g := NewPercentFor("", 1).GroupID(); g != DefaultGroupID {
		t.Errorf("empty group became %q, want %q", g, DefaultGroupID)
	}
}

// TestRampOnlyAddsKeys: raising the percentage keeps every new key new, and
// zero sends every key back.
func TestRampOnlyAddsKeys(t *testing.T) {
	s := NewPercent(0)
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

func TestMirroringHelper(t *testing.T) {
	p := NewPercent(10)
	if Mirroring(p) {
		t.Error("mirroring on by default")
	}
	p.SetMirror(true)
	if !Mirroring(p) || p.Percent() != 10 {
		t.Errorf("after SetMirror(true): Mirroring = %v, Percent = %d", Mirroring(p), p.Percent())
	}
	p.SetMirror(false)
	if Mirroring(p) {
		t.Error("SetMirror(false) left mirroring on")
	}
	if Mirroring(rolloutFunc(func(string) bool { return true })) {
		t.Error("a Rollout without Mirrorer mirrors")
	}
}

type rolloutFunc func(string) bool

func (f rolloutFunc) UseNew(k string) bool { return f(k) }
