package flags

import (
	"strings"
	"testing"

	"github.com/twmb/murmur3"

	"github.com/throttlekit/throttlekit/internal/rollout"
)

// reference is Unleash's computation, spelled as its client does.
func reference(group, key string) int {
	return int(murmur3.SeedSum32(0, []byte(group+":"+key))%100) + 1
}

func TestBucketerMatchesMurmur3(t *testing.T) {
	// Every group and key length modulo 4, and empty pieces.
	groups := []string{"", "a", "ab", "abc", "abcd", "ratelimit-redis", DefaultGroupID, "ü"}
	var keys []string
	for n := 0; n <= 13; n++ {
		keys = append(keys, strings.Repeat("k", n), strings.Repeat("é", n))
	}
	keys = append(keys, testKeys(2000)...)
	for _, g := range groups {
		b := rollout.NewBucketer(g)
		for _, k := range keys {
			if got, want := b.Bucket(k), reference(g, k); got != want {
				t.Fatalf("Bucket(%q, %q) = %d, murmur3 gives %d", g, k, got, want)
			}
		}
	}
}

// The zero Bucketer is the group "": what Unleash does for a strategy
// without a groupId.
func TestZeroBucketer(t *testing.T) {
	var zero rollout.Bucketer
	for _, k := range testKeys(1000) {
		if got, want := zero.Bucket(k), reference("", k); got != want {
			t.Fatalf("zero Bucketer: Bucket(%q) = %d, murmur3 gives %d", k, got, want)
		}
	}
	if zero.GroupID() != "" {
		t.Errorf("zero Bucketer's GroupID() = %q", zero.GroupID())
	}
}

func FuzzBucketer(f *testing.F) {
	f.Add("ratelimit-redis", "user-1")
	f.Add("", "")
	f.Add("abc", "d")
	f.Fuzz(func(t *testing.T, group, key string) {
		b := rollout.NewBucketer(group)
		got := b.Bucket(key)
		if want := reference(group, key); got != want {
			t.Fatalf("Bucket(%q, %q) = %d, murmur3 gives %d", group, key, got, want)
		}
		if got != Bucket(group, key) {
			t.Fatalf("Bucket disagrees with Bucketer for (%q, %q)", group, key)
		}
	})
}
