package throttler

import "errors"

// Errors returned for bad input, before any store is called. Match them
// with errors.Is; the wrapping error says what was wrong.
var (
	ErrInvalidKey    = errors.New("throttler: invalid key")
	ErrInvalidPolicy = errors.New("throttler: invalid policy")
	ErrInvalidCost   = errors.New("throttler: invalid cost")
	// ErrInvalidReceipt is a Backend.Refund's whose receipt (the ResetAt
	// of the Take that counted the units) is the zero time.
	ErrInvalidReceipt = errors.New("throttler: invalid refund receipt")
)

// ErrUnavailable marks a store failure (an error or a timeout of the store
// itself, not of one key's data): backends wrap their store failures with it
// (StoreFailure), the Throttler's breakers count only
// errors that match it or a network error, and a Throttler that fails
// closed with no working fallback returns an error matching it.
var ErrUnavailable = errors.New("throttler: backend unavailable")

// IsInputError reports whether err is one of the bad-input errors, which no
// backend or retry can fix: ErrInvalidKey, ErrInvalidPolicy, ErrInvalidCost,
// ErrInvalidReceipt, ErrInvalidLease, and ErrLeasesUnsupported (a lease
// operation on a backend that holds none, a mistake of the program's, not an
// outage).
func IsInputError(err error) bool {
	return errors.Is(err, ErrInvalidKey) || errors.Is(err, ErrInvalidPolicy) || errors.Is(err, ErrInvalidCost) ||
		errors.Is(err, ErrInvalidReceipt) || errors.Is(err, ErrInvalidLease) || errors.Is(err, ErrLeasesUnsupported)
}

// ErrNotRefunded is the error of a Throttler.Refund that refunded nothing:
// the Take it names counted nothing in the store, or what counted its units
// has ended. It is neither bad input nor an outage.
var ErrNotRefunded = errors.New("throttler: nothing refunded")
