package redis

import (
	"strconv"
	"strings"

	"github.com/throttlekit/throttlekit/internal/identity"
	"github.com/throttlekit/throttlekit/throttler"
)

// Key layout (docs/backends-redis.md): one key per (policy, key), a hash for
// a fixed window,
//
//	<prefix>{<16 hex digits>}<len(identity)>:<identity>:<key>
//
// where identity is identity.Rate(policy): a named policy's Name, as in
// every earlier version (live windows stay where they are), or an unnamed
// policy's definition, " fw <limit>/<window ms>".
//
// The braces are the hash tag, so a Cluster places the key by the 16 hex
// digits alone. They are a 64-bit hash of everything else in the storage
// key, so a key that itself holds '{' or '}' cannot move or break the tag,
// and every datum of one (policy, key) stays in one slot whatever is added
// later. The identity after the tag is length-prefixed, so distinct
// (policy, key) pairs never share a storage key, hash collisions included;
// Redis keys are binary safe, so the key's bytes are stored as they are.
//
// The token bucket, the sliding log and the sliding-window counter are
// stored with '+' after the tag,
//
//	<prefix>{<16 hex digits>}+<len(identity)>:<identity>:<key>
//
// because their state had another layout before they were released (hashes,
// a member per ms): the scripts never read those as theirs, they expire.
// Every other key has a digit after the tag, so no two layouts meet.
//
// With Options.TagByKey, the tag is 'k' and a 64-bit hash of the prefix
// and the key alone,
//
//	<prefix>{k<16 hex digits>}<len(identity)>:<identity>:<key>
//	<prefix>{k<16 hex digits>}+<len(identity)>:<identity>:<key>
//
// so that every policy of one key is in one Cluster slot and on one shard,
// which a composite's script needs. The 'k' keeps the two layouts' keys
// apart whatever their hashes: 17 characters between the braces are never
// the default's 16.

// tagLen is the length of the default layout's hash tag, braces included.
const tagLen = 2 + 16

// keyTagMark begins the tag of the TagByKey layout.
const keyTagMark = 'k'

// storageKey returns the Redis key of (p, key) and its 64-bit hash, which
// also picks the shard. It allocates once: the identity is built on the
// stack and the hash is taken over the parts before the key is built
// around it.
func (b *Backend) storageKey(p throttler.Policy, key string) (string, uint64) {
	return b.markedKey(p, key, "")
}

// maxPolicyNameLen is the longest policy name (Policy.Name's doc), the size
// of the buffers identities are built in on the stack: a longer identity
// still works, from the heap.
const maxPolicyNameLen = 128

// algorithmMarker follows the tag in the key of any algorithm but the
// fixed window.
const algorithmMarker = "+"

// markedKey is storageKey with marker after the tag; the hash, and so the
// shard and the Cluster slot, are storageKey's.
func (b *Backend) markedKey(p throttler.Policy, key, marker string) (string, uint64) {
	var idBuf [maxPolicyNameLen]byte
	return b.identityKey(identity.AppendRate(idBuf[:0], p), key, marker)
}

// identityKey is markedKey for the storage identity id (a concurrency
// limit's is identity.Lease).
func (b *Backend) identityKey(id []byte, key, marker string) (string, uint64) {
	var lenBuf [20]byte
	idLen, h := b.identityHash(id, key, lenBuf[:0])

	var buf [tagLen + 1]byte
	tag := append(buf[:0], '{')
	if b.tagByKey {
		tag = append(tag, keyTagMark)
	}
	const hexDigits = "0123456789abcdef"
	for i := 0; i < 16; i++ {
		tag = append(tag, hexDigits[(h>>(60-4*i))&0xf])
	}
	tag = append(tag, '}')

	var sb strings.Builder
	sb.Grow(len(b.prefix) + len(tag) + len(marker) + len(idLen) + 1 + len(id) + 1 + len(key))
	sb.WriteString(b.prefix)
	sb.Write(tag)
	sb.WriteString(marker)
	sb.Write(idLen)
	sb.WriteByte(':')
	sb.Write(id)
	sb.WriteByte(':')
	sb.WriteString(key)
	return sb.String(), h
}

// keyHash returns the storage key's hash (which picks the shard and makes
// the tag) without building the key, and the identity and its length as
// appended to idBuf and lenBuf, for markedKey to build it from.
func (b *Backend) keyHash(p throttler.Policy, key string, idBuf, lenBuf []byte) (id, idLen []byte, h uint64) {
	id = identity.AppendRate(idBuf, p)
	idLen, h = b.identityHash(id, key, lenBuf)
	return id, idLen, h
}

// identityHash is keyHash for the storage identity id; with TagByKey, the
// hash of the prefix and the key alone.
func (b *Backend) identityHash(id []byte, key string, lenBuf []byte) (idLen []byte, h uint64) {
	idLen = strconv.AppendInt(lenBuf, int64(len(id)), 10)
	h = fnv1aString(fnvOffset, b.prefix)
	if b.tagByKey {
		return idLen, fmix64(fnv1aString(h, key))
	}
	h = fnv1a(h, idLen)
	h = fnv1aString(h, ":")
	h = fnv1a(h, id)
	h = fnv1aString(h, ":")
	return idLen, fmix64(fnv1aString(h, key))
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// fnv1a continues a 64-bit FNV-1a hash over p. It is stable across
// processes and versions, unlike hash/maphash, because every process of an
// application must agree on the shard of a key.
func fnv1a(h uint64, p []byte) uint64 {
	for _, c := range p {
		h ^= uint64(c)
		h *= fnvPrime
	}
	return h
}

func fnv1aString(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime
	}
	return h
}

// fmix64 is MurmurHash3's finalizer: it spreads FNV's weak high bits, which
// jump hashing and the tag depend on.
func fmix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// jumpHash is Lamping and Veach's jump consistent hash: the bucket in
// [0, n) of key h. Going from n to n+1 buckets moves 1/(n+1) of the keys,
// all to the new bucket.
func jumpHash(h uint64, n int) int {
	var b, j int64 = -1, 0
	for j < int64(n) {
		b = j
		h = h*2862933555777941757 + 1
		j = int64(float64(b+1) * (float64(int64(1)<<31) / float64((h>>33)+1)))
	}
	return int(b)
}
