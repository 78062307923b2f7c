package backend_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

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
	var named interface{ FailedStore() string }
	if assert.ErrorAs(t, fmt.Errorf("router: %w", store), &named) {
		assert.Equal(t, "redis shard 1", named.FailedStore())
	}

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
