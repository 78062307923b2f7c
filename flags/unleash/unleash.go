// Package unleash is a flags.Rollout decided by an Unleash feature flag,
// apart from package flags so that a program that ramps by a static
// percentage or a file compiles in no Unleash client.
//
//	client, err := unleashsdk.NewClient(…) // github.com/Unleash/unleash-client-go/v4
//	…
//	rollout, err := unleash.New(client, "ratelimit-redis", nil)
//	…
//	router, err := flags.NewRouter(memcachedBackend, redisBackend, rollout, nil)
//
// Its keys land in the same buckets as flags.Percent's and flags.File's
// with the feature's name as their group, so switching sources does not
// move anyone.
package unleash

import (
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	unleashsdk "github.com/Unleash/unleash-client-go/v4"
	"github.com/Unleash/unleash-client-go/v4/api"
	ucontext "github.com/Unleash/unleash-client-go/v4/context"

	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/internal/rollout"
)

// Options configure a Rollout. The zero value (or nil) means defaults.
type Options struct {
	// MirrorFeature names a second Unleash feature, an on/off toggle, whose
	// state is the mirror setting (see Rollout.Mirroring). It must not be the
	// rollout's own feature.
	// default: "" (never mirrors)
	MirrorFeature string
	// Recheck is how often the source re-reads the feature's definition
	// from the client, so a change reaches the routing at most Recheck
	// after the client fetched it; negative is an error. default: 100ms
	Recheck time.Duration
}

// Rollout is a rollout decided by an Unleash feature flag: a key is new when
// the feature is enabled for a context whose UserId is the key. Give the
// feature a flexibleRollout strategy with stickiness userId; its percentage
// is then the share of keys on the new backend, bucketed as flags.Bucket
// does.
//
// It never waits for the client: while the client has no definition of the
// feature (it is unknown, or Unleash has never answered and no backup file
// exists), every key stays old. When Unleash goes away, the client keeps the
// last definition it fetched, and so does the routing.
//
// Asking the client per call costs microseconds (it counts every evaluation
// for Unleash's metrics through a channel), so the source reads the
// feature's definition from the client at most every Recheck and evaluates
// flexibleRollout strategies itself. A definition it does not fully
// understand (constraints, segments, variants, dependencies, other
// strategies or stickiness) is evaluated by the client on every call
// instead. Either way, the evaluations are not reported to Unleash's
// metrics per key.
//
// A source made by NewPercent routes by one percentage instead, and tells
// it (Percent, GroupID), so that a migration over it can track the keys a
// change moves.
//
// It is safe for concurrent use.
type Rollout struct {
	c       *unleashsdk.Client
	feature string
	mirror  string
	recheck int64 // ns
	epoch   time.Time
	// next is when (ns since epoch) the plan is due for a re-read; the
	// caller that advances it does the re-read.
	next atomic.Int64
	plan atomic.Pointer[plan]
	// pct is set for a source made by NewPercent.
	pct *percentMode
}

var _ flags.Rollout = (*Rollout)(nil)

// New returns a rollout over feature, evaluated with c's definitions. c
// and feature are required. nil opts mean defaults. The caller owns c; New
// does not wait for it to be ready. Stop using the source before closing
// c: a definition evaluated by the client calls c.IsEnabled, which blocks
// forever on a closed client with metrics on.
//
// Give c an http.Client with a Timeout: with metrics on,
// unleashsdk.NewClient registers with a synchronous request, which the
// default client lets hang on a server that accepts connections and never
// answers.
func New(c *unleashsdk.Client, feature string, opts *Options) (*Rollout, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	switch {
	case c == nil:
		return nil, errors.New("unleash: client is nil")
	case feature == "":
		return nil, errors.New("unleash: feature name is empty")
	case o.MirrorFeature == feature:
		return nil, fmt.Errorf("unleash: Options.MirrorFeature is %q, the rollout's own feature; name a separate on/off feature", feature)
	case o.Recheck < 0:
		return nil, fmt.Errorf("unleash: Options.Recheck is %v; want 0 (default 100ms) or more", o.Recheck)
	case o.Recheck == 0:
		o.Recheck = 100 * time.Millisecond
	}
	u := &Rollout{c: c, feature: feature, mirror: o.MirrorFeature, recheck: int64(o.Recheck), epoch: time.Now()}
	u.refresh(0)
	return u, nil
}

// plan is one reading of the feature's definition.
type plan struct {
	// byClient sends every key to the client's IsEnabled.
	byClient bool
	// all is the answer for every key when set and byClient is false.
	all   bool
	rules []rolloutRule // any one admitting the key makes it new
	// mirror is the mirror feature's state at the reading.
	mirror bool
	// pct is the definition read as one percentage of the keys, bucketed in
	// group (see percentOf); -1 when it is not one.
	pct   int
	group string
}

type rolloutRule struct {
	b       rollout.Bucketer
	percent float64
}

// current returns the plan, re-reading it when it is due.
func (u *Rollout) current() *plan {
	now := int64(time.Since(u.epoch))
	if next := u.next.Load(); now >= next && u.next.CompareAndSwap(next, now+u.recheck) {
		return u.refresh(now)
	}
	return u.plan.Load()
}

func (u *Rollout) refresh(now int64) *plan {
	p := u.compile()
	u.plan.Store(p)
	u.next.Store(now + u.recheck)
	return p
}

// compile reads the features' definitions from the client.
func (u *Rollout) compile() *plan {
	features := u.c.ListFeatures()
	p := readFeature(features, u.feature)
	if u.mirror != "" {
		// Not IsEnabled: it blocks for good on a closed client (its metrics
		// channel has no reader any more), and this runs on a request.
		m := readFeature(features, u.mirror)
		p.mirror = m.all && !m.byClient
	}
	return p
}

// readFeature turns the definition of feature among features into a plan.
func readFeature(features []api.Feature, feature string) *plan {
	p := readStrategies(features, feature)
	p.pct, p.group = percentOf(p)
	return p
}

// percentOf reads a plan as one whole percentage of keys bucketed in group
// ("" for 0 and 100, which every group agrees on), or -1 when it is not one:
// evaluated by the client, several rollouts, or a fraction of a percent.
func percentOf(p *plan) (int, string) {
	switch {
	case p.byClient:
		return -1, ""
	case p.all:
		return 100, ""
	case len(p.rules) == 0:
		return 0, ""
	case len(p.rules) > 1 || p.rules[0].percent != float64(int(p.rules[0].percent)):
		return -1, ""
	}
	return int(p.rules[0].percent), p.rules[0].b.GroupID()
}

// readStrategies turns the definition of feature among features into a
// plan's rules.
func readStrategies(features []api.Feature, feature string) *plan {
	p := &plan{}
	var f *api.Feature
	for i := range features {
		if features[i].Name == feature {
			f = &features[i]
			break
		}
	}
	switch {
	case f == nil || !f.Enabled:
		return p
	case f.Dependencies != nil && len(*f.Dependencies) > 0:
		p.byClient = true
		return p
	case len(f.Strategies) == 0:
		p.all = true
		return p
	}
	for _, s := range f.Strategies {
		if s.Name == "default" && len(s.Constraints) == 0 && len(s.Segments) == 0 && len(s.Variants) == 0 {
			p.all = true
			return p
		}
		r, ok := simpleRollout(s)
		if !ok {
			p.byClient = true
			return p
		}
		if r.percent >= 100 {
			p.all = true
			return p
		}
		if r.percent > 0 {
			p.rules = append(p.rules, r)
		}
	}
	return p
}

// simpleRollout reads a flexibleRollout on userId without conditions, the
// only strategy the source evaluates itself.
func simpleRollout(s api.Strategy) (rolloutRule, bool) {
	if s.Name != "flexibleRollout" || len(s.Constraints) > 0 || len(s.Segments) > 0 || len(s.Variants) > 0 {
		return rolloutRule{}, false
	}
	// "default" stickiness takes the UserId first, and every key is a
	// non-empty UserId.
	if st, ok := s.Parameters["stickiness"].(string); !ok || (st != "userId" && st != "default") {
		return rolloutRule{}, false
	}
	r := rolloutRule{}
	group := ""
	if g, ok := s.Parameters["groupId"]; ok {
		if group, ok = g.(string); !ok {
			return rolloutRule{}, false
		}
	}
	r.b = rollout.NewBucketer(group)
	switch v := s.Parameters["rollout"].(type) {
	case float64:
		r.percent = v
	case string:
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return rolloutRule{}, false
		}
		r.percent = f
	default:
		return rolloutRule{}, false
	}
	return r, true
}

// isEnabled asks the client, turning a panic on a malformed definition (the
// client asserts parameter types) into "old".
func (u *Rollout) isEnabled(feature, key string) (on bool) {
	defer func() {
		if recover() != nil {
			on = false
		}
	}()
	return u.c.IsEnabled(feature, unleashsdk.WithContext(ucontext.Context{UserId: key}), unleashsdk.WithFallback(false))
}

// UseNew reports whether the feature is enabled for UserId key (for a
// source made by NewPercent, whether key's bucket is at most Percent()).
func (u *Rollout) UseNew(key string) bool {
	if u.pct != nil {
		return u.usePercent(key)
	}
	p := u.current()
	switch {
	case p.byClient:
		return u.isEnabled(u.feature, key)
	case p.all:
		return true
	}
	if len(p.rules) == 0 {
		return false
	}
	b, group := 0, ""
	for i := range p.rules {
		r := &p.rules[i]
		// Strategies of one feature usually share its groupId: hash once.
		if b == 0 || r.b.GroupID() != group {
			b, group = r.b.Bucket(key), r.b.GroupID()
		}
		if float64(b) <= r.percent {
			return true
		}
	}
	return false
}

// Mirroring reports whether the mirror feature is on for everyone: enabled
// with no strategy, the "default" strategy, or a 100% flexibleRollout, none
// with constraints. Anything else, no mirror feature, or an unknown one,
// reads as off.
func (u *Rollout) Mirroring() bool { return u.current().mirror }
