// Package identity names the state a backend stores for a limit: with the
// key, a policy's identity is the limit's storage identity. The Redis and
// Memcached backends build their storage keys from these names (the memory
// backend numbers the same fields), so that the same policy finds the same
// state whichever process or version wrote it, and two limits never share
// state by accident. Rate policies and concurrency policies are named
// apart: no rate identity equals a lease identity.
package identity

import (
	"strconv"

	"github.com/throttlekit/throttlekit/throttler"
)

// algorithmTags name an algorithm inside an identity.
var algorithmTags = [...]string{
	throttler.FixedWindow:   "fw",
	throttler.TokenBucket:   "tb",
	throttler.SlidingLog:    "sl",
	throttler.SlidingWindow: "sw",
}

// Rate returns the name under which a backend stores p's state: with the
// key, it is the storage identity of a limit, (Name, Algorithm, key) for a
// named policy (see throttler.Policy).
//
//   - A named fixed-window policy's identity is its Name, unchanged, so
//     windows stored by earlier versions stay where they are.
//   - A named policy of another algorithm is "<name> <tag>" (tb, sl, sw):
//     the same name under two algorithms counts apart, and a change of
//     Limit, Window or Burst keeps the state.
//   - An unnamed policy is its definition, " <tag> <limit>/<window ms>"
//     (and " b<burst>" for a token bucket with a burst), so two different
//     unnamed policies never share state.
//
// No Name may hold a space, so the forms never meet.
func Rate(p throttler.Policy) string {
	if p.Name != "" && p.Algorithm == throttler.FixedWindow {
		return p.Name
	}
	return string(AppendRate(make([]byte, 0, 48), p))
}

// AppendRate appends Rate(p) to dst, for backends that build a storage key
// without an allocation of its own.
func AppendRate(dst []byte, p throttler.Policy) []byte {
	tag := "??"
	if int(p.Algorithm) < len(algorithmTags) {
		tag = algorithmTags[p.Algorithm]
	}
	if p.Name != "" {
		dst = append(dst, p.Name...)
		if p.Algorithm != throttler.FixedWindow {
			dst = append(dst, ' ')
			dst = append(dst, tag...)
		}
		return dst
	}
	dst = append(dst, ' ')
	dst = append(dst, tag...)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, p.Limit, 10)
	dst = append(dst, '/')
	dst = strconv.AppendInt(dst, p.Window.Milliseconds(), 10)
	if p.Burst != 0 {
		dst = append(dst, " b"...)
		dst = strconv.AppendInt(dst, p.Burst, 10)
	}
	return dst
}

// Lease returns the name under which a backend stores the leases of p:
// with the key, the storage identity of a concurrency limit.
//
//   - A named policy's is "<name> cc": (Name, key) alone, so a live
//     policy's Limit and TTL can change without dropping the leases held,
//     and never a rate policy's identity (Rate), since no Name holds a
//     space and no rate algorithm's tag is "cc".
//   - An unnamed policy's is its whole definition, " cc <limit>/<ttl ms>",
//     as the lease contract says: Concurrent(5, time.Minute) and
//     Concurrent(5, time.Hour) on one key are two limits, as PerMinute and
//     PerHour are. Name a policy to keep its leases across a change of TTL.
func Lease(p throttler.ConcurrencyPolicy) string {
	return string(AppendLease(make([]byte, 0, 32), p))
}

// AppendLease appends Lease(p) to dst, for backends that build a storage
// key without an allocation of its own.
func AppendLease(dst []byte, p throttler.ConcurrencyPolicy) []byte {
	if p.Name != "" {
		dst = append(dst, p.Name...)
		return append(dst, " cc"...)
	}
	dst = append(dst, " cc "...)
	dst = strconv.AppendInt(dst, p.Limit, 10)
	dst = append(dst, '/')
	return strconv.AppendInt(dst, p.TTL.Milliseconds(), 10)
}
