package redis

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/internal/identity"
	"github.com/throttlekit/throttlekit/throttler"
)

// hashTag is the part of a key that Redis Cluster hashes: the bytes between
// the first '{' and the first '}' after it, when not empty; else the key.
func hashTag(k string) string {
	i := strings.IndexByte(k, '{')
	if i < 0 {
		return k
	}
	j := strings.IndexByte(k[i+1:], '}')
	if j <= 0 {
		return k
	}
	return k[i+1 : i+1+j]
}

// named is a policy whose identity is name (an unnamed one for "").
func named(name string) throttler.Policy {
	return throttler.Policy{Name: name, Limit: 10, Window: time.Minute}
}

// decodeStorageKey inverts storageKey's layout, or reports why it cannot:
// policy is the identity stored.
func decodeStorageKey(prefix, sk string) (tag, policy, key string, err error) {
	rest, ok := strings.CutPrefix(sk, prefix)
	if !ok {
		return "", "", "", fmt.Errorf("no prefix %q", prefix)
	}
	if len(rest) < tagLen || rest[0] != '{' || rest[tagLen-1] != '}' {
		return "", "", "", fmt.Errorf("no tag at %q", rest)
	}
	tag, rest = rest[1:tagLen-1], rest[tagLen:]
	n, rest, ok := strings.Cut(rest, ":")
	if !ok {
		return "", "", "", fmt.Errorf("no length in %q", rest)
	}
	l, err := strconv.Atoi(n)
	if err != nil || l < 0 || l+1 > len(rest) || rest[l] != ':' {
		return "", "", "", fmt.Errorf("bad length %q", n)
	}
	return tag, rest[:l], rest[l+1:], nil
}

func TestStorageKeyLayout(t *testing.T) {
	b, err := NewSharded([]Shard{{Primary: &fakeClient{}}}, &Options{Prefix: "app:"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		p   throttler.Policy
		key string
	}{
		{named(""), "k"},
		{named("api"), "user-42"},
		{named("a:b"), "c"},
		{named("a"), "b:c"},
		{named("x"), "{"},
		{named("x"), "}"},
		{named("x"), "}{"},
		{named("x"), "{tag}"},
		{named("{p}"), "{k}"},
		{named("x"), "\x00\xff\n "},
		{named("x"), strings.Repeat("}", 4096)},
		// Unnamed policies are stored by their definition.
		{throttler.PerHour(3), "k"},
		{throttler.PerMinute(2), "k"},
		{throttler.PerMinute(3), "k"},
		{throttler.PerHour(3).Named("hourly"), "k"},
	}
	seen := map[string]bool{}
	for _, tt := range tests {
		sk, h := b.storageKey(tt.p, tt.key)
		tag, policy, key, err := decodeStorageKey("app:", sk)
		if err != nil {
			t.Fatalf("storageKey(%v, %q) = %q: %v", tt.p, tt.key, sk, err)
		}
		if policy != identity.Rate(tt.p) || key != tt.key {
			t.Errorf("storageKey(%v, %q) decodes to (%q, %q)", tt.p, tt.key, policy, key)
		}
		if want := fmt.Sprintf("%016x", h); tag != want || hashTag(sk) != want {
			t.Errorf("storageKey(%v, %q) = %q: tag %q, Redis hashes %q, want %q", tt.p, tt.key, sk, tag, hashTag(sk), want)
		}
		if seen[sk] {
			t.Errorf("storageKey(%v, %q) = %q, already given to another pair", tt.p, tt.key, sk)
		}
		seen[sk] = true
	}
	// The pairs that a naive "policy:key" join would confuse.
	if a, _ := b.storageKey(named("a:b"), "c"); a == func() string { s, _ := b.storageKey(named("a"), "b:c"); return s }() {
		t.Errorf("(a:b, c) and (a, b:c) share %q", a)
	}
}

func TestStorageKeyIsStable(t *testing.T) {
	// Every process of an application, and every version of this package,
	// must place a key on the same shard and slot: a changed hash, or a
	// named policy's identity stored differently, would hand every client a
	// fresh window after a deploy. The Limit and Window of a named policy
	// are not part of its key.
	b := newBackend(t, &fakeClient{}, nil)
	for _, p := range []throttler.Policy{throttler.PerHour(5000).Named("api"), throttler.PerMinute(7).Named("api")} {
		sk, h := b.storageKey(p, "user-42")
		if want := "throttlekit:{c88ccab0414fa7a4}3:api:user-42"; sk != want {
			t.Errorf("storageKey(%v) = %q, want %q", p, sk, want)
		}
		if want := uint64(0xc88ccab0414fa7a4); h != want {
			t.Errorf("hash = %#x, want %#x (changing it moves every live window)", h, want)
		}
	}
	// An unnamed policy's key holds its definition.
	sk, _ := b.storageKey(throttler.PerHour(3), "user-42")
	if _, rest, _ := strings.Cut(sk, "}"); rest != "13: fw 3/3600000:user-42" {
		t.Errorf("unnamed storageKey = %q, want the tag then 13: fw 3/3600000:user-42", sk)
	}
}

func FuzzStorageKey(f *testing.F) {
	f.Add("api", "user-42")
	f.Add("a:b", "c")
	f.Add("", "}{")
	f.Add("{x}", "\x00{}")
	b := newBackend(f, &fakeClient{}, nil)
	f.Fuzz(func(t *testing.T, name, key string) {
		policy := identity.Rate(named(name))
		sk, h := b.storageKey(named(name), key)
		tag, p, k, err := decodeStorageKey("throttlekit:", sk)
		if err != nil {
			t.Fatalf("storageKey(%q, %q) = %q: %v", policy, key, sk, err)
		}
		if p != policy || k != key {
			t.Fatalf("storageKey(%q, %q) = %q decodes to (%q, %q)", policy, key, sk, p, k)
		}
		if want := fmt.Sprintf("%016x", h); tag != want || hashTag(sk) != want {
			t.Fatalf("storageKey(%q, %q) = %q: Redis would hash %q, want %q", policy, key, sk, hashTag(sk), want)
		}
	})
}

func TestJumpHashMovesOnlyToTheNewShard(t *testing.T) {
	b := newBackend(t, &fakeClient{}, nil)
	const keys = 20000
	for _, n := range []int{1, 2, 3, 7, 10} {
		moved := 0
		counts := make([]int, n+1)
		for i := 0; i < keys; i++ {
			_, h := b.storageKey(named("api"), "user-"+strconv.Itoa(i))
			before, after := jumpHash(h, n), jumpHash(h, n+1)
			counts[after]++
			if before != after {
				moved++
				if after != n {
					t.Fatalf("n=%d: key %d moved from shard %d to old shard %d", n, i, before, after)
				}
			}
		}
		// Expected 1/(n+1) of the keys; allow 10% of that either way.
		want := float64(keys) / float64(n+1)
		if d := float64(moved) - want; d > want/10 || d < -want/10 {
			t.Errorf("%d -> %d shards moved %d keys, want about %.0f", n, n+1, moved, want)
		}
		for s, c := range counts {
			if d := float64(c) - want; d > want/10 || d < -want/10 {
				t.Errorf("%d shards: shard %d holds %d keys, want about %.0f", n+1, s, c, want)
			}
		}
	}
}

func TestJumpHashInRange(t *testing.T) {
	for _, h := range []uint64{0, 1, 1 << 63, ^uint64(0)} {
		for n := 1; n < 40; n++ {
			if got := jumpHash(h, n); got < 0 || got >= n {
				t.Fatalf("jumpHash(%#x, %d) = %d", h, n, got)
			}
		}
	}
}

// Store names a sharded key's shard from its hash alone: no allocation on
// the Throttler's path, and the same shard the key's calls go to.
func TestStoreAllocatesNothingAndNamesTheKeysShard(t *testing.T) {
	b, err := NewSharded([]Shard{{Primary: &fakeClient{}}, {Primary: &fakeClient{}}, {Primary: &fakeClient{}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := throttler.PerHour(5).Named("api").WithAlgorithm(throttler.TokenBucket)
	for i := range 50 {
		key := fmt.Sprint("user-", i)
		_, h := b.algorithmKey(p, key)
		if got, want := b.store(throttler.OpTake, key, p), b.shardFor(h).name; got != want {
			t.Fatalf("%s: Store %q, the key's calls go to %q", key, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = b.store(throttler.OpTake, "user-1", p) }); n != 0 {
		t.Errorf("Store allocates %v times per call", n)
	}
}
