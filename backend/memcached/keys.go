package memcached

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"

	"github.com/throttlekit/throttlekit/internal/identity"
	"github.com/throttlekit/throttlekit/throttler"
)

// Memcached's text protocol takes keys of at most 250 bytes without spaces or
// control characters. Item keys are laid out as
//
//	head:    <prefix> "w:" <id>
//	counter: <prefix> "n:" <reset-at ms> ":" <id>
//
// where <id> names the (policy, key) pair: "<len(identity)>:<identity>:<key>"
// when that is printable ASCII and short enough, otherwise "#" and the
// URL-safe base64 of its SHA-256. The identity is identity.Rate(policy):
// a named policy's Name, as in every earlier version, so its live windows
// stay where they are; an unnamed policy's definition, " fw <limit>/<window
// ms>", whose spaces always send it to the hashed form. The length prefix
// makes the plain form injective (an identity cannot swallow part of the
// key), "#" never starts a plain id, and the reset-at is digits (and a minus
// sign) ended by ":", so distinct (policy, key) pairs, and distinct windows
// of one pair, never share an item.
const (
	maxItemKeyLen = 250
	// MaxPrefixLen is the longest Options.Prefix accepted.
	MaxPrefixLen = 64
	// counterTagLen is the most that "n:" <reset-at> ":" adds: the reset-at
	// is an int64, at most 20 characters with its sign.
	counterTagLen = len("n:") + len("-9223372036854775808") + len(":")
)

// printable reports whether s holds only the bytes Memcached and every
// proxy in front of it accept in a key: printable ASCII without space.
// Bytes above 0x7e are legal for the protocol but are hashed anyway, so no
// server or proxy ever sees a non-ASCII key.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}

// validPrefix reports why prefix cannot start item keys, or nil.
func validPrefix(prefix string) error {
	if len(prefix) > MaxPrefixLen {
		return fmt.Errorf("memcached: Options.Prefix is %d bytes, at most %d allowed", len(prefix), MaxPrefixLen)
	}
	if !printable(prefix) {
		return fmt.Errorf("memcached: Options.Prefix %q must be printable ASCII without spaces", prefix)
	}
	return nil
}

// itemKeys names the items of one (policy, key) pair.
type itemKeys struct {
	prefix string
	id     string
}

// newItemKeys encodes (p's identity, key) under prefix. prefix must have
// passed validPrefix; the name and key may be anything.
func newItemKeys(prefix string, p throttler.Policy, key string) itemKeys {
	return identityKeys(prefix, identity.Rate(p), key)
}

// identityKeys encodes (name, key) under prefix, name being a storage
// identity (of a rate policy, or of a concurrency policy for leases).
func identityKeys(prefix, name, key string) itemKeys {
	id := strconv.Itoa(len(name)) + ":" + name + ":" + key
	if len(prefix)+counterTagLen+len(id) > maxItemKeyLen || !printable(name) || !printable(key) {
		sum := sha256.Sum256([]byte(id))
		id = "#" + base64.RawURLEncoding.EncodeToString(sum[:])
	}
	return itemKeys{prefix: prefix, id: id}
}

// head is the item holding the open window's reset-at, in Unix milliseconds.
func (k itemKeys) head() string { return k.prefix + "w:" + k.id }

// counter is the item counting the window that ends at resetAtMs.
func (k itemKeys) counter(resetAtMs int64) string {
	return k.prefix + "n:" + strconv.FormatInt(resetAtMs, 10) + ":" + k.id
}
