package flags

import "math/bits"

// bucketer computes Bucket for one group quickly: the murmur3 state after
// the group's prefix (groupID + ":") is computed once, so a call hashes only
// the key, with no concatenation. It is the same murmur3 (32-bit, seed 0)
// that Unleash uses, streamed; FuzzBucketer checks it against the library.
type bucketer struct {
	h1    uint32  // state after the prefix's whole 4-byte blocks
	tail  [3]byte // the prefix's last len%4 bytes, not yet mixed
	ntail int
	plen  int // prefix length
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

func newBucketer(groupID string) bucketer {
	p := groupID + ":"
	b := bucketer{plen: len(p), group: groupID}
	n := len(p) &^ 3
	for i := 0; i < n; i += 4 {
		b.h1 = mixBlock(b.h1, uint32(p[i])|uint32(p[i+1])<<8|uint32(p[i+2])<<16|uint32(p[i+3])<<24)
	}
	b.ntail = copy(b.tail[:], p[n:])
	return b
}

// bucket returns key's bucket, 1 to 100.
func (b *bucketer) bucket(key string) int {
	h1 := b.h1
	// The stream still to hash is tail[:ntail] followed by key.
	var t [4]byte
	nt := copy(t[:], b.tail[:b.ntail])
	i := 0
	if nt > 0 {
		i = copy(t[nt:], key)
		if nt+i == 4 {
			h1 = mixBlock(h1, uint32(t[0])|uint32(t[1])<<8|uint32(t[2])<<16|uint32(t[3])<<24)
			nt = 0
		} else {
			nt += i // the whole key fitted in the partial block
		}
	}
	if nt == 0 {
		for ; i+4 <= len(key); i += 4 {
			h1 = mixBlock(h1, uint32(key[i])|uint32(key[i+1])<<8|uint32(key[i+2])<<16|uint32(key[i+3])<<24)
		}
		nt = copy(t[:], key[i:])
	}
	if nt > 0 {
		var k1 uint32
		switch nt {
		case 3:
			k1 ^= uint32(t[2]) << 16
			fallthrough
		case 2:
			k1 ^= uint32(t[1]) << 8
			fallthrough
		case 1:
			k1 ^= uint32(t[0])
			k1 *= mc1
			k1 = bits.RotateLeft32(k1, 15)
			k1 *= mc2
			h1 ^= k1
		}
	}
	h1 ^= uint32(b.plen + len(key))
	h1 ^= h1 >> 16
	h1 *= 0x85ebca6b
	h1 ^= h1 >> 13
	h1 *= 0xc2b2ae35
	h1 ^= h1 >> 16
	return int(h1%100) + 1
}

// inRollout reports whether key is in a p-percent rollout.
func (b *bucketer) inRollout(key string, p int) bool {
	return p > 0 && (p >= 100 || b.bucket(key) <= p)
}
