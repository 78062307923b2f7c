package flags

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/throttlekit/throttlekit/flags/internal/flagstest"
	"github.com/throttlekit/throttlekit/internal/rollout"
	"github.com/throttlekit/throttlekit/throttler"
)

// BenchmarkRouterTake: the Router's added cost per call is each source's
// figure minus "direct". The Unleash source's figure is in package
// flags/unleash.
func BenchmarkRouterTake(b *testing.B) {
	dir := b.TempDir()
	path := filepath.Join(dir, "rollout.json")
	if err := os.WriteFile(path, []byte(`{"percent": 50}`), 0o644); err != nil {
		b.Fatal(err)
	}
	file, err := NewFile(path, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer file.Close()
	backends := []struct {
		name string
		b    throttler.Backend
	}{
		{"direct", &flagstest.Nop{}},
		{"static", router(b, &flagstest.Nop{}, &flagstest.Nop{}, percent(b, 50), nil)},
		{"static-0pct", router(b, &flagstest.Nop{}, &flagstest.Nop{}, percent(b, 0), nil)},
		{"file", router(b, &flagstest.Nop{}, &flagstest.Nop{}, file, nil)},
	}
	for _, bb := range backends {
		flagstest.BenchTake(b, bb.name, bb.b)
	}
}

func BenchmarkBucket(b *testing.B) {
	keys := flagstest.BenchKeys()
	bk := rollout.NewBucketer(DefaultGroupID)
	b.ReportAllocs()
	cpu := flagstest.StartThreadCPU(b)
	for i := 0; b.Loop(); i++ {
		bk.Bucket(keys[i&1023])
	}
	cpu.Report(b)
}
