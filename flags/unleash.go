package flags

import (
	"strconv"
	"sync/atomic"
	"time"

	unleash "github.com/Unleash/unleash-client-go/v4"
	"github.com/Unleash/unleash-client-go/v4/api"
	ucontext "github.com/Unleash/unleash-client-go/v4/context"
)

// UnleashOptions configure an Unleash source. The zero value (or nil) means
// defaults.
type UnleashOptions struct {
	// MirrorFeature names a second Unleash feature, an on/off toggle, whose
	// state is the mirror setting (see Unleash.Mirroring and Mirrorer).
	// default: "" (never mirrors)
	MirrorFeature string
	// Recheck is how often the source re-reads the feature's definition
	// from the client, so a change reaches the routing at most Recheck
	// after the client fetched it. default: 100ms
	Recheck time.Duration
}

// Unleash is a rollout decided by an Unleash feature flag: a key is new when
// the feature is enabled for a context whose UserId is the key. Give the
// feature a flexibleRollout strategy with stickiness userId; its percentage
// is then the share of keys on the new backend, bucketed as Bucket does.
//
// It never waits for the client: while the client has no definition of the
// feature (it is unknown, or Unleash has never answered and no backup file
// exists), every key stays old. When Unleash goes away, the client keeps the
// last definition it fetched, and so does the routing.
//
// Asking the client per call costs microseconds (it counts every evaluation
// for Unleash's metrics through a channel), so the source reads the
// feature's definition from the client at most every Recheck and evaluates
// flexibleRollout strategies itself, with the client's own bucketing. A
// definition it does not fully understand (constraints, segments, variants,
// dependencies, other strategies or stickiness) is evaluated by the client
// on every call instead. Either way, the evaluations are not reported to
// Unleash's metrics per key.
//
// It is safe for concurrent use.
type Unleash struct {
	c       *unleash.Client
	feature string
	mirror  string
	recheck int64 // ns
	epoch   time.Time
	// next is when (ns since epoch) the plan is due for a re-read; the
	// caller that advances it does the re-read.
	next atomic.Int64
	plan atomic.Pointer[plan]
}

var (
	_ Rollout  = (*Unleash)(nil)
	_ Mirrorer = (*Unleash)(nil)
)

// plan is one reading of the feature's definition.
type plan struct {
	// byClient sends every key to the client's IsEnabled.
	byClient bool
	// all is the answer for every key when set and byClient is false.
	all   bool
	rules []rolloutRule // any one admitting the key makes it new
	// mirror is the mirror feature's state at the reading.
	mirror bool
}

type rolloutRule struct {
	b       bucketer
	percent float64
}

// NewUnleash returns a rollout over feature, evaluated with c's definitions.
// A nil c routes every key to the old backend. nil opts mean defaults. The
// caller owns c; NewUnleash does not wait for it to be ready. Stop using
// the source before closing c: a definition evaluated by the client calls
// c.IsEnabled, which blocks forever on a closed client with metrics on.
//
// Give c an http.Client with a Timeout: with metrics on, unleash.NewClient
// registers with a synchronous request, which the default client lets hang
// on a server that accepts connections and never answers.
func NewUnleash(c *unleash.Client, feature string, opts *UnleashOptions) *Unleash {
	u := &Unleash{c: c, feature: feature, recheck: int64(100 * time.Millisecond), epoch: time.Now()}
	if opts != nil {
		u.mirror = opts.MirrorFeature
		if opts.Recheck > 0 {
			u.recheck = int64(opts.Recheck)
		}
	}
	u.refresh(0)
	return u
}

// current returns the plan, re-reading it when it is due.
func (u *Unleash) current() *plan {
	now := int64(time.Since(u.epoch))
	if next := u.next.Load(); now >= next && u.next.CompareAndSwap(next, now+u.recheck) {
		return u.refresh(now)
	}
	return u.plan.Load()
}

func (u *Unleash) refresh(now int64) *plan {
	p := u.compile()
	u.plan.Store(p)
	u.next.Store(now + u.recheck)
	return p
}

// compile reads the features' definitions from the client.
func (u *Unleash) compile() *plan {
	if u.c == nil {
		return &plan{}
	}
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
	r.b = newBucketer(group)
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
func (u *Unleash) isEnabled(feature, key string) (on bool) {
	defer func() {
		if recover() != nil {
			on = false
		}
	}()
	return u.c.IsEnabled(feature, unleash.WithContext(ucontext.Context{UserId: key}), unleash.WithFallback(false))
}

// UseNew reports whether the feature is enabled for UserId key.
func (u *Unleash) UseNew(key string) bool {
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
		if b == 0 || r.b.group != group {
			b, group = r.b.bucket(key), r.b.group
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
func (u *Unleash) Mirroring() bool { return u.current().mirror }
