package flags

import (
	"errors"
	"fmt"

	"github.com/throttlekit/throttlekit/internal/rollout"
)

// Rollout decides, per key, whether the new backend serves it. UseNew must
// be cheap (it runs on every call), safe for concurrent use, and stable: for
// a given setting the same key always gets the same answer.
//
// A rollout may also have either or both of
//
//	Mirroring() bool                  // the shadow setting
//	Percent() int; GroupID() string   // routes by Bucket(GroupID(), key) <= Percent()
//
// as Percent, File and unleash's sources do. Package migration asks for
// them: Mirroring says whether to mirror calls to the store that does not
// serve the key (a rollout without it never mirrors); Percent and GroupID
// let it tell which keys a change of percentage moves (GroupID never
// changes; "" means the rollout is not one percentage of keys).
type Rollout interface {
	UseNew(key string) bool
}

// DefaultGroupID is the bucketing group of the static and file sources when
// none is given. Unleash uses the feature's name as a flexibleRollout's
// groupId by default, so name the Unleash feature this (or pass its name as
// the group) to keep clients in place when switching sources.
const DefaultGroupID = "throttlekit-new-backend"

// ErrPercent is returned for a percentage outside [0, 100].
var ErrPercent = errors.New("flags: percentage must be within [0, 100]")

func checkPercent(p int) error {
	if p < 0 || p > 100 {
		return fmt.Errorf("%w: got %d", ErrPercent, p)
	}
	return nil
}

// Bucket returns key's percentile bucket in group, from 1 to 100, exactly as
// Unleash's flexibleRollout strategy computes it: murmur3 (32-bit, seed 0)
// over groupID + ":" + key, modulo 100, plus one. A key is in a rollout of
// p percent when Bucket(groupID, key) <= p, so raising p only adds keys.
func Bucket(groupID, key string) int {
	b := rollout.NewBucketer(groupID)
	return b.Bucket(key)
}
