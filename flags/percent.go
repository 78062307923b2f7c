package flags

import (
	"sync/atomic"

	"github.com/throttlekit/throttlekit/internal/rollout"
)

// Percent is a static percentage rollout that can be changed at run time:
// a change applies to the next call. It has the Mirroring, Percent and
// GroupID methods package migration asks a rollout for (see Rollout). It
// is safe for concurrent use.
type Percent struct {
	b rollout.Bucketer
	// state packs the percentage (low byte) and the mirror bit, so a
	// reader never sees one without the other.
	state atomic.Uint32
}

var _ Rollout = (*Percent)(nil)

const mirrorBit = 1 << 8

// NewPercent returns a rollout of p percent in DefaultGroupID, with
// mirroring off. A p outside [0, 100] is an error matching ErrPercent, as
// it is for Set.
func NewPercent(p int) (*Percent, error) { return NewPercentFor(DefaultGroupID, p) }

// NewPercentFor is NewPercent in the bucketing group groupID: pass the name
// of the Unleash feature (or the groupId of its flexibleRollout strategy)
// that will take over, so the same keys stay on the new backend. An empty
// groupID means DefaultGroupID.
func NewPercentFor(groupID string, p int) (*Percent, error) {
	if err := checkPercent(p); err != nil {
		return nil, err
	}
	return newPercent(groupID, p), nil
}

// newPercent is NewPercentFor for a p already checked.
func newPercent(groupID string, p int) *Percent {
	if groupID == "" {
		groupID = DefaultGroupID
	}
	s := &Percent{b: rollout.NewBucketer(groupID)}
	s.state.Store(uint32(p))
	return s
}

// Set changes the percentage. It returns an error matching ErrPercent, and
// changes nothing, when p is outside [0, 100].
func (s *Percent) Set(p int) error {
	if err := checkPercent(p); err != nil {
		return err
	}
	for {
		old := s.state.Load()
		if s.state.CompareAndSwap(old, old&mirrorBit|uint32(p)) {
			return nil
		}
	}
}

// SetMirror turns mirroring on or off (see Rollout).
func (s *Percent) SetMirror(on bool) {
	for {
		old := s.state.Load()
		nw := old &^ mirrorBit
		if on {
			nw |= mirrorBit
		}
		if s.state.CompareAndSwap(old, nw) {
			return
		}
	}
}

// store sets both settings at once; p must be within [0, 100].
func (s *Percent) store(p int, mirror bool) {
	v := uint32(p)
	if mirror {
		v |= mirrorBit
	}
	s.state.Store(v)
}

// Percent returns the current percentage.
func (s *Percent) Percent() int { return int(s.state.Load() & 0xff) }

// GroupID returns the bucketing group.
func (s *Percent) GroupID() string { return s.b.GroupID() }

// UseNew reports whether key is within the current percentage.
func (s *Percent) UseNew(key string) bool {
	return s.b.In(key, int(s.state.Load()&0xff))
}

// Mirroring reports whether mirroring is on.
func (s *Percent) Mirroring() bool { return s.state.Load()&mirrorBit != 0 }
