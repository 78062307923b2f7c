package flags

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Settings is the content of a rollout file, for example
//
//	{"percent": 25, "mirror": true}
//
// Percent (required) is the share of keys on the new backend, 0 to 100.
// Mirror (default false) asks the shadow layer to mirror operations to the
// backend that does not serve the key (see Mirrorer).
type Settings struct {
	Percent int  `json:"percent"`
	Mirror  bool `json:"mirror"`
}

// MaxFileSize is the largest rollout file read; a larger one is an error.
const MaxFileSize = 64 << 10

// ErrSettings is returned for a rollout file that cannot be used.
var ErrSettings = errors.New("flags: invalid rollout settings")

// ParseSettings parses a rollout file's content: one JSON object with a
// required "percent" (an integer from 0 to 100) and an optional "mirror"
// (a boolean). Unknown fields are errors, so a misspelt setting is caught
// instead of ignored. Every error matches ErrSettings.
func ParseSettings(data []byte) (Settings, error) {
	s, err := parseSettings(data)
	if err != nil {
		return Settings{}, fmt.Errorf("%w: %w", ErrSettings, err)
	}
	return s, nil
}

// parseSettings is ParseSettings with errors that say what is wrong and
// nothing else, for the caller to prefix.
func parseSettings(data []byte) (Settings, error) {
	if len(data) > MaxFileSize {
		return Settings{}, fmt.Errorf("%d bytes, at most %d", len(data), MaxFileSize)
	}
	var raw struct {
		Percent *int  `json:"percent"`
		Mirror  *bool `json:"mirror"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return Settings{}, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return Settings{}, errors.New("data after the JSON object")
	}
	if raw.Percent == nil {
		return Settings{}, errors.New(`"percent" is missing`)
	}
	if p := *raw.Percent; p < 0 || p > 100 {
		return Settings{}, fmt.Errorf(`"percent" is %d; must be within [0, 100]`, p)
	}
	s := Settings{Percent: *raw.Percent}
	if raw.Mirror != nil {
		s.Mirror = *raw.Mirror
	}
	return s, nil
}

// FileOptions configure a File source. The zero value (or nil) means
// defaults.
type FileOptions struct {
	// GroupID is the bucketing group (see NewPercentFor).
	// default: DefaultGroupID
	GroupID string
	// Interval is how often the file is checked for a change (its size,
	// modification time or identity); negative is an error. default: 1s
	Interval time.Duration
	// OnChange is called, from the checking goroutine, with the new
	// settings after a change was loaded. default: nil
	OnChange func(Settings)
	// OnError is called, from the checking goroutine, when the file cannot
	// be read or parsed; the last good settings stay in force. It is called
	// once per change of the file, not on every check. default: nil
	OnError func(error)
}

// File is a rollout read from a small JSON file (see Settings), re-read
// when the file changes, so an operator ramps or rolls back by editing it.
// A file that becomes unreadable or invalid leaves the last good settings
// in force and is reported through OnError. Replace the file atomically
// (write a temporary file, then rename it over the old one) so a check
// never sees it half-written.
//
// It is safe for concurrent use. Close stops the checking.
type File struct {
	path     string
	pct      *Percent
	interval time.Duration
	onChange func(Settings)
	onError  func(error)

	mu      sync.Mutex // serializes checks
	sig     fileSig
	lastErr error

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

var (
	_ Rollout  = (*File)(nil)
	_ Mirrorer = (*File)(nil)
)

// fileSig identifies a version of the file without reading it.
type fileSig struct {
	info os.FileInfo
}

func (s fileSig) same(o fileSig) bool {
	if s.info == nil || o.info == nil {
		return s.info == nil && o.info == nil
	}
	return os.SameFile(s.info, o.info) && s.info.Size() == o.info.Size() && s.info.ModTime().Equal(o.info.ModTime())
}

// NewFile reads the rollout file at path and starts checking it for
// changes. It fails when the file cannot be read or parsed at start, so a
// broken deploy is caught at once, and for a negative Interval. nil opts
// mean defaults.
func NewFile(path string, opts *FileOptions) (*File, error) {
	var o FileOptions
	if opts != nil {
		o = *opts
	}
	switch {
	case path == "":
		return nil, errors.New("flags: rollout file: the path is empty")
	case o.Interval < 0:
		return nil, fmt.Errorf("flags: FileOptions.Interval is %v; want 0 (default 1s) or more", o.Interval)
	case o.Interval == 0:
		o.Interval = time.Second
	}
	f := &File{
		path:     path,
		pct:      newPercent(o.GroupID, 0),
		interval: o.Interval,
		onChange: o.OnChange,
		onError:  o.OnError,
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("flags: rollout file: %w", err)
	}
	st, err := readSettings(path)
	if err != nil {
		return nil, err
	}
	f.apply(st)
	f.sig = fileSig{info}
	go f.watch()
	return f, nil
}

// readSettings reads and parses the file at path. Its errors carry their
// one "flags:" prefix: ErrSettings for content that cannot be used, "flags:
// rollout file:" for a file that cannot be read.
func readSettings(path string) (Settings, error) {
	fh, err := os.Open(path)
	if err != nil {
		return Settings{}, fmt.Errorf("flags: rollout file: %w", err)
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, MaxFileSize+1))
	if err != nil {
		return Settings{}, fmt.Errorf("flags: rollout file: %w", err)
	}
	s, err := parseSettings(data)
	if err != nil {
		return Settings{}, fmt.Errorf("%w: %s: %w", ErrSettings, path, err)
	}
	return s, nil
}

func (f *File) apply(s Settings) {
	f.pct.store(s.Percent, s.Mirror) // ParseSettings checked the range
}

func (f *File) watch() {
	defer close(f.done)
	t := time.NewTicker(f.interval)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-t.C:
			f.check(false)
		}
	}
}

// Reload checks the file now, as the periodic check does, and returns the
// error that leaves the last good settings in force, or nil.
func (f *File) Reload() error { return f.check(true) }

// recent is how long after a modification the file is re-read even when
// its size and time look unchanged: a second write within the file
// system's timestamp granularity would otherwise go unseen.
const recent = 2 * time.Second

func (f *File) check(force bool) error {
	report, changed, err := f.load(force)
	// The hooks run after the lock is released, so they may call Err.
	if report != nil && f.onError != nil {
		f.onError(report)
	}
	if changed != nil && f.onChange != nil {
		f.onChange(*changed)
	}
	return err
}

// load re-reads the file if it changed (or force), and returns an error
// to report (first seen), the new settings if they changed, and the error
// in force.
func (f *File) load(force bool) (report error, changed *Settings, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	info, err := os.Stat(f.path)
	if err != nil {
		info = nil
	}
	sig := fileSig{info}
	moved := !sig.same(f.sig)
	fresh := info != nil && time.Since(info.ModTime()) < recent
	if !force && !moved && !fresh {
		return nil, nil, f.lastErr
	}
	f.sig = sig
	var s Settings
	if err != nil {
		err = fmt.Errorf("flags: rollout file: %w", err)
	} else {
		s, err = readSettings(f.path)
	}
	if err != nil {
		// Report a failure once, not on every check while it lasts.
		if moved || f.lastErr == nil || f.lastErr.Error() != err.Error() {
			report = err
		}
		f.lastErr = err
		return report, nil, err
	}
	f.lastErr = nil
	if s != f.Settings() {
		f.apply(s)
		changed = &s
	}
	return nil, changed, nil
}

// Settings returns the settings in force.
func (f *File) Settings() Settings {
	return Settings{Percent: f.pct.Percent(), Mirror: f.pct.Mirroring()}
}

// Err returns the error of the last check, or nil if the file in force is
// the file on disk.
func (f *File) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastErr
}

// UseNew reports whether key is within the file's percentage.
func (f *File) UseNew(key string) bool { return f.pct.UseNew(key) }

// Mirroring reports the file's mirror setting.
func (f *File) Mirroring() bool { return f.pct.Mirroring() }

// Close stops checking the file; the settings in force stay. It is safe to
// call more than once.
func (f *File) Close() error {
	f.closeOnce.Do(func() { close(f.stop) })
	<-f.done
	return nil
}
