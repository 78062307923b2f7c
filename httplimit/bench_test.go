package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/httplimit"
	"github.com/throttlekit/throttlekit/throttler"
)

// BenchmarkRate is one allowed request through Rate: the
// key, the decision, the headers and the wrapped writer.
func BenchmarkRate(b *testing.B) {
	th := newThrottler(b, newMemory(b), nil)
	mw := newRate(b, th, throttler.Policy{Name: "bench", Limit: 1 << 40, Window: time.Hour}, httplimit.KeyByHeader("X-Client"), nil)
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-Client", "alice")
	w := httptest.NewRecorder()
	b.ReportAllocs()
	for b.Loop() {
		h.ServeHTTP(w, r)
	}
}
