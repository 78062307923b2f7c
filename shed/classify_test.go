package shed

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/throttlekit/throttlekit/internal/cputime"
)

func request(method, path string, header ...string) *http.Request {
	r := httptest.NewRequest(method, path, nil)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	return r
}

// TestClassifier: Options' classification by Stripe's rules, with its
// defaults and with Critical and TestModeHeader set, or Classify instead.
func TestClassifier(t *testing.T) {
	stripe := &Options{
		Critical:       func(r *http.Request) bool { return r.URL.Path == "/v1/charges" && r.Method == http.MethodPost },
		TestModeHeader: "stripe-test",
	}
	custom := &Options{Classify: func(r *http.Request) Class {
		if strings.HasPrefix(r.Header.Get("Authorization"), "sk_test_") {
			return TestMode
		}
		return Critical
	}}
	for _, tc := range []struct {
		name string
		o    *Options
		r    *http.Request
		want Class
	}{
		{"get", &Options{}, request("GET", "/x"), Read},
		{"head", &Options{}, request("HEAD", "/x"), Read},
		{"options", &Options{}, request("OPTIONS", "/x"), Read},
		{"trace", &Options{}, request("TRACE", "/x"), Read},
		{"post", &Options{}, request("POST", "/x"), Write},
		{"delete", &Options{}, request("DELETE", "/x"), Write},
		{"custom method", &Options{}, request("PURGE", "/x"), Write},
		{"test mode get", &Options{}, request("GET", "/x", "X-Test-Mode", "1"), TestMode},
		{"test mode post", &Options{}, request("POST", "/x", "x-test-mode", "yes"), TestMode},
		{"empty marker", &Options{}, request("POST", "/x", "X-Test-Mode", ""), Write},
		{"nothing critical by default", &Options{}, request("POST", "/v1/charges"), Write},
		{"critical", stripe, request("POST", "/v1/charges", "Stripe-Test", "1"), Critical},
		{"custom marker", stripe, request("GET", "/v1/charges", "Stripe-Test", "1"), TestMode},
		{"default marker not used", stripe, request("GET", "/v1/charges", "X-Test-Mode", "1"), Read},
		{"Classify", custom, request("GET", "/x", "X-Test-Mode", "1"), Critical},
		{"Classify test key", custom, request("POST", "/x", "Authorization", "sk_test_1"), TestMode},
	} {
		classify, err := classifier(tc.o)
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
		c, err := classifier(&Options{TestModeHeader: h})
		if err == nil || !strings.HasPrefix(err.Error(), "shed: Options.TestModeHeader") {
			t.Errorf("header %q: %v, %v; want an error", h, c != nil, err)
		}
	}
	classify := func(*http.Request) Class { return Read }
	for _, o := range []*Options{
		{Classify: classify, TestModeHeader: "X-Test"},
		{Classify: classify, Critical: func(*http.Request) bool { return true }},
	} {
		if _, err := classifier(o); err == nil || !strings.Contains(err.Error(), "Classify replaces Critical and TestModeHeader") {
			t.Errorf("Classify beside Stripe's options: %v, want an error", err)
		}
	}
}

// BenchmarkDefaultClassifier is the classification Middleware runs on every
// request when Options set none of Critical, TestModeHeader and Classify.
func BenchmarkDefaultClassifier(b *testing.B) {
	classify, err := classifier(&Options{})
	if err != nil {
		b.Fatal(err)
	}
	r := request("GET", "/v1/charges")
	b.ReportAllocs()
	report := cputime.Measure(b)
	for b.Loop() {
		if classify(r) != Read {
			b.Fatal("not a read")
		}
	}
	report()
}
