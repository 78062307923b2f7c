package outbound_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/outbound"
	"github.com/throttlekit/throttlekit/throttler"
)

// TestDryRun: a policy in dry run sends every request at once, waiting or
// failing fast, and still counts them.
func TestDryRun(t *testing.T) {
	p := throttler.PerMinute(1).Named("gateway").DryRun()
	for _, failFast := range []bool{false, true} {
		f := newFleet(t, 1, outbound.Options{Policy: p, FailFast: failFast}, nil)
		for range 3 {
			assert.Equal(t, http.StatusOK, f.mustGet(t, 0).StatusCode, "FailFast %v", failFast)
		}
		assert.Len(t, f.remote.Calls(), 3, "FailFast %v", failFast)
		assert.Empty(t, f.w.Sleeps(), "FailFast %v", failFast)
		d, err := f.ths[0].Peek(context.Background(), gatewayKey, p)
		require.NoError(t, err)
		assert.True(t, d.WouldDeny, "FailFast %v", failFast)
		assert.Equal(t, int64(1), d.Used, "FailFast %v", failFast)
	}
}

// nilSet is an Enforcer that cannot be used as a nil pointer.
type nilSet struct{}

func (*nilSet) Enforced(string) bool { return true }

// A Route's policy with a nil Enforcer is an error of the request, before
// anything is sent.
func TestRouteWithABadEnforcer(t *testing.T) {
	route := func(*http.Request) (outbound.Route, error) {
		return outbound.Route{Policy: throttler.PerMinute(1).Named("gateway").EnforcedBy((*nilSet)(nil))}, nil
	}
	f := newFleet(t, 1, outbound.Options{Policy: perMinute, Route: route}, nil)
	_, err := f.get(t, 0)
	require.ErrorIs(t, err, throttler.ErrInvalidPolicy)
	assert.Empty(t, f.remote.Calls())
}
