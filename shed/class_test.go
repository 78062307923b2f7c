package shed_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/throttlekit/throttlekit/internal/cputime"
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

// TestClassifier: Options' classification by Stripe's rules, with its
// defaults and with Critical and TestModeHeader set, or Classify instead.
func TestClassifier(t *testing.T) {
	stripe := &shed.Options{
		Critical:       func(r *http.Request) bool { return r.URL.Path == "/v1/charges" && r.Method == http.MethodPost },
		TestModeHeader: "stripe-test",
	}
	custom := &shed.Options{Classify: func(r *http.Request) shed.Class {
		if strings.HasPrefix(r.Header.Get("Authorization"), "sk_test_") {
			return shed.TestMode
		}
		return shed.Critical
	}}
	for _, tc := range []struct {
		name string
		o    *shed.Options
		r    *http.Request
		want shed.Class
	}{
		{"get", &shed.Options{}, newRequest("GET", "/x"), shed.Read},
		{"head", &shed.Options{}, newRequest("HEAD", "/x"), shed.Read},
		{"options", &shed.Options{}, newRequest("OPTIONS", "/x"), shed.Read},
		{"trace", &shed.Options{}, newRequest("TRACE", "/x"), shed.Read},
		{"post", &shed.Options{}, newRequest("POST", "/x"), shed.Write},
		{"delete", &shed.Options{}, newRequest("DELETE", "/x"), shed.Write},
		{"custom method", &shed.Options{}, newRequest("PURGE", "/x"), shed.Write},
		{"test mode get", &shed.Options{}, newRequest("GET", "/x", "X-Test-Mode", "1"), shed.TestMode},
		{"test mode post", &shed.Options{}, newRequest("POST", "/x", "x-test-mode", "yes"), shed.TestMode},
		{"empty marker", &shed.Options{}, newRequest("POST", "/x", "X-Test-Mode", ""), shed.Write},
		{"nothing critical by default", &shed.Options{}, newRequest("POST", "/v1/charges"), shed.Write},
		{"critical", stripe, newRequest("POST", "/v1/charges", "Stripe-Test", "1"), shed.Critical},
		{"custom marker", stripe, newRequest("GET", "/v1/charges", "Stripe-Test", "1"), shed.TestMode},
		{"default marker not used", stripe, newRequest("GET", "/v1/charges", "X-Test-Mode", "1"), shed.Read},
		{"Classify", custom, newRequest("GET", "/x", "X-Test-Mode", "1"), shed.Critical},
		{"Classify test key", custom, newRequest("POST", "/x", "Authorization", "sk_test_1"), shed.TestMode},
	} {
		classify, err := shed.Classifier(tc.o)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := classify(tc.r); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestClassifierErrors(t *testing.T) {
	for _, h := range []string{"X Test", "X-Test:", "Tést", "X\nY"} {
		c, err := shed.Classifier(&shed.Options{TestModeHeader: h})
		if err == nil || !strings.HasPrefix(err.Error(), "shed: Options.TestModeHeader") {
			t.Errorf("header %q: %v, %v; want an error", h, c != nil, err)
		}
	}
	classify := func(*http.Request) shed.Class { return shed.Read }
	for _, o := range []*shed.Options{
		{Classify: classify, TestModeHeader: "X-Test"},
		{Classify: classify, Critical: func(*http.Request) bool { return true }},
	} {
		if _, err := shed.Classifier(o); err == nil || !strings.Contains(err.Error(), "Classify replaces Critical and TestModeHeader") {
			t.Errorf("Classify beside Stripe's options: %v, want an error", err)
		}
	}
}

// BenchmarkDefaultClassifier is the classification Middleware runs on every
// request when Options set none of Critical, TestModeHeader and Classify.
func BenchmarkDefaultClassifier(b *testing.B) {
	classify, err := shed.Classifier(&shed.Options{})
	if err != nil {
		b.Fatal(err)
	}
	r := newRequest("GET", "/v1/charges")
	b.ReportAllocs()
	report := cputime.Measure(b)
	for b.Loop() {
		if classify(r) != shed.Read {
			b.Fatal("not a read")
		}
	}
	report(b.N)
}
