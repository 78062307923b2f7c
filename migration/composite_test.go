package migration

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/throttlekit/throttlekit/throttler"
)

// A Migration takes no composites, even between two stores that do: its
// Traits say so, and a call with one is an input error.
func TestMigrationRefusesComposites(t *testing.T) {
	m := newMigration(t, mem(t), mem(t), percent(t, 50), nil)
	assert.False(t, m.Traits().Composites)
	c := throttler.All(throttler.PerSecond(1).Named("s"), throttler.PerHour(5).Named("h"))
	now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	_, err := m.Take(context.Background(), "k", c, 1, now)
	assert.ErrorIs(t, err, throttler.ErrInvalidPolicy)
	_, err = m.Peek(context.Background(), "k", c, now)
	assert.ErrorIs(t, err, throttler.ErrInvalidPolicy)
}
