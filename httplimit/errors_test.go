package httplimit_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/httplimit"
	"github.com/throttlekit/throttlekit/throttler"
)

// failOpen and failClosed name the values of throttler.Options.FailClosed.
const failOpen, failClosed = false, true

// TestErrorStatuses: both middlewares answer a request they could not
// decide through the one mapping of WriteError: 400 for the client's
// mistake, 499 for a client that has gone (whatever the failure mode), 503
// with Retry-After: 1 for a store that failed while failing closed or a
// request whose deadline passed. The stores fail a call whose context is
// done, as a network store does.
func TestErrorStatuses(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, stop := context.WithDeadline(context.Background(), time.Unix(1, 0)) // long past
	defer stop()
	long := func(*http.Request) (string, error) { return strings.Repeat("k", throttler.MaxKeyLen+1), nil }
	tests := []struct {
		name       string
		ctx        context.Context
		mode       bool
		down       bool // the store fails every call
		key        httplimit.KeyFunc
		status     int
		retryAfter string
	}{
		{"no key", context.Background(), failClosed, false, httplimit.KeyByHeader("X-Missing"), 400, ""},
		{"key too long", context.Background(), failClosed, false, long, 400, ""},
		{"no key, client gone", cancelled, failOpen, false, httplimit.KeyByHeader("X-Missing"), 400, ""},
		{"client gone, fail open", cancelled, failOpen, false, nil, 499, ""},
		{"client gone, fail closed", cancelled, failClosed, false, nil, 499, ""},
		{"deadline passed, fail open", expired, failOpen, false, nil, 503, "1"},
		{"store down, fail closed", context.Background(), failClosed, true, nil, 503, "1"},
		{"store down, fail open", context.Background(), failOpen, true, nil, 200, ""},
	}
	for _, tc := range tests {
		key := tc.key
		if key == nil {
			key = httplimit.KeyByHeader("X-Client")
		}
		// rate is over a store whose rate calls fail, concurrency over one
		// whose lease calls fail.
		rateStore := &netStore{Backend: &stubBackend{next: newMemory(t)}}
		leases := newNetLeases(t)
		if tc.down {
			rateStore.Backend.(*stubBackend).err = errDown
			leases.setFail(errDown)
		}
		o := &throttler.Options{FailClosed: tc.mode, Timeout: time.Minute}
		rate, err := httplimit.Rate(newThrottler(t, rateStore, o), throttler.PerMinute(5), key, nil)
		require.NoError(t, err)
		conc, err := httplimit.Concurrency(newThrottler(t, leases, o), throttler.Concurrent(5, time.Minute), key, nil)
		require.NoError(t, err)
		for name, mw := range map[string]func(http.Handler) http.Handler{"Rate": rate, "Concurrency": conc} {
			r := httptest.NewRequestWithContext(tc.ctx, http.MethodGet, "/", nil)
			r.Header.Set("X-Client", "alice")
			w := httptest.NewRecorder()
			mw(etagHandler).ServeHTTP(w, r)
			assert.Equal(t, tc.status, w.Code, "%s: %s", name, tc.name)
			assert.Equal(t, tc.retryAfter, w.Header().Get("Retry-After"), "%s: %s", name, tc.name)
			if tc.status != 200 {
				text := http.StatusText(tc.status)
				if tc.status == 499 {
					text = "Client Closed Request"
				}
				assert.Equal(t, text+"\n", w.Body.String(), "%s: %s: the status text alone", name, tc.name)
			}
		}
	}
}

// An error no limit returns is the server's: 500, without Retry-After.
func TestErrorUnknown(t *testing.T) {
	w := httptest.NewRecorder()
	httplimit.WriteError(w, httptest.NewRequest(http.MethodGet, "/", nil), errors.New("secret detail"))
	assert.Equal(t, http.StatusInternalServerError, w.Code)
	assert.Equal(t, "Internal Server Error\n", w.Body.String())
	assert.Empty(t, w.Header().Get("Retry-After"))
}

// A KeyFunc's error reaches OnError wrapped in ErrNoKey, with one prefix
// also when the KeyFunc wrapped ErrNoKey itself.
func TestKeyErrorsHaveOnePrefix(t *testing.T) {
	var errs []error
	o := &httplimit.Options{OnError: func(_ http.ResponseWriter, _ *http.Request, err error) { errs = append(errs, err) }}
	wrapsErrNoKey := func(*http.Request) (string, error) { return "", fmt.Errorf("%w: bad token", httplimit.ErrNoKey) }
	th := newThrottler(t, newMemory(t), nil)
	for _, key := range []httplimit.KeyFunc{httplimit.KeyByHeader("X-Missing"), wrapsErrNoKey} {
		serve(newRate(t, th, throttler.PerSecond(1), key, o)(etagHandler))
		conc, err := httplimit.Concurrency(th, throttler.Concurrent(1, time.Minute), key, o)
		require.NoError(t, err)
		serve(conc(etagHandler))
	}
	require.Len(t, errs, 4)
	for i, want := range []string{
		"httplimit: request has no client key: header X-Missing is empty",
		"httplimit: request has no client key: header X-Missing is empty",
		"httplimit: request has no client key: bad token",
		"httplimit: request has no client key: bad token",
	} {
		assert.EqualError(t, errs[i], want)
		assert.ErrorIs(t, errs[i], httplimit.ErrNoKey)
	}
}
