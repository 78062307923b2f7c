package throttler

// Traits tell a Throttler how to call a backend. A backend declares them with
// a method
//
//	Traits() throttler.Traits
//
// and a wrapper (a router, a shadow) derives its own from what it wraps with
// TraitsOf, in one place. A backend without the method has the zero Traits:
// one store, remote, honouring its context, holding leases if it is a
// LeaseBackend.
type Traits struct {
	// InProcess says the backend's calls answer from memory without
	// blocking (backend/memory). A Throttler calls it without a timeout
	// context, which would cost more than the call itself.
	InProcess bool

	// IgnoresContext says calls may outlive their context's deadline,
	// because the client under them takes no context (gomemcache) or does
	// not honour it (go-redis's AutoPipeliner). A Throttler runs such calls
	// detached (see Options.Detach), so that its Timeout still bounds every
	// call.
	IgnoresContext bool

	// Leases says the backend holds leases: it is a LeaseBackend and what it
	// stores leases in supports them. A router over a backend without leases
	// leaves it false, so that a Throttler over it reports SupportsLeases
	// false when it is built rather than failing every Acquire.
	Leases bool

	// Composites says Take and Peek take a composite Policy (see All), all
	// or nothing under the rules of Backend's doc. A Throttler over a
	// backend without it answers a composite with an error matching
	// ErrInvalidPolicy; a wrapper says it only when every backend it wraps
	// does.
	Composites bool

	// Store names the store that op (OpTake, OpPeek or OpRefund) on key under
	// p reaches first, for a backend whose keys live on several stores that
	// fail apart (the shards of a sharded Redis, the servers of a Memcached
	// client, a primary and the replicas that serve its reads). A Throttler
	// keeps one breaker per store, so that a failing shard or server switches
	// limiting off for its own keys only. A backend whose Peeks go to other
	// servers than its Takes names those for a Peek, so that the replicas'
	// answers never close the breaker of a failing primary, and a primary's
	// open breaker never stops the Peeks its replicas can answer.
	//
	// Store runs before every call: it must do no I/O, be safe for
	// concurrent use, and return one of a small set of stable names fixed by
	// the configuration (a Throttler keeps a breaker per name for its
	// lifetime), such as "redis shard 1 (10.0.0.1:6379)" or "memcached
	// 10.0.0.2:11211". "" is the backend's only store; nil means one store.
	Store func(op Op, key string, p Policy) string

	// LeaseStore is Store for lease calls, with Store's rules and the same
	// names for the same stores; nil means one store.
	LeaseStore func(key string, p ConcurrencyPolicy) string

	// Route is Store for a backend that sends each call to one of several
	// backends by a setting that may change at any moment (flags.Router):
	// from one reading of the setting it names the call's store, as Store
	// would, and returns the backend that makes the call, which a Throttler
	// then calls in b's place. Read twice, once by Store and once by the
	// call, a change in between would name one store (whose breaker admits
	// and is charged) and send the call to another. b is the backend the
	// Throttler holds: when it is not the router itself (a wrapper that
	// embeds the router, or forwards its Traits), Route returns nil, and the
	// Throttler calls b, which must make the call its own way. It has
	// Store's rules; a backend with Route also has Store. nil: Store names
	// the store.
	Route func(b Backend, op Op, key string, p Policy) (store string, to Backend)
}

// TraitsOf returns b's Traits: what its Traits method says (Leases only if b
// is also a LeaseBackend), or the zero Traits with Leases set when b is a
// LeaseBackend. Store and LeaseStore are never nil in the result.
func TraitsOf(b Backend) Traits {
	t := declaredTraits(b)
	if t.Store == nil {
		t.Store = oneStore
	}
	if t.LeaseStore == nil {
		t.LeaseStore = oneLeaseStore
	}
	return t
}

func oneStore(Op, string, Policy) string             { return "" }
func oneLeaseStore(string, ConcurrencyPolicy) string { return "" }

// declaredTraits is TraitsOf with Store and LeaseStore nil when b has one
// store, which a Throttler then never calls.
func declaredTraits(b Backend) Traits {
	_, isLeases := b.(LeaseBackend)
	t := Traits{Leases: isLeases}
	if d, ok := b.(interface{ Traits() Traits }); ok {
		t = d.Traits()
		t.Leases = t.Leases && isLeases
	}
	return t
}

// leasesOf returns b as a LeaseBackend when its Traits say it holds leases.
func leasesOf(b Backend, t Traits) LeaseBackend {
	if !t.Leases {
		return nil
	}
	return b.(LeaseBackend)
}

// ErrKeyState marks a failure that belongs to one key, not to its store: a
// corrupt or foreign item (another program writing under the prefix, a
// value of the wrong type), a key the store refuses. Such a failure never
// trips a Throttler's breaker, whatever else it wraps: limiting goes on for
// every other key. Wrap it with %w, or mark an error with KeyFailure.
var ErrKeyState error = &keyState{"throttler: a key's stored state is unusable"}

// keyState is ErrKeyState's type, so that ErrKeyState is a distinct value.
type keyState struct{ msg string }

func (e *keyState) Error() string { return e.msg }

// StoreFailure marks err as a failure of a store itself: an error or a
// timeout that is not about one key (a refused or reset connection, a
// server loading its data set, read-only, out of memory). The result
// matches ErrUnavailable, which a Throttler counts toward the
// store's breaker, and keeps err's message and chain. store names the store
// that failed, as Stores names it, when a call may reach more than one
// (Memcached items of one key on two servers); "" means the call's store.
// A nil err stays nil.
func StoreFailure(store string, err error) error {
	if err == nil {
		return nil
	}
	return &storeFailure{store: store, err: err}
}

// KeyFailure marks err as a failure of one key (see ErrKeyState): the result
// matches ErrKeyState and keeps err's message and chain. A nil err stays nil.
func KeyFailure(err error) error {
	if err == nil {
		return nil
	}
	return &marked{err: err, mark: ErrKeyState}
}

// marked is err, also matching mark, with err's message: a second sentinel
// without a second package prefix in the text.
type marked struct{ err, mark error }

func (e *marked) Error() string   { return e.err.Error() }
func (e *marked) Unwrap() []error { return []error{e.err, e.mark} }

type storeFailure struct {
	store string
	err   error
}

func (e *storeFailure) Error() string   { return e.err.Error() }
func (e *storeFailure) Unwrap() []error { return []error{e.err, ErrUnavailable} }
