package nilness

import (
	"bytes"
	"testing"
)

func TestCheck(t *testing.T) {
	var nilBuf *bytes.Buffer
	var nilFunc func()
	var nilMap map[string]int
	for _, tc := range []struct {
		v    any
		want string
	}{
		{nil, "x is nil"},
		{nilBuf, "x is a nil *bytes.Buffer"},
		{nilFunc, "x is a nil func()"},
		{nilMap, "x is a nil map[string]int"},
		{&bytes.Buffer{}, ""},
		{42, ""},
		{"", ""},
	} {
		err := Check("x", tc.v)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tc.want {
			t.Errorf("Check(%#v) = %q, want %q", tc.v, got, tc.want)
		}
		if IsNil(tc.v) != (tc.want != "") {
			t.Errorf("IsNil(%#v) = %v", tc.v, IsNil(tc.v))
		}
	}
}
