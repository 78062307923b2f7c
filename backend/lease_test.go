package backend_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/throttlekit/throttlekit/throttler"
)

func TestValidateLease(t *testing.T) {
	p := throttler.Concurrent(3, time.Second)
	tests := []struct {
		key  string
		p    throttler.ConcurrencyPolicy
		id   throttler.LeaseID
		want error
	}{
		{"k", p, 1, nil},
		{"", p, 1, throttler.ErrInvalidKey},
		{"k", throttler.Concurrent(0, time.Second), 1, throttler.ErrInvalidPolicy},
		{"k", throttler.Concurrent(1, 0), 1, throttler.ErrInvalidPolicy},
		{"k", p, 0, throttler.ErrInvalidLease},
	}
	for _, tc := range tests {
		err := throttler.ValidateLease(tc.key, tc.p, tc.id)
		if tc.want == nil {
			assert.NoError(t, err)
			continue
		}
		assert.ErrorIs(t, err, tc.want, "%q %v %d", tc.key, tc.p, tc.id)
		assert.True(t, throttler.IsInputError(err))
	}
}
