package migration

import (
	"fmt"

	"github.com/throttlekit/throttlekit/throttler"
)

// errComposite answers a composite (throttler.All): a moving key's calls
// go to both stores by rules made for one policy (a fixed window's phases,
// a bucket's leveling, how long its state can still change an answer), which
// do not yet span a composite's members, so a Migration takes none, and
// says so in its Traits: a Throttler over it refuses a composite before
// calling it.
var errComposite = fmt.Errorf("%w: a Migration takes no composite policies", throttler.ErrInvalidPolicy)
