package memcached

import (
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// named is a policy whose identity is name (an unnamed one for "").
func named(name string) throttler.Policy {
	return throttler.Policy{Name: name, Limit: 10, Window: time.Minute}
}

func TestItemKeys(t *testing.T) {
	const prefix = "throttlekit:"
	long := strings.Repeat("k", maxItemKeyLen)
	tests := []struct {
		name, key  string
		wantHead   string // "" when the id must be hashed
		wantHashed bool
	}{
		{"api", "user-1", "throttlekit:w:3:api:user-1", false},
		// An unnamed policy's identity, " fw 10/60000", holds spaces.
		{"", "user-1", "", true},
		{"a:b", "c", "throttlekit:w:3:a:b:c", false},
		{"a", "b:c", "throttlekit:w:1:a:b:c", false},
		{"api", "has space", "", true},
		{"api", "tab\there", "", true},
		{"api", "nul\x00", "", true},
		{"api", "del\x7f", "", true},
		{"api", "ünïcode", "", true},
		{"api", long, "", true},
		// The longest plain id: the counter key is then exactly 250 bytes.
		{"api", long[:maxItemKeyLen-len(prefix)-counterTagLen-len("3:api:")], "throttlekit:w:3:api:" + long[:maxItemKeyLen-len(prefix)-counterTagLen-len("3:api:")], false},
		{"api", long[:maxItemKeyLen-len(prefix)-counterTagLen-len("3:api:")+1], "", true},
	}
	for _, tt := range tests {
		k := newItemKeys(prefix, named(tt.name), tt.key)
		hashed := strings.HasPrefix(k.id, "#")
		if hashed != tt.wantHashed {
			t.Errorf("(%q, %q): id %q, hashed %v, want %v", tt.name, tt.key, k.id, hashed, tt.wantHashed)
		}
		if tt.wantHead != "" && k.head() != tt.wantHead {
			t.Errorf("(%q, %q): head %q, want %q", tt.name, tt.key, k.head(), tt.wantHead)
		}
		for _, ik := range []string{k.head(), k.counter(-9223372036854775808), k.counter(1925089445000)} {
			if !legalKey(ik) {
				t.Errorf("(%q, %q): illegal item key %q (%d bytes)", tt.name, tt.key, ik, len(ik))
			}
		}
	}
}

// TestItemKeysAreStable pins the layout of a named policy's items: every
// process of an application, and every version of this package, must find
// a live window where the last one left it, whatever the policy's Limit
// and Window (which may change while it runs).
func TestItemKeysAreStable(t *testing.T) {
	for _, p := range []throttler.Policy{throttler.PerHour(5000).Named("api"), throttler.PerMinute(7).Named("api")} {
		k := newItemKeys("throttlekit:", p, "user-42")
		if got, want := k.head(), "throttlekit:w:3:api:user-42"; got != want {
			t.Errorf("%v: head %q, want %q", p, got, want)
		}
		if got, want := k.counter(1925089445000), "throttlekit:n:1925089445000:3:api:user-42"; got != want {
			t.Errorf("%v: counter %q, want %q", p, got, want)
		}
	}
	// A hashed id too: the SHA-256 of "3:api:has space".
	if got, want := newItemKeys("throttlekit:", named("api"), "has space").head(), "throttlekit:w:#GL1oK-StWS1hsuRu8xIWoYzBjAirYPoeWuLJPOOt-Jw"; got != want {
		t.Errorf("hashed head %q, want %q", got, want)
	}
	// Unnamed policies: the SHA-256 of their definition and the key, apart.
	hourly, perMinute := newItemKeys("throttlekit:", throttler.PerHour(3), "k"), newItemKeys("throttlekit:", throttler.PerMinute(2), "k")
	if !strings.HasPrefix(hourly.id, "#") || hourly.head() == perMinute.head() {
		t.Errorf("unnamed heads %q and %q, want two distinct hashed ids", hourly.head(), perMinute.head())
	}
}

// FuzzItemKeys shows that every input yields legal item keys, and that
// distinct (policy, key) pairs, or distinct windows, never share an item.
func FuzzItemKeys(f *testing.F) {
	f.Add("api", "user-1", "api", "user-2", int64(1925089445000), "throttlekit:")
	f.Add("a:b", "c", "a", "b:c", int64(-1), "")
	f.Add("", "a b", "", "a\x00b", int64(0), "p")
	f.Add("x", strings.Repeat("k", 300), "x", strings.Repeat("k", 299), int64(1<<62), strings.Repeat("p", MaxPrefixLen))
	f.Fuzz(func(t *testing.T, name1, key1, name2, key2 string, resetAtMs int64, prefix string) {
		if validPrefix(prefix) != nil {
			prefix = "throttlekit:"
		}
		p1 := throttler.Policy{Name: name1, Limit: 1, Window: time.Second}
		p2 := throttler.Policy{Name: name2, Limit: 1, Window: time.Second}
		if throttler.ValidateCall(throttler.OpTake, key1, p1, 1, time.Time{}) != nil || throttler.ValidateCall(throttler.OpTake, key2, p2, 1, time.Time{}) != nil {
			return
		}
		k1 := newItemKeys(prefix, p1, key1)
		k2 := newItemKeys(prefix, p2, key2)
		for _, ik := range []string{k1.head(), k1.counter(resetAtMs), k1.counter(resetAtMs + 1)} {
			if !legalKey(ik) {
				t.Fatalf("(%q, %q): illegal item key %q (%d bytes)", name1, key1, ik, len(ik))
			}
		}
		if k1.head() == k1.counter(resetAtMs) {
			t.Fatalf("head and counter share %q", k1.head())
		}
		if k1.counter(resetAtMs) == k1.counter(resetAtMs+1) {
			t.Fatalf("two windows share %q", k1.counter(resetAtMs))
		}
		same := name1 == name2 && key1 == key2
		if !same && (k1.head() == k2.head() || k1.counter(resetAtMs) == k2.counter(resetAtMs)) {
			t.Fatalf("(%q, %q) and (%q, %q) share item %q", name1, key1, name2, key2, k1.head())
		}
		if !same && k1.head() == k2.counter(resetAtMs) {
			t.Fatalf("a head and a counter share %q", k1.head())
		}
	})
}
