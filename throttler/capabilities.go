package throttler

// Capabilities: optional interfaces a Backend implements to tell a Throttler
// how to call it. Wrappers (a router, a shadow) implement each to say what
// they wrap, with the helper functions here, which a Throttler uses too.

// InProcess is implemented by backends whose calls answer from memory
// without blocking (backend/memory), and by wrappers that say what they
// wrap. A Throttler calls such a backend without a timeout context, which
// would cost more than the call itself.
type InProcess interface {
	InProcess() bool
}

// IsInProcess reports whether b says its calls never block.
func IsInProcess(b Backend) bool {
	l, ok := b.(InProcess)
	return ok && l.InProcess()
}

// ContextBlind is implemented by backends whose calls may outlive their
// context's deadline, because the client under them takes no context
// (gomemcache) or does not honour it (go-redis's AutoPipeliner), and by
// wrappers that say what they wrap. A Throttler runs such a backend's calls
// detached (see Options.Detach), so that its Timeout still bounds
// every call.
type ContextBlind interface {
	IgnoresContext() bool
}

// IgnoresContext reports whether b says its calls may outlive their
// context's deadline.
func IgnoresContext(b Backend) bool {
	c, ok := b.(ContextBlind)
	return ok && c.IgnoresContext()
}

// Stores is implemented by a backend whose keys live on several stores that
// fail apart (the shards of a sharded Redis, the servers of a Memcached
// client, a primary and the replicas that serve its reads), and by wrappers
// (a router, a shadow), which name the store of the backend the call will
// reach. A Throttler keeps one breaker per store, so that a failing shard or
// server switches limiting off for its own keys only.
//
// Store names the store that op (OpTake, OpPeek or OpRefund) on
// key under p reaches first: a backend whose Peeks go to other servers than
// its Takes (replicas) names those for a Peek, so that the replicas'
// answers never close the breaker of a failing primary, and a primary's
// open breaker never stops the Peeks its replicas can answer. A backend
// without it is one store.
//
// Store runs before every call: it must do no I/O, be safe for concurrent
// use, and return one of a small set of stable names fixed by the
// configuration (a Throttler keeps a breaker per name for its lifetime),
// such as "redis shard 1 (10.0.0.1:6379)" or "memcached 10.0.0.2:11211".
// "" is the backend's only store.
type Stores interface {
	Store(op Op, key string, p Policy) string
}

// StoreOf returns the store of b that op on key under p reaches, or "" when
// b does not name its stores.
func StoreOf(b Backend, op Op, key string, p Policy) string {
	if s, ok := b.(Stores); ok {
		return s.Store(op, key, p)
	}
	return ""
}

// LeaseStores is Stores for lease calls: implemented by a lease backend
// whose keys live on several stores, and by wrappers, which name the store
// of the backend the call will reach. A Throttler keeps a breaker per store
// for lease calls too; a backend without LeaseStores is one store for them
// (even if it has Stores, whose Store takes a rate Policy). Store's rules
// hold: no I/O, safe for concurrent use, a small fixed set of names, the
// same names as Store's for the same stores.
type LeaseStores interface {
	LeaseStore(key string, p ConcurrencyPolicy) string
}

// LeaseStoreOf returns the store of b that serves key's leases under p, or
// "" when b does not name its lease stores.
func LeaseStoreOf(b Backend, key string, p ConcurrencyPolicy) string {
	if s, ok := b.(LeaseStores); ok {
		return s.LeaseStore(key, p)
	}
	return ""
}

// LeaseHolder is implemented by wrappers that have a LeaseBackend's methods
// whatever they wrap, to say whether what they wrap holds leases: a router
// over a backend without leases must not claim them, so that a Throttler
// over it reports SupportsLeases false when it is built rather than failing
// every Acquire.
type LeaseHolder interface {
	HoldsLeases() bool
}

// Leases returns b as a LeaseBackend, and whether it holds leases: it has
// the methods and, if it is a LeaseHolder, says so. A Throttler decides the
// same way; wrapper constructors call it on what they wrap.
func Leases(b Backend) (LeaseBackend, bool) {
	lb, ok := b.(LeaseBackend)
	if !ok {
		return nil, false
	}
	if h, ok := b.(LeaseHolder); ok && !h.HoldsLeases() {
		return nil, false
	}
	return lb, true
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

// FailedStore names the store that failed (tests match it by this method).
func (e *storeFailure) FailedStore() string { return e.store }
