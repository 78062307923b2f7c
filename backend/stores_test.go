package backend_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/throttler"
)

// The marks add a sentinel without changing the message (one package
// prefix), and keep the cause.
func TestFailureMarks(t *testing.T) {
	cause := errors.New("redis: take \"k\": LOADING Redis is loading the dataset in memory")
	store := throttler.StoreFailure("redis shard 1", cause)
	assert.EqualError(t, store, cause.Error())
	assert.ErrorIs(t, store, cause)
	assert.ErrorIs(t, store, throttler.ErrUnavailable)
	assert.NotErrorIs(t, store, throttler.ErrKeyState)
	assert.Equal(t, "redis shard 1", blamedStore(t, fmt.Errorf("router: %w", store)), "a Throttler finds the name through a wrap")

	key := throttler.KeyFailure(cause)
	assert.EqualError(t, key, cause.Error())
	assert.ErrorIs(t, key, cause)
	assert.ErrorIs(t, key, throttler.ErrKeyState)
	assert.NotErrorIs(t, key, throttler.ErrUnavailable)
	assert.ErrorIs(t, fmt.Errorf("x: %w", key), throttler.ErrKeyState, "a Throttler finds it through a wrap")
	assert.ErrorIs(t, fmt.Errorf("x: %w", throttler.ErrKeyState), throttler.ErrKeyState, "wrapped directly too")

	assert.NoError(t, throttler.StoreFailure("s", nil))
	assert.NoError(t, throttler.KeyFailure(nil))
}

// blamedStore is the store a Throttler charges err to: the one whose
// breaker counts it, as err names it (throttler.StoreFailure); "" for the
// call's own store, or for an error that is no store failure.
func blamedStore(t testing.TB, err error) string {
	t.Helper()
	failing := backend.OpFunc(func(context.Context, throttler.Op, string, throttler.Policy, int64, time.Time, time.Time) (throttler.Decision, error) {
		return throttler.Decision{}, err
	})
	th, nerr := throttler.New(failing, nil)
	if nerr != nil {
		t.Fatal(nerr)
	}
	_, _ = th.Allow(context.Background(), "k", throttler.PerMinute(1))
	for _, b := range th.Breakers() {
		if b.Failures > 0 {
			return b.Store
		}
	}
	return "" // no store failure
}
