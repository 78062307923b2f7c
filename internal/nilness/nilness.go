// Package nilness tells constructors when a value they were given is nil,
// including a nil pointer held in an interface (a *redis.Client variable
// never assigned), which compares unequal to nil and would otherwise fail,
// or panic, on the first call instead of when the thing is built.
package nilness

import (
	"fmt"
	"reflect"
)

// IsNil reports whether v is nil or holds a nil pointer, map, slice,
// function, interface or channel.
func IsNil(v any) bool {
	if v == nil {
		return true
	}
	switch r := reflect.ValueOf(v); r.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Interface, reflect.Chan:
		return r.IsNil()
	}
	return false
}

// Check returns "<what> is nil" or "<what> is a nil <type>" as an error
// when v is nil, and nil otherwise.
func Check(what string, v any) error {
	switch {
	case v == nil:
		return fmt.Errorf("%s is nil", what)
	case IsNil(v):
		return fmt.Errorf("%s is a nil %T", what, v)
	}
	return nil
}
