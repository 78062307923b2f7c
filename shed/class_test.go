package shed_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
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

func TestClassifier(t *testing.T) {
	critical, err := shed.NewClassifier(&shed.ClassifierOptions{
		Critical:       func(r *http.Request) bool { return r.URL.Path == "/v1/charges" && r.Method == http.MethodPost },
		TestModeHeader: "stripe-test",
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		c    shed.Classifier
		r    *http.Request
		want shed.Class
	}{
		{"get", shed.DefaultClassifier, newRequest("GET", "/x"), shed.Read},
		{"head", shed.DefaultClassifier, newRequest("HEAD", "/x"), shed.Read},
		{"options", shed.DefaultClassifier, newRequest("OPTIONS", "/x"), shed.Read},
		{"post", shed.DefaultClassifier, newRequest("POST", "/x"), shed.Write},
		{"delete", shed.DefaultClassifier, newRequest("DELETE", "/x"), shed.Write},
		{"custom method", shed.DefaultClassifier, newRequest("PURGE", "/x"), shed.Write},
		{"test mode get", shed.DefaultClassifier, newRequest("GET", "/x", "X-Test-Mode", "1"), shed.TestMode},
		{"test mode post", shed.DefaultClassifier, newRequest("POST", "/x", "x-test-mode", "yes"), shed.TestMode},
		{"empty marker", shed.DefaultClassifier, newRequest("POST", "/x", "X-Test-Mode", ""), shed.Write},
		{"nothing critical by default", shed.DefaultClassifier, newRequest("POST", "/v1/charges"), shed.Write},
		{"critical", critical, newRequest("POST", "/v1/charges", "Stripe-Test", "1"), shed.Critical},
		{"custom marker", critical, newRequest("GET", "/v1/charges", "Stripe-Test", "1"), shed.TestMode},
		{"default marker not used", critical, newRequest("GET", "/v1/charges", "X-Test-Mode", "1"), shed.Read},
	} {
		if got := tc.c(tc.r); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestNewClassifierErrors(t *testing.T) {
	for _, h := range []string{"X Test", "X-Test:", "Tést", "X\nY"} {
		c, err := shed.NewClassifier(&shed.ClassifierOptions{TestModeHeader: h})
		if err == nil || !strings.HasPrefix(err.Error(), "shed: ClassifierOptions.TestModeHeader") {
			t.Errorf("header %q: %v, %v; want an error", h, c != nil, err)
		}
	}
}

func TestClassString(t *testing.T) {
	for c, want := range map[shed.Class]string{shed.Critical: "critical", shed.Write: "write", shed.Read: "read", shed.TestMode: "test-mode", 7: "Class(7)"} {
		if got := c.String(); got != want || c.Valid() != (c < 4) {
			t.Errorf("Class(%d): %q valid=%v, want %q", uint8(c), got, c.Valid(), want)
		}
	}
}
