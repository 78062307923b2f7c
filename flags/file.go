package flags

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/throttlekit/throttlekit/internal/rollout"
)

// Settings is the content of a rollout file, for example
//
//	{"percent": 25, "mirror": true}
//
// Percent (required) is the share of keys on the new backend, 0 to 100.
// Mirror (default false) asks package migration to mirror operations to the
// store that does not serve the key. The file is read strictly: an unknown
// field, a field given twice or spelt in another case ("PERCENT"), and
// anything but one JSON object of at most 64 KiB are errors. The
// throttlekit command's "rollout get" and "rollout set" read it and
// replace it atomically.
type Settings struct {
	Percent int  `json:"percent"`
	Mirror  bool `json:"mirror"`
}

// FileOptions configure a File source. The zero value (or nil) means
// defaults; a negative duration is an error.
type FileOptions struct {
	// GroupID is the bucketing group (see NewPercentFor).
	// default: DefaultGroupID
	GroupID string
	// Interval is how often the file is read and compared, byte for
	// byte, with the content last read: a change is seen whatever its
	// size and modification time. default: 1s
	Interval time.Duration
	// Timeout bounds each read of the file (open, stat, read). A read
	// that takes longer, as on a hung network mount, is an error that
	// keeps the last good settings; the read is left to finish, and the
	// next checks wait for that same read instead of starting another,
	// so a hung file holds one goroutine at most. default: 1s
	Timeout time.Duration
	// OnChange is called, from the checking goroutine, with the new
	// settings after a change was loaded. default: nil
	OnChange func(Settings)
	// OnError is called, from the checking goroutine, when the file cannot
	// be read or parsed; the last good settings stay in force. It is called
	// once per change of the file (or of the error), not on every check.
	// default: nil
	OnError func(error)
}

// File is a rollout read from a small JSON file (see Settings), re-read
// when the file changes, so an operator ramps or rolls back by editing it.
// A file that becomes unreadable or invalid leaves the last good settings
// in force and is reported through OnError. Replace the file atomically
// (write a temporary file, then rename it over the old one) so a check
// never sees it half-written. Only a regular file is read: a FIFO, device
// or directory at the path is an error, never a read that blocks.
//
// It is safe for concurrent use. Close stops the checking.
type File struct {
	path     string
	pct      *Percent
	interval time.Duration
	timeout  time.Duration
	read     func(path string) ([]byte, error)
	onChange func(Settings)
	onError  func(error)

	mu       sync.Mutex      // serializes checks, and guards what follows
	data     []byte          // the content last read, if haveData
	haveData bool            // the last check read the file
	pending  chan readResult // a read that outlived its check's Timeout

	errMu   sync.Mutex // apart from mu, so that Err never waits on a read
	lastErr error

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

type readResult struct {
	data []byte
	err  error
}

var _ Rollout = (*File)(nil)

// errFileClosed is what a Reload after Close, or one that Close cut short,
// returns.
var errFileClosed = errors.New("flags: rollout file: closed")

// NewFile reads the rollout file at path and starts checking it for
// changes. It fails when the file cannot be read within Timeout or parsed
// at start, so a broken deploy is caught at once, and for a negative
// Interval or Timeout. nil opts mean defaults.
func NewFile(path string, opts *FileOptions) (*File, error) {
	return newFile(path, opts, rollout.ReadRegular)
}

// newFile is NewFile with the function that reads the file, which tests
// replace to make a read hang.
func newFile(path string, opts *FileOptions, read func(string) ([]byte, error)) (*File, error) {
	var o FileOptions
	if opts != nil {
		o = *opts
	}
	switch {
	case path == "":
		return nil, errors.New("flags: rollout file: the path is empty")
	case o.Interval < 0:
		return nil, fmt.Errorf("flags: FileOptions.Interval is %v; want 0 (default 1s) or more", o.Interval)
	case o.Timeout < 0:
		return nil, fmt.Errorf("flags: FileOptions.Timeout is %v; want 0 (default 1s) or more", o.Timeout)
	}
	if o.Interval == 0 {
		o.Interval = time.Second
	}
	if o.Timeout == 0 {
		o.Timeout = time.Second
	}
	f := &File{
		path:     path,
		pct:      newPercent(o.GroupID, 0),
		interval: o.Interval,
		timeout:  o.Timeout,
		read:     read,
		onChange: o.OnChange,
		onError:  o.OnError,
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	data, err := f.readTimed()
	if err != nil {
		return nil, err
	}
	st, err := rollout.ParseFile(path, data)
	if err != nil {
		return nil, err
	}
	f.apply(Settings(st))
	f.data, f.haveData = data, true
	go f.watch()
	return f, nil
}

// readTimed reads the file, giving up after Timeout or when Close is
// called. A read that outlives it stays pending, and the next call waits
// for it rather than start another. Its errors carry their one "flags:"
// prefix. It is called with f.mu held, or before the File is shared.
func (f *File) readTimed() ([]byte, error) {
	select {
	case <-f.stop:
		return nil, errFileClosed
	default:
	}
	if f.pending == nil {
		ch := make(chan readResult, 1) // the reader never waits to deliver
		go func() {
			data, err := f.read(f.path)
			ch <- readResult{data, err}
		}()
		f.pending = ch
	}
	timer := time.NewTimer(f.timeout)
	defer timer.Stop()
	select {
	case r := <-f.pending:
		f.pending = nil
		if r.err != nil {
			return nil, fmt.Errorf("flags: rollout file: %w", r.err)
		}
		return r.data, nil
	case <-timer.C:
		// The same words for every check that finds the read still
		// running, so that OnError hears of it once.
		return nil, fmt.Errorf("flags: rollout file: reading %s did not finish within %v: %w", f.path, f.timeout, os.ErrDeadlineExceeded)
	case <-f.stop:
		return nil, errFileClosed
	}
}

func (f *File) apply(s Settings) {
	f.pct.store(s.Percent, s.Mirror) // rollout.ParseFile checked the range
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
			f.check()
		}
	}
}

// Reload checks the file now, as the periodic check does, and returns the
// error that leaves the last good settings in force, or nil. After Close
// it reads nothing and returns an error.
func (f *File) Reload() error { return f.check() }

func (f *File) check() error {
	report, changed, err := f.load()
	// The hooks run after the lock is released, so they may call Err.
	if report != nil && f.onError != nil {
		f.onError(report)
	}
	if changed != nil && f.onChange != nil {
		f.onChange(*changed)
	}
	return err
}

// load reads the file and, if its content changed, parses it. It returns
// an error to report (a new one, or the file changed), the new settings if
// they changed, and the error in force.
func (f *File) load() (report error, changed *Settings, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	data, err := f.readTimed()
	if err == errFileClosed {
		return nil, nil, err
	}
	prev := f.Err()
	if err == nil {
		if f.haveData && bytes.Equal(data, f.data) {
			return nil, nil, prev // unchanged: its outcome stands
		}
		f.data, f.haveData = data, true
		var st rollout.Settings
		if st, err = rollout.ParseFile(f.path, data); err == nil {
			s := Settings(st)
			f.setErr(nil)
			if s != f.settings() {
				f.apply(s)
				changed = &s
			}
			return nil, changed, nil
		}
		report = err // new content, so a new error
	} else {
		// Report a failure once, not on every check while it lasts.
		if f.haveData || prev == nil || prev.Error() != err.Error() {
			report = err
		}
		f.haveData = false
	}
	f.setErr(err)
	return report, nil, err
}

func (f *File) setErr(err error) {
	f.errMu.Lock()
	f.lastErr = err
	f.errMu.Unlock()
}

// settings returns the settings in force.
func (f *File) settings() Settings {
	return Settings{Percent: f.pct.Percent(), Mirror: f.pct.Mirroring()}
}

// Err returns the error of the last check, or nil if the file in force is
// the file on disk. It never waits for a read.
func (f *File) Err() error {
	f.errMu.Lock()
	defer f.errMu.Unlock()
	return f.lastErr
}

// UseNew reports whether key is within the file's percentage.
func (f *File) UseNew(key string) bool { return f.pct.UseNew(key) }

// Mirroring reports the file's mirror setting.
func (f *File) Mirroring() bool { return f.pct.Mirroring() }

// Percent returns the file's percentage.
func (f *File) Percent() int { return f.pct.Percent() }

// GroupID returns the bucketing group, FileOptions.GroupID.
func (f *File) GroupID() string { return f.pct.GroupID() }

// Close stops checking the file; the settings in force stay. It never waits
// for a read of the file: one still running is left to finish. It is safe
// to call more than once.
func (f *File) Close() error {
	f.closeOnce.Do(func() { close(f.stop) })
	<-f.done
	return nil
}
