package main

import (
	"bytes"
	"os"
	"testing"
)

// TestCommittedPlot: docs/shedding.svg is what this program writes now.
// After changing the shedder or the plot, regenerate it with
// `go -C benchmarks run ./cmd/shedsim > docs/shedding.svg`.
func TestCommittedPlot(t *testing.T) {
	committed, err := os.ReadFile("../../../docs/shedding.svg")
	if err != nil {
		t.Fatal(err)
	}
	var now bytes.Buffer
	if err := render(&now); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(committed, now.Bytes()) {
		t.Fatal("docs/shedding.svg is stale: run `go -C benchmarks run ./cmd/shedsim > docs/shedding.svg`")
	}
}
