package backend_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

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

type namedStores struct{ acceptAll }

func (namedStores) Store(op throttler.Op, key string, _ throttler.Policy) string {
	if op == throttler.OpPeek {
		return "replicas of " + key
	}
	return "store of " + key
}

type acceptAll struct{}

func (acceptAll) Take(context.Context, string, throttler.Policy, int64, time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, nil
}

func (acceptAll) Peek(context.Context, string, throttler.Policy, time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, nil
}

func (acceptAll) Refund(context.Context, string, throttler.Policy, int64, time.Time, time.Time) (throttler.Decision, error) {
	return throttler.Decision{}, nil
}

func TestStoreOf(t *testing.T) {
	p := throttler.PerMinute(1)
	assert.Equal(t, "store of k", throttler.StoreOf(namedStores{}, throttler.OpTake, "k", p))
	assert.Equal(t, "replicas of k", throttler.StoreOf(namedStores{}, throttler.OpPeek, "k", p), "the op is passed on")
	assert.Equal(t, "", throttler.StoreOf(acceptAll{}, throttler.OpTake, "k", p), "a backend that names none is one store")
}
