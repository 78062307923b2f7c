//go:build unix

package flags

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// mkfifo makes a FIFO at path that no one ever writes to: opening it for
// reading the usual way waits for a writer for good.
func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Skipf("cannot make a FIFO here: %v", err)
	}
}

// returns runs f and fails the test if it has not returned within a
// generous deadline, instead of hanging the test run.
func returns(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s blocked on the FIFO", what)
	}
}

// A FIFO at the path is refused at once, at start.
func TestNewFileRefusesAFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rollout.json")
	mkfifo(t, path)
	var f *File
	var err error
	returns(t, "NewFile", func() { f, err = NewFile(path, nil) })
	want := "flags: rollout file: " + path + " is a named pipe (FIFO), not a regular file"
	if f != nil || err == nil || err.Error() != want {
		t.Fatalf("NewFile = %v, %v; want error %q", f, err, want)
	}
}

// A FIFO put in the file's place while the source runs is an error that
// keeps the last good settings; it holds neither the checks nor Close, and
// a good file afterwards is picked up again.
func TestFileRefusesAFIFOInItsPlace(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rollout.json")
	writeFile(t, path, `{"percent": 25, "mirror": true}`)
	f, err := NewFile(path, &FileOptions{Interval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	mkfifo(t, fifo)
	if err := os.Rename(fifo, path); err != nil {
		t.Fatal(err)
	}
	returns(t, "Reload", func() { err = f.Reload() })
	// Err is the same failure, not the same value: the source's own check
	// (every Interval) may have read the FIFO too and stored its error.
	if err == nil || !strings.Contains(err.Error(), "is a named pipe (FIFO), not a regular file") || f.Err() == nil || f.Err().Error() != err.Error() {
		t.Errorf("Reload = %v, Err() = %v; want the FIFO refused", err, f.Err())
	}
	if got := f.settings(); got != (Settings{25, true}) {
		t.Errorf("Settings() = %+v, want the last good {25 true}", got)
	}
	writeFile(t, path, `{"percent": 5}`)
	returns(t, "Reload", func() { err = f.Reload() })
	if err != nil || f.settings() != (Settings{5, false}) {
		t.Errorf("Reload = %v, Settings() = %+v; want the good file back", err, f.settings())
	}
	mkfifo(t, fifo)
	if err := os.Rename(fifo, path); err != nil {
		t.Fatal(err)
	}
	// The checking goroutine meets the FIFO too; Close still returns.
	returns(t, "Close", func() { err = f.Close() })
}
