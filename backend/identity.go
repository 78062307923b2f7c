package backend

import (
	"strconv"

	"github.com/throttlekit/throttlekit/throttler"
)

// Identity returns the name under which a backend stores p's state: with the
// key, it is the storage identity of a limit (see throttler.Policy).
//
// A named policy's identity is its Name, unchanged, so windows stored by
// earlier versions stay where they are and a live policy's Limit can change
// without a fresh window. An unnamed policy's identity is its definition,
// " fw <limit>/<window ms>": it starts with a space, which no Name may
// hold, so it never meets a named policy's, and two unnamed policies that
// differ in Limit or Window never share state.
func Identity(p throttler.Policy) string {
	if p.Name != "" {
		return p.Name
	}
	return string(AppendIdentity(make([]byte, 0, 32), p))
}

// AppendIdentity appends Identity(p) to dst, for backends that build a
// storage key without an allocation of its own.
func AppendIdentity(dst []byte, p throttler.Policy) []byte {
	if p.Name != "" {
		return append(dst, p.Name...)
	}
	dst = append(dst, " fw "...)
	dst = strconv.AppendInt(dst, p.Limit, 10)
	dst = append(dst, '/')
	return strconv.AppendInt(dst, p.Window.Milliseconds(), 10)
}
