package flags

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestParseSettings(t *testing.T) {
	tests := []struct {
		in      string
		want    Settings
		wantErr string
	}{
		{`{"percent": 25}`, Settings{Percent: 25}, ""},
		{`{"percent": 0, "mirror": true}`, Settings{Percent: 0, Mirror: true}, ""},
		{" {\"mirror\": false, \"percent\": 100}\n", Settings{Percent: 100}, ""},
		{`{}`, Settings{}, `"percent" is missing`},
		{`{"mirror": true}`, Settings{}, `"percent" is missing`},
		{`{"percent": 101}`, Settings{}, "within [0, 100]"},
		{`{"percent": -1}`, Settings{}, "within [0, 100]"},
		{`{"percent": 12.5}`, Settings{}, "cannot unmarshal"},
		{`{"percent": "25"}`, Settings{}, "cannot unmarshal"},
		{`{"percnt": 25}`, Settings{}, "unknown field"},
		{`{"percent": 25}{"percent": 50}`, Settings{}, "data after"},
		{`{"percent": 25} x`, Settings{}, "data after"},
		{`[25]`, Settings{}, "cannot unmarshal"},
		{``, Settings{}, "EOF"},
		{`{"percent": 25`, Settings{}, "unexpected EOF"},
		{`{"percent": 25, "mirror": 1}`, Settings{}, "cannot unmarshal"},
		{strings.Repeat(" ", MaxFileSize) + `{"percent": 1}`, Settings{}, "at most"},
	}
	for _, tt := range tests {
		name := tt.in
		if len(name) > 40 {
			name = name[:40]
		}
		t.Run(name, func(t *testing.T) {
			got, err := ParseSettings([]byte(tt.in))
			if tt.wantErr == "" {
				if err != nil || got != tt.want {
					t.Fatalf("ParseSettings = %+v, %v; want %+v", got, err, tt.want)
				}
				return
			}
			if !errors.Is(err, ErrSettings) || !strings.Contains(err.Error(), tt.wantErr) || strings.Count(err.Error(), "flags:") != 1 {
				t.Fatalf("ParseSettings error = %v, want ErrSettings mentioning %q", err, tt.wantErr)
			}
		})
	}
}

func FuzzParseSettings(f *testing.F) {
	for _, s := range []string{`{"percent": 25}`, `{"percent": 0, "mirror": true}`, `{}`, `{"percent": 1e2}`, `null`, `{"percent": 5}garbage`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ParseSettings(data)
		if err != nil {
			if !errors.Is(err, ErrSettings) {
				t.Fatalf("error %v does not match ErrSettings", err)
			}
			return
		}
		if s.Percent < 0 || s.Percent > 100 {
			t.Fatalf("accepted percent %d", s.Percent)
		}
		// What was accepted is what the source routes by.
		p := percent(t, s.Percent)
		if p.Percent() != s.Percent {
			t.Fatalf("percent %d became %d", s.Percent, p.Percent())
		}
	})
}

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
		{"out of range keeps last good", `{"percent": 200}`, Settings{25, true}, true, 2},
		{"missing keeps last good", "", Settings{25, true}, true, 3},
		{"rollback", `{"percent": 0}`, Settings{0, false}, false, 3},
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
		if got := f.Settings(); got != s.want {
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
		{"missing", filepath.Join(dir, "missing.json"), nil, "flags: rollout file: stat "},
		{"invalid", bad, nil, "flags: invalid rollout settings: " + bad + ": json: "},
		{"a directory", dir, nil, "flags: rollout file: "},
		{"negative interval", good, &FileOptions{Interval: -time.Second}, "flags: FileOptions.Interval is -1s; want 0 (default 1s) or more"},
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
		if s != (Settings{60, true}) || f.Settings() != s {
			t.Errorf("OnChange(%+v), Settings() = %+v; want {60 true}", s, f.Settings())
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
