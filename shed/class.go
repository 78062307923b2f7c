package shed

import (
	"fmt"
	"net/http"
	"strings"
)

// Class is a request's priority for load shedding. Shedders drop the least
// important shed-able class first (TestMode, then Read, then Write) and
// never drop Critical. The zero value is Critical, so that a class nobody
// set is never shed by surprise.
type Class uint8

const (
	// Critical traffic is never shed (Stripe: creating charges).
	Critical Class = iota
	// Write is a request that changes something (Stripe: POSTs), shed
	// last.
	Write
	// Read is a request that changes nothing (Stripe: GETs).
	Read
	// TestMode is traffic that no live business depends on (Stripe:
	// test-mode API keys), shed first.
	TestMode

	numClasses
)

// shedOrder is every shed-able class, least important first.
var shedOrder = [...]Class{TestMode, Read, Write}

var classNames = [numClasses]string{Critical: "critical", Write: "write", Read: "read", TestMode: "test-mode"}

// Valid reports whether c is one of the four classes.
func (c Class) Valid() bool { return c < numClasses }

// String returns "critical", "write", "read" or "test-mode", and "Class(n)"
// for anything else.
func (c Class) String() string {
	if c.Valid() {
		return classNames[c]
	}
	return fmt.Sprintf("Class(%d)", uint8(c))
}

// Classifier sorts a request into its Class. It must be fast and safe for
// concurrent use: it runs on every request before anything else.
type Classifier func(*http.Request) Class

// DefaultTestModeHeader is the header whose presence (any non-empty value)
// marks a request as test-mode traffic for the default classifier.
const DefaultTestModeHeader = "X-Test-Mode"

// ClassifierOptions configure NewClassifier. Nil options mean defaults.
type ClassifierOptions struct {
	// Critical reports whether a request is critical, which wins over
	// everything else. default: no request is critical
	Critical func(*http.Request) bool
	// TestModeHeader names the header that marks test-mode traffic when
	// it has any non-empty value; a client can only lower its own
	// priority with it. default: DefaultTestModeHeader
	TestModeHeader string
}

// NewClassifier returns a Classifier by Stripe's rules: critical requests
// (as Critical says), then test-mode ones (TestModeHeader set), then by
// method: GET, HEAD, OPTIONS and TRACE are Read, every other method Write.
func NewClassifier(o *ClassifierOptions) (Classifier, error) {
	var opts ClassifierOptions
	if o != nil {
		opts = *o
	}
	if opts.TestModeHeader == "" {
		opts.TestModeHeader = DefaultTestModeHeader
	}
	if !validHeaderName(opts.TestModeHeader) {
		return nil, fmt.Errorf("shed: ClassifierOptions.TestModeHeader %q is not a header name", opts.TestModeHeader)
	}
	return newClassifier(opts.Critical, opts.TestModeHeader), nil
}

// DefaultClassifier classifies as NewClassifier(nil) does: nothing
// critical, test mode marked by DefaultTestModeHeader, reads and writes by
// method.
func DefaultClassifier(r *http.Request) Class { return defaultClassifier(r) }

var defaultClassifier = newClassifier(nil, DefaultTestModeHeader)

func newClassifier(critical func(*http.Request) bool, testHeader string) Classifier {
	header := http.CanonicalHeaderKey(testHeader)
	return func(r *http.Request) Class {
		switch {
		case critical != nil && critical(r):
			return Critical
		case r.Header.Get(header) != "":
			return TestMode
		}
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
			return Read
		}
		return Write
	}
}

// validHeaderName reports whether s is an HTTP token (RFC 9110 field-name).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
