package shed_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/throttlekit/throttlekit/shed"
)

func newRequest(method, path string, header ...string) *http.Request {
	r := httptest.NewRequest(method, path, nil)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	return r
}

func TestClassString(t *testing.T) {
	for c, want := range map[shed.Class]string{shed.Critical: "critical", shed.Write: "write", shed.Read: "read", shed.TestMode: "test-mode", 7: "Class(7)"} {
		if got := c.String(); got != want {
			t.Errorf("Class(%d): %q, want %q", uint8(c), got, want)
		}
	}
}
