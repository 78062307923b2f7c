package backend

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

// Identity returns the name under which a backend stores p's state: with the
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
func Identity(p throttler.Policy) string {
	if p.Name != "" && p.Algorithm == throttler.FixedWindow {
		return p.Name
	}
	return string(AppendIdentity(make([]byte, 0, 48), p))
}

// AppendIdentity appends Identity(p) to dst, for backends that build a
// storage key without an allocation of its own.
func AppendIdentity(dst []byte, p throttler.Policy) []byte {
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
