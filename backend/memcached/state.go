package memcached

import (
	"encoding/binary"
	"errors"
	"math"
	"time"

	"github.com/throttlekit/throttlekit/internal/algo"
	"github.com/throttlekit/throttlekit/throttler"
)

// The state item of a token bucket, sliding log or sliding-window counter
// is binary: a format byte naming the algorithm and the version of its
// layout, then varints (encoding/binary; "v" signed, "u" unsigned):
//
//	bucket:  0xB1 u(window ms) v(at) u(tokens)
//	counter: 0xC1 u(window ms) v(K) u(curr) u(prev)
//	log:     0xD1 u(n) [v(at₀) u(units₀) {u(atᵢ − atᵢ₋₁) u(unitsᵢ)}]
//
// Log entries are strictly increasing in At (entries of one ms are merged),
// so each is stored as its distance from the one before: a full log of
// MaxLogLimit entries in a window of a day takes at most about 60 KB, far
// below Memcached's 1 MB item limit. Decoding checks everything a write can
// never produce: another format byte (a fixed-window item, which is decimal
// digits, another algorithm, a later version), a truncated or overlong
// value, a window < 1, counts or a log beyond MaxLimit or MaxLogLimit, At
// not increasing. Such a value is ErrBadItem, never a panic or a state read
// from someone else's bytes.
const (
	formatBucket  = 0xB1
	formatCounter = 0xC1
	formatLog     = 0xD1
)

// errDecode is what every malformed state becomes; the caller wraps it
// into ErrBadItem with the pair's id.
var errDecode = errors.New("malformed state")

func appendBucket(dst []byte, st algo.TokenBucketState) []byte {
	dst = append(dst, formatBucket)
	dst = binary.AppendUvarint(dst, uint64(st.Window))
	dst = binary.AppendVarint(dst, st.At)
	return binary.AppendUvarint(dst, uint64(st.Tokens))
}

func appendCounter(dst []byte, st algo.CounterState) []byte {
	dst = append(dst, formatCounter)
	dst = binary.AppendUvarint(dst, uint64(st.Window))
	dst = binary.AppendVarint(dst, st.K)
	dst = binary.AppendUvarint(dst, uint64(st.Curr))
	return binary.AppendUvarint(dst, uint64(st.Prev))
}

func appendLog(dst []byte, log []algo.LogEntry) []byte {
	dst = append(dst, formatLog)
	dst = binary.AppendUvarint(dst, uint64(len(log)))
	for i, e := range log {
		if i == 0 {
			dst = binary.AppendVarint(dst, e.At)
		} else {
			dst = binary.AppendUvarint(dst, uint64(e.At-log[i-1].At))
		}
		dst = binary.AppendUvarint(dst, uint64(e.Units))
	}
	return dst
}

// decoder reads varints off a value, remembering the first failure.
type decoder struct {
	b   []byte
	bad bool
}

func (d *decoder) format(want byte) {
	if len(d.b) == 0 || d.b[0] != want {
		d.bad = true
		return
	}
	d.b = d.b[1:]
}

// u reads an unsigned varint of at most limit.
func (d *decoder) u(limit uint64) int64 {
	if d.bad {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 || v > limit {
		d.bad = true
		return 0
	}
	d.b = d.b[n:]
	return int64(v)
}

func (d *decoder) v() int64 {
	if d.bad {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.bad = true
		return 0
	}
	d.b = d.b[n:]
	return v
}

// done reports whether the whole value was read without a failure.
func (d *decoder) done() bool { return !d.bad && len(d.b) == 0 }

// maxWindow bounds a stored window in ms: a Policy's window is a
// time.Duration, so at most MaxInt64 ns.
const maxWindow = uint64(math.MaxInt64 / time.Millisecond)

// tokens may exceed a lowered capacity (it reads as the capacity), but
// never the largest capacity scaled by the longest window that passes
// Policy.Validate: Burst·w <= 2^53.
const maxTokens = 1 << 53

func decodeBucket(b []byte) (algo.TokenBucketState, error) {
	d := decoder{b: b}
	d.format(formatBucket)
	st := algo.TokenBucketState{Window: d.u(maxWindow)}
	st.At = d.v()
	st.Tokens = d.u(maxTokens)
	if !d.done() || st.Window < 1 {
		return algo.TokenBucketState{}, errDecode
	}
	return st, nil
}

func decodeCounter(b []byte) (algo.CounterState, error) {
	d := decoder{b: b}
	d.format(formatCounter)
	st := algo.CounterState{Window: d.u(maxWindow)}
	st.K = d.v()
	st.Curr = d.u(throttler.MaxLimit)
	st.Prev = d.u(throttler.MaxLimit)
	if !d.done() || st.Window < 1 {
		return algo.CounterState{}, errDecode
	}
	return st, nil
}

// decodeLog returns the log with room for one more entry, so that an
// admitted Take (algo.Log works in place) does not grow it.
func decodeLog(b []byte) ([]algo.LogEntry, error) {
	d := decoder{b: b}
	d.format(formatLog)
	n := d.u(throttler.MaxLogLimit)
	// Each entry takes at least 2 bytes: a short value cannot claim many.
	if d.bad || n > int64(len(d.b)/2) {
		return nil, errDecode
	}
	log := make([]algo.LogEntry, n, n+1)
	for i := range log {
		if i == 0 {
			log[i].At = d.v()
		} else {
			delta := d.u(math.MaxInt64)
			if delta < 1 || log[i-1].At > math.MaxInt64-delta {
				return nil, errDecode
			}
			log[i].At = log[i-1].At + delta
		}
		// An entry holds the units of one ms, all admitted while live
		// together, so never more than the largest Limit of a log.
		if log[i].Units = d.u(throttler.MaxLogLimit); log[i].Units < 1 {
			return nil, errDecode
		}
	}
	if !d.done() {
		return nil, errDecode
	}
	return log, nil
}
