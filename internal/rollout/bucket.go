package rollout

import "math/bits"

// Bucketer computes flags.Bucket for one group quickly: the murmur3 state
// after the group's name is computed once, so a call hashes only ":" and
// the key, with no concatenation. It is the same murmur3 (32-bit, seed 0)
// that Unleash uses, streamed; FuzzBucketer checks it against the library.
//
// Every source keeps one per group it buckets in, and so does a migration
// for the keys a change moves. The zero value buckets in the group "". A
// Bucketer is never changed after NewBucketer, so it is safe for concurrent
// use.
type Bucketer struct {
	h1    uint32 // state after the group's whole 4-byte blocks
	tail  uint32 // the group's last len%4 bytes, little-endian, not yet mixed
	ntail int
	group string
}

const (
	mc1 = 0xcc9e2d51
	mc2 = 0x1b873593
)

func mixBlock(h1, k1 uint32) uint32 {
	k1 *= mc1
	k1 = bits.RotateLeft32(k1, 15)
	k1 *= mc2
	h1 ^= k1
	h1 = bits.RotateLeft32(h1, 13)
	return h1*5 + 0xe6546b64
}

// NewBucketer returns the Bucketer of groupID.
func NewBucketer(groupID string) Bucketer {
	b := Bucketer{group: groupID}
	p := groupID
	for ; len(p) >= 4; p = p[4:] {
		b.h1 = mixBlock(b.h1, uint32(p[0])|uint32(p[1])<<8|uint32(p[2])<<16|uint32(p[3])<<24)
	}
	for i := 0; i < len(p); i++ {
		b.tail |= uint32(p[i]) << (8 * i)
	}
	b.ntail = len(p)
	return b
}

// GroupID returns the group b buckets in.
func (b *Bucketer) GroupID() string { return b.group }

// Bucket returns key's bucket in b's group, 1 to 100: Bucket(b.GroupID(), key).
func (b *Bucketer) Bucket(key string) int {
	h1, total := b.h1, uint32(len(b.group)+1+len(key))
	// The bytes still to hash are the group's tail, ":", then key.
	acc, n := b.tail|':'<<(8*b.ntail), b.ntail+1
	if n == 4 {
		h1 = mixBlock(h1, acc)
		acc, n = 0, 0
	}
	if n > 0 {
		for n < 4 && len(key) > 0 {
			acc |= uint32(key[0]) << (8 * n)
			key = key[1:]
			n++
		}
		if n == 4 {
			h1 = mixBlock(h1, acc)
			acc, n = 0, 0
		}
	}
	if n == 0 {
		for ; len(key) >= 4; key = key[4:] {
			h1 = mixBlock(h1, uint32(key[0])|uint32(key[1])<<8|uint32(key[2])<<16|uint32(key[3])<<24)
		}
		for i := 0; i < len(key); i++ {
			acc |= uint32(key[i]) << (8 * i)
		}
		n = len(key)
	}
	if n > 0 {
		k1 := acc * mc1
		k1 = bits.RotateLeft32(k1, 15)
		h1 ^= k1 * mc2
	}
	h1 ^= total
	h1 ^= h1 >> 16
	h1 *= 0x85ebca6b
	h1 ^= h1 >> 13
	h1 *= 0xc2b2ae35
	h1 ^= h1 >> 16
	return int(h1%100) + 1
}

// In reports whether key is in a rollout of p percent, 0 to 100.
func (b *Bucketer) In(key string, p int) bool {
	return p > 0 && (p >= 100 || b.Bucket(key) <= p)
}
