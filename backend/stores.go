package backend

import (
	"github.com/throttlekit/throttlekit/throttler"
)

// ErrKeyState marks a failure that belongs to one key, not to its store: a
// corrupt or foreign item (another program writing under the prefix, a
// value of the wrong type), a key the store refuses. Such a failure never
// trips a Throttler's breaker, whatever else it wraps: limiting goes on for
// every other key. Wrap it with %w, or mark an error with KeyFailure.
var ErrKeyState error = &keyState{"backend: a key's stored state is unusable"}

// keyState is ErrKeyState's type: its method lets a Throttler find it in a
// chain, since package throttler cannot import this one.
type keyState struct{ msg string }

func (e *keyState) Error() string { return e.msg }

// KeyScoped says that the failure is one key's.
func (e *keyState) KeyScoped() bool { return true }

// StoreFailure marks err as a failure of a store itself: an error or a
// timeout that is not about one key (a refused or reset connection, a
// server loading its data set, read-only, out of memory). The result
// matches throttler.ErrUnavailable, which a Throttler counts toward the
// store's breaker, and keeps err's message and chain. store names the store
// that failed, as throttler.Stores names it, when a call may reach more than one
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
func (e *storeFailure) Unwrap() []error { return []error{e.err, throttler.ErrUnavailable} }

// FailedStore names the store that failed; a Throttler finds it by this
// method, since package throttler cannot import this one.
func (e *storeFailure) FailedStore() string { return e.store }
