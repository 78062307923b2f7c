package sleep

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestContextEndsTheSleep(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Context(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled context ends an hour's sleep at once with its error, got %v", err)
	}
	if err := Context(context.Background(), time.Millisecond); err != nil {
		t.Fatalf("a sleep that runs out returns nil, got %v", err)
	}
}

func TestUpToStaysInItsBounds(t *testing.T) {
	for _, bound := range []time.Duration{-1, 0, 1, time.Millisecond} {
		for range 1000 {
			if d := UpTo(bound); d < 0 || d > max(bound, 0) {
				t.Fatalf("UpTo(%v) = %v, outside [0, %v]", bound, d, max(bound, 0))
			}
		}
	}
}
