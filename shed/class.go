package shed

import (
	"errors"
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

// String returns "critical", "write", "read" or "test-mode", and "Class(n)"
// for a value that is none of the four (which the shedders treat as Write).
func (c Class) String() string {
	if c < numClasses {
		return classNames[c]
	}
	return fmt.Sprintf("Class(%d)", uint8(c))
}

// defaultTestModeHeader is Options.TestModeHeader's default.
const defaultTestModeHeader = "X-Test-Mode"

// classifier is Options' classification: Classify, or else Stripe's rules
// with Critical and TestModeHeader.
func classifier(o *Options) (func(*http.Request) Class, error) {
	if o.Classify != nil {
		if o.Critical != nil || o.TestModeHeader != "" {
			return nil, errors.New("shed: Options.Classify replaces Critical and TestModeHeader: set either")
		}
		return o.Classify, nil
	}
	header := o.TestModeHeader
	if header == "" {
		header = defaultTestModeHeader
	}
	if !validHeaderName(header) {
		return nil, fmt.Errorf("shed: Options.TestModeHeader %q is not a header name", header)
	}
	return newClassifier(o.Critical, header), nil
}

// newClassifier classifies by Stripe's rules: critical requests (as
// critical says), then test-mode ones (testHeader set to anything), then
// by method: GET, HEAD, OPTIONS and TRACE are Read, every other method
// Write.
func newClassifier(critical func(*http.Request) bool, testHeader string) func(*http.Request) Class {
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
