package flags

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	// Atomic replacement, as the documentation tells operators.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestFileReload walks a file through good, bad, missing and good again,
// checking it explicitly with Reload.
func TestFileReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rollout.json")
	writeFile(t, path, `{"percent": 10}`)
	var reported []error
	var changes []Settings
	var f *File
	f, err := NewFile(path, &FileOptions{
		Interval: time.Hour, // only Reload checks here
		OnError: func(err error) {
			if f.Err() == nil { // hooks may call back into the source
				t.Error("OnError called while Err() is nil")
			}
			reported = append(reported, err)
		},
		OnChange: func(s Settings) { changes = append(changes, s) },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	steps := []struct {
		name     string
		content  string // "" removes the file
		want     Settings
		wantErr  bool
		reported int
	}{
		{"ramp", `{"percent": 25, "mirror": true}`, Settings{25, true}, false, 0},
		{"unchanged", `{"percent": 25, "mirror": true}`, Settings{25, true}, false, 0},
		{"bad json keeps last good", `{"percent": 2`, Settings{25, true}, true, 1},
		{"the same bad file is reported once", `{"percent": 2`, Settings{25, true}, true, 1},
		{"out of range keeps last good", `{"percent": 200}`, Settings{25, true}, true, 2},
		{"wrong case keeps last good", `{"PERCENT": 50}`, Settings{25, true}, true, 3},
		{"duplicate keeps last good", `{"percent": 50, "percent": 60}`, Settings{25, true}, true, 4},
		{"missing keeps last good", "", Settings{25, true}, true, 5},
		{"still missing is reported once", "", Settings{25, true}, true, 5},
		{"rollback", `{"percent": 0}`, Settings{0, false}, false, 5},
	}
	for _, s := range steps {
		if s.content == "" {
			os.Remove(path)
		} else {
			writeFile(t, path, s.content)
		}
		err := f.Reload()
		if (err != nil) != s.wantErr {
			t.Fatalf("%s: Reload() = %v, want error %v", s.name, err, s.wantErr)
		}
		if err != nil && (!strings.HasPrefix(err.Error(), "flags: ") || strings.Count(err.Error(), "flags:") != 1) {
			t.Errorf("%s: error %q does not have exactly one package prefix", s.name, err)
		}
		if !errors.Is(f.Err(), err) {
			t.Errorf("%s: Err() = %v, want %v", s.name, f.Err(), err)
		}
		if got := f.settings(); got != s.want {
			t.Errorf("%s: Settings() = %+v, want %+v", s.name, got, s.want)
		}
		if f.Mirroring() != s.want.Mirror {
			t.Errorf("%s: Mirroring() = %v", s.name, f.Mirroring())
		}
		if len(reported) != s.reported {
			t.Errorf("%s: %d errors reported, want %d", s.name, len(reported), s.reported)
		}
	}
	if want := []Settings{{25, true}, {0, false}}; len(changes) != len(want) || changes[0] != want[0] || changes[1] != want[1] {
		t.Errorf("OnChange saw %+v, want %+v", changes, want)
	}
}

func TestFileRoutesLikePercent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rollout.json")
	writeFile(t, path, `{"percent": 37}`)
	f, err := NewFile(path, &FileOptions{GroupID: "ratelimit-redis"})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, err := NewPercentFor("ratelimit-redis", 37)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range testKeys(10000) {
		if f.UseNew(k) != p.UseNew(k) {
			t.Fatalf("key %q: file and static source disagree", k)
		}
	}
}

func TestNewFileErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	writeFile(t, bad, `{"percent": "all"}`)
	good := filepath.Join(dir, "good.json")
	writeFile(t, good, `{"percent": 5}`)
	tests := []struct {
		name string
		path string
		opts *FileOptions
		want string // the error's start
	}{
		{"empty path", "", nil, "flags: rollout file: the path is empty"},
		{"missing", filepath.Join(dir, "missing.json"), nil, "flags: rollout file: open "},
		{"invalid", bad, nil, "flags: invalid rollout settings: " + bad + ": json: "},
		{"a directory", dir, nil, "flags: rollout file: " + dir + " is a directory, not a regular file"},
		{"negative interval", good, &FileOptions{Interval: -time.Second}, "flags: FileOptions.Interval is -1s; want 0 (default 1s) or more"},
		{"negative timeout", good, &FileOptions{Timeout: -time.Millisecond}, "flags: FileOptions.Timeout is -1ms; want 0 (default 1s) or more"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := NewFile(tt.path, tt.opts)
			if err == nil || f != nil {
				if f != nil {
					f.Close()
				}
				t.Fatalf("NewFile(%q) = %v, %v; want an error", tt.path, f, err)
			}
			if !strings.HasPrefix(err.Error(), tt.want) || strings.Count(err.Error(), "flags:") != 1 {
				t.Errorf("NewFile(%q) error %q, want it to start %q, with one package prefix", tt.path, err, tt.want)
			}
		})
	}
}

// TestFileWatches lets the checking goroutine find a change by itself, and
// that Close stops it.
func TestFileWatches(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	path := filepath.Join(t.TempDir(), "rollout.json")
	writeFile(t, path, `{"percent": 5}`)
	changed := make(chan Settings, 10)
	var mu sync.Mutex
	var errs []error
	f, err := NewFile(path, &FileOptions{
		Interval: 5 * time.Millisecond,
		OnChange: func(s Settings) { changed <- s },
		OnError:  func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, `{"percent": 60, "mirror": true}`)
	select {
	case s := <-changed:
		if s != (Settings{60, true}) || f.settings() != s {
			t.Errorf("OnChange(%+v), Settings() = %+v; want {60 true}", s, f.settings())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the change was not picked up within 10s")
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close() // twice is fine
	mu.Lock()
	defer mu.Unlock()
	if len(errs) != 0 {
		t.Errorf("errors reported for good files: %v", errs)
	}
}

// An edit in place that keeps the size and the modification time (a second
// write within the file system's timestamp granularity, or a tool that
// restores the time) is still seen: the source compares content.
func TestFileSeesAnEditWithTheSameSizeAndTime(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rollout.json")
	stamp := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC) // long past: nothing counts as just modified
	write := func(content string) os.FileInfo {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil { // in place: same inode
			t.Fatal(err)
		}
		if err := os.Chtimes(path, stamp, stamp); err != nil {
			t.Fatal(err)
		}
		info, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return info
	}
	before := write(`{"percent": 10}`)
	changed := make(chan Settings, 1)
	f, err := NewFile(path, &FileOptions{Interval: time.Millisecond, OnChange: func(s Settings) { changed <- s }})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	after := write(`{"percent": 20}`)
	if !os.SameFile(before, after) || before.Size() != after.Size() || !before.ModTime().Equal(after.ModTime()) {
		t.Fatalf("the edit changed the file's identity, size or time: the test proves nothing")
	}
	// The periodic check, not Reload, which could always re-read.
	select {
	case s := <-changed:
		if s.Percent != 20 || f.settings().Percent != 20 {
			t.Errorf("OnChange(%+v), Settings() = %+v; want percent 20", s, f.settings())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the edit was not seen within 10s; Settings() = %+v", f.settings())
	}
}

// hungRead is a read function that blocks until released, as a read on a
// hung network mount does, and counts the reads started.
type hungRead struct {
	release chan struct{}
	started atomic.Int32
	content string
}

func (h *hungRead) read(string) ([]byte, error) {
	if h.started.Add(1) > 1 {
		<-h.release
	}
	return []byte(h.content), nil
}

// A read that hangs is an error after Timeout that keeps the last good
// settings, is reported once, and never doubles up with a second read;
// once it returns, its content is used.
func TestFileReadTimesOut(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	path := filepath.Join(t.TempDir(), "rollout.json") // never read: the reads are hung's
	hung := &hungRead{release: make(chan struct{}), content: `{"percent": 30}`}
	var reported []error
	f, err := newFile(path, &FileOptions{
		Interval: time.Hour, Timeout: 10 * time.Millisecond,
		OnError: func(err error) { reported = append(reported, err) },
	}, hung.read) // the first read, NewFile's, answers at once
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	hung.content = `{"percent": 40}`
	for i := range 3 {
		err := f.Reload()
		if !errors.Is(err, os.ErrDeadlineExceeded) || !strings.HasPrefix(err.Error(), "flags: rollout file: reading "+path+" did not finish within 10ms") {
			t.Fatalf("Reload %d = %v, want a timeout", i, err)
		}
		if f.settings().Percent != 30 || !errors.Is(f.Err(), os.ErrDeadlineExceeded) {
			t.Fatalf("Reload %d: Settings() = %+v, Err() = %v; want the last good 30 and the timeout", i, f.settings(), f.Err())
		}
	}
	if n := hung.started.Load(); n != 2 || len(reported) != 1 {
		t.Errorf("%d reads started, %d errors reported; want 2 (NewFile's and one hung) and 1", n, len(reported))
	}
	close(hung.release)
	if err := f.Reload(); err != nil || f.settings().Percent != 40 || f.Err() != nil {
		t.Errorf("Reload once the read returned = %v; Settings() = %+v, Err() = %v; want nil, 40, nil", err, f.settings(), f.Err())
	}
}

// Close never waits for a read in progress, in the checking goroutine or in
// a Reload; a Reload after Close reads nothing.
func TestFileCloseDoesNotWaitForARead(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	hung := &hungRead{release: make(chan struct{}), content: `{"percent": 30}`}
	f, err := newFile("rollout.json", &FileOptions{Interval: time.Millisecond, Timeout: time.Hour}, hung.read)
	if err != nil {
		t.Fatal(err)
	}
	// The checking goroutine starts the second read, which hangs, and a
	// Reload waits for the same read.
	for hung.started.Load() < 2 {
		runtime.Gosched()
	}
	reloaded := make(chan error, 1)
	go func() { reloaded <- f.Reload() }()
	closed := make(chan error, 1)
	go func() { closed <- f.Close() }()
	for _, ch := range []chan error{closed, reloaded} {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal("Close or Reload waited for the hung read")
		}
	}
	if err := f.Reload(); !errors.Is(err, errFileClosed) || f.settings().Percent != 30 {
		t.Errorf("Reload after Close = %v, Settings() = %+v; want %v and 30", err, f.settings(), errFileClosed)
	}
	if n := hung.started.Load(); n != 2 {
		t.Errorf("%d reads started, want 2", n)
	}
	close(hung.release) // the reader goroutine ends; goleak checks it
}

// NewFile gives up on a file it cannot read within Timeout.
func TestNewFileReadTimesOut(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	f, err := newFile("rollout.json", &FileOptions{Timeout: 10 * time.Millisecond}, func(string) ([]byte, error) {
		<-release
		return nil, nil
	})
	if f != nil || !errors.Is(err, os.ErrDeadlineExceeded) || strings.Count(err.Error(), "flags:") != 1 {
		t.Fatalf("newFile = %v, %v; want a timeout with one package prefix", f, err)
	}
}
