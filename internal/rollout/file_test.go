package rollout_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/internal/rollout"
)

func TestMarshal(t *testing.T) {
	tests := []struct {
		in      rollout.Settings
		want    string
		wantErr error
	}{
		{rollout.Settings{Percent: 0}, `{"percent":0,"mirror":false}` + "\n", nil},
		{rollout.Settings{Percent: 25, Mirror: true}, `{"percent":25,"mirror":true}` + "\n", nil},
		{rollout.Settings{Percent: 100}, `{"percent":100,"mirror":false}` + "\n", nil},
		{rollout.Settings{Percent: -1}, "", rollout.ErrPercent},
		{rollout.Settings{Percent: 101, Mirror: true}, "", rollout.ErrPercent},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%+v", tt.in), func(t *testing.T) {
			got, err := rollout.Marshal(tt.in)
			if !errors.Is(err, tt.wantErr) || (err != nil) != (tt.wantErr != nil) {
				t.Fatalf("rollout.Marshal(%+v) error = %v, want %v", tt.in, err, tt.wantErr)
			}
			if string(got) != tt.want {
				t.Errorf("rollout.Marshal(%+v) = %q, want %q", tt.in, got, tt.want)
			}
			if err != nil {
				return
			}
			back, err := rollout.Parse(got)
			if err != nil || back != tt.in {
				t.Errorf("rollout.Parse(%q) = %+v, %v; want %+v", got, back, err, tt.in)
			}
		})
	}
}

// FuzzMarshal: every settings value is refused with rollout.ErrPercent or
// written as content that the strict reader takes back unchanged.
func FuzzMarshal(f *testing.F) {
	for _, p := range []int{-1, 0, 1, 50, 100, 101, 1 << 40} {
		f.Add(p, true)
	}
	f.Fuzz(func(t *testing.T, p int, mirror bool) {
		s := rollout.Settings{Percent: p, Mirror: mirror}
		data, err := rollout.Marshal(s)
		if p < 0 || p > 100 {
			if !errors.Is(err, rollout.ErrPercent) {
				t.Fatalf("rollout.Marshal(%+v) error = %v, want rollout.ErrPercent", s, err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if back, err := rollout.Parse(data); err != nil || back != s {
			t.Fatalf("rollout.Parse(%q) = %+v, %v; want %+v", data, back, err, s)
		}
	})
}

// dirNames lists the names in dir, to see that no temporary file is left.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func TestWriteNewAndExisting(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rollout.json")

	if err := rollout.Write(path, rollout.Settings{Percent: 10, Mirror: true}); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if runtime.GOOS != "windows" && info.Mode().Perm() != 0o644 {
		t.Errorf("a new file's mode = %v, want 0644", info.Mode().Perm())
	}
	if got, err := rollout.Read(path); err != nil || got != (rollout.Settings{Percent: 10, Mirror: true}) {
		t.Fatalf("Read = %+v, %v", got, err)
	}

	// A File watching the path sees the replacement on its next check.
	src, err := flags.NewFile(path, &flags.FileOptions{Interval: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := rollout.Write(path, rollout.Settings{Percent: 0, Mirror: true}); err != nil {
		t.Fatal(err)
	}
	if err := src.Reload(); err != nil {
		t.Fatal(err)
	}
	if src.Percent() != 0 || !src.Mirroring() {
		t.Errorf("the File after the write: percent %d, mirroring %v; want 0, true", src.Percent(), src.Mirroring())
	}
	info, err = os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if runtime.GOOS != "windows" && info.Mode().Perm() != 0o600 {
		t.Errorf("the replaced file's mode = %v, want 0600 kept", info.Mode().Perm())
	}
	if names := dirNames(t, dir); len(names) != 1 {
		t.Errorf("directory holds %v, want only rollout.json", names)
	}
}

func TestWriteFollowsLink(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("symbolic links need privileges on Windows")
	}
	dir := t.TempDir()
	target := filepath.Join(dir, "rollout-v1.json")
	link := filepath.Join(dir, "rollout.json")
	if err := os.WriteFile(target, []byte(`{"percent": 5}`), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("rollout-v1.json", link); err != nil {
		t.Fatal(err)
	}
	if err := rollout.Write(link, rollout.Settings{Percent: 50}); err != nil {
		t.Fatal(err)
	}
	if l, err := os.Lstat(link); err != nil || l.Mode()&fs.ModeSymlink == 0 {
		t.Fatalf("the link was replaced: %v, %v", l.Mode(), err)
	}
	if got, err := rollout.Read(target); err != nil || got.Percent != 50 {
		t.Errorf("target reads %+v, %v; want percent 50", got, err)
	}
	if info, _ := os.Stat(target); info.Mode().Perm() != 0o640 {
		t.Errorf("target mode = %v, want 0640 kept", info.Mode().Perm())
	}
}

func TestWriteRefuses(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "adir")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	dangling := filepath.Join(dir, "dangling.json")
	if runtime.GOOS != "windows" {
		if err := os.Symlink("nowhere.json", dangling); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name    string
		path    string
		s       rollout.Settings
		wantErr string
		is      error
	}{
		{"empty path", "", rollout.Settings{Percent: 1}, "the path is empty", nil},
		{"percent above 100", filepath.Join(dir, "x.json"), rollout.Settings{Percent: 101}, "", rollout.ErrPercent},
		{"negative percent", filepath.Join(dir, "x.json"), rollout.Settings{Percent: -5}, "", rollout.ErrPercent},
		{"a directory", sub, rollout.Settings{Percent: 1}, "is a directory, not a regular file", nil},
		{"missing directory", filepath.Join(dir, "nope", "x.json"), rollout.Settings{Percent: 1}, "", fs.ErrNotExist},
	}
	if runtime.GOOS != "windows" {
		tests = append(tests, struct {
			name    string
			path    string
			s       rollout.Settings
			wantErr string
			is      error
		}{"dangling link", dangling, rollout.Settings{Percent: 1}, "a link to a file that does not exist", nil})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := rollout.Write(tt.path, tt.s)
			if err == nil {
				t.Fatal("Write succeeded")
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %v does not match %v", err, tt.is)
			}
			if tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %q does not say %q", err, tt.wantErr)
			}
		})
	}
	want := []string{"adir"}
	if runtime.GOOS != "windows" {
		want = append(want, "dangling.json")
	}
	if names := dirNames(t, dir); fmt.Sprint(names) != fmt.Sprint(want) {
		t.Errorf("directory holds %v after the refusals, want %v", names, want)
	}
}

func TestReadRefuses(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"percent": 5, "PERCENT": 6}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := rollout.Read(bad); !errors.Is(err, rollout.ErrSettings) || !strings.Contains(err.Error(), bad) {
		t.Errorf("invalid file: error %v, want rollout.ErrSettings naming the file", err)
	}
	if _, err := rollout.Read(filepath.Join(dir, "missing.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: error %v, want fs.ErrNotExist", err)
	}
	if _, err := rollout.Read(dir); err == nil || !strings.Contains(err.Error(), "a directory") {
		t.Errorf("directory: error %v, want one saying it is a directory", err)
	}
	if _, err := rollout.Read(""); err == nil {
		t.Error("empty path: no error")
	}
}

// TestWriteAtomic: readers that check the file while writers replace
// it only ever read whole, valid settings, one of those written.
func TestWriteAtomic(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rollout.json")
	if err := rollout.Write(path, rollout.Settings{Percent: 0}); err != nil {
		t.Fatal(err)
	}
	const writers, writes = 4, 50
	var wg sync.WaitGroup
	done := make(chan struct{})
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range writes {
				if err := rollout.Write(path, rollout.Settings{Percent: (w*writes + i) % 101, Mirror: i%2 == 0}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	readErr := make(chan error, 1)
	go func() {
		defer close(readErr)
		for {
			select {
			case <-done:
				return
			default:
			}
			if _, err := rollout.Read(path); err != nil {
				readErr <- err
				return
			}
		}
	}()
	wg.Wait()
	close(done)
	if err := <-readErr; err != nil {
		t.Fatalf("a reader saw a partial or missing file: %v", err)
	}
	if names := dirNames(t, filepath.Dir(path)); len(names) != 1 {
		t.Errorf("directory holds %v, want only rollout.json", names)
	}
}
