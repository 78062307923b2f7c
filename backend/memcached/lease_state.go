package memcached

import (
	"cmp"
	"encoding/binary"
	"math"
	"slices"

	"github.com/throttlekit/throttlekit/internal/leaseset"
	"github.com/throttlekit/throttlekit/throttler"
)

// The lease item of a (concurrency policy, key) pair holds the leases held,
// in binary: a format byte naming the layout and its version, the number
// of leases, and, when there are any, the earliest expiry (Unix ms); then
// each lease, in increasing ID order, as its ID (8 bytes, big-endian) and
// its expiry's distance from the earliest (a varint):
//
//	leases: 0xE1 u(n) [v(base) {id₈ u(expiryᵢ − base)}ⁿ]
//
// IDs are random, so 8 fixed bytes are their shortest form; expiries lie
// within one TTL of each other, a varint of 2 to 4 bytes. A full item of
// MaxConcurrencyLimit leases with TTLs under a day takes at most about
// 120 KB, and whatever the TTLs never more than 180 KB (18 bytes a lease),
// far below Memcached's default 1 MB item limit. Increasing IDs make a
// repeated ID, which no write produces, visible in one pass.
//
// Decoding checks everything a write can never produce: another format
// byte (a state item or a fixed-window item, a later version), a truncated
// or overlong value, more than MaxConcurrencyLimit leases (no Limit ever
// admitted more), a zero ID, IDs not increasing, a base that is not the
// earliest expiry, an expiry beyond int64. Such a value is ErrBadItem:
// never a panic, never leases read from someone else's bytes.
const formatLeases = 0xE1

// appendLeases appends the encoding of leases, which it sorts by ID.
func appendLeases(dst []byte, leases []leaseset.Entry) []byte {
	dst = append(dst, formatLeases)
	dst = binary.AppendUvarint(dst, uint64(len(leases)))
	if len(leases) == 0 {
		return dst
	}
	slices.SortFunc(leases, func(a, b leaseset.Entry) int { return cmp.Compare(a.ID, b.ID) })
	base := leases[0].Expiry
	for _, l := range leases[1:] {
		base = min(base, l.Expiry)
	}
	dst = binary.AppendVarint(dst, base)
	for _, l := range leases {
		dst = binary.BigEndian.AppendUint64(dst, uint64(l.ID))
		dst = binary.AppendUvarint(dst, uint64(l.Expiry)-uint64(base)) // exact even across the whole int64 range
	}
	return dst
}

// decodeLeases returns the leases of an item, in increasing ID order, with
// room for one more, so that an admitted Acquire does not grow them.
func decodeLeases(b []byte) ([]leaseset.Entry, error) {
	d := decoder{b: b}
	d.format(formatLeases)
	n := d.u(throttler.MaxConcurrencyLimit)
	// Each lease takes at least 9 bytes: a short value cannot claim many.
	if d.bad || n > int64(len(d.b)/9) {
		return nil, errDecode
	}
	leases := make([]leaseset.Entry, n, n+1)
	if n == 0 {
		if !d.done() {
			return nil, errDecode
		}
		return leases, nil
	}
	base := d.v()
	earliest := false
	for i := range leases {
		if d.bad || len(d.b) < 8 {
			return nil, errDecode
		}
		id := throttler.LeaseID(binary.BigEndian.Uint64(d.b))
		d.b = d.b[8:]
		if id == 0 || (i > 0 && id <= leases[i-1].ID) {
			return nil, errDecode
		}
		delta, m := binary.Uvarint(d.b)
		if m <= 0 || delta > uint64(math.MaxInt64)-uint64(base) {
			return nil, errDecode
		}
		d.b = d.b[m:]
		earliest = earliest || delta == 0
		leases[i] = leaseset.Entry{ID: id, Expiry: int64(uint64(base) + delta)}
	}
	if !d.done() || !earliest {
		return nil, errDecode
	}
	return leases, nil
}
