package flags

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
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
// (a boolean). It is stricter than encoding/json: an unknown field, a field
// given twice and a field spelt in another case ("PERCENT") are errors, so
// that a misspelt or contradictory setting is caught instead of ignored or
// decided by whichever came last. Every error matches ErrSettings.
func ParseSettings(data []byte) (Settings, error) {
	s, err := parseSettings(data)
	if err != nil {
		return Settings{}, fmt.Errorf("%w: %w", ErrSettings, err)
	}
	return s, nil
}

// parseSettings is ParseSettings with errors that say what is wrong and
// nothing else, for the caller to prefix. It walks the object's tokens
// itself: encoding/json matches names case-insensitively and lets a
// repeated name overwrite the first.
func parseSettings(data []byte) (Settings, error) {
	if len(data) > MaxFileSize {
		return Settings{}, fmt.Errorf("%d bytes, at most %d", len(data), MaxFileSize)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	switch {
	case err == io.EOF:
		return Settings{}, errors.New("no JSON object: the content is empty")
	case err != nil:
		return Settings{}, err
	case tok != json.Delim('{'):
		return Settings{}, fmt.Errorf("want one JSON object, found %s", describeToken(tok))
	}
	var percent *int
	var mirror *bool
	var seenPercent, seenMirror bool
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return Settings{}, unexpectedEOF(err)
		}
		name, _ := tok.(string) // a name is all Token returns here
		var seen *bool
		var value any
		switch name {
		case "percent":
			seen, value = &seenPercent, &percent
		case "mirror":
			seen, value = &seenMirror, &mirror
		default:
			for _, known := range []string{"percent", "mirror"} {
				if strings.EqualFold(name, known) {
					return Settings{}, fmt.Errorf("field %q: names are case-sensitive; want %q", name, known)
				}
			}
			return Settings{}, fmt.Errorf("unknown field %q", name)
		}
		if *seen {
			return Settings{}, fmt.Errorf("field %q appears twice", name)
		}
		*seen = true
		if err := dec.Decode(value); err != nil {
			return Settings{}, unexpectedEOF(err)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return Settings{}, unexpectedEOF(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Settings{}, errors.New("data after the JSON object")
	}
	if percent == nil { // absent or null
		return Settings{}, errors.New(`"percent" is missing`)
	}
	if p := *percent; p < 0 || p > 100 {
		return Settings{}, fmt.Errorf(`"percent" is %d; must be within [0, 100]`, p)
	}
	st := Settings{Percent: *percent}
	if mirror != nil {
		st.Mirror = *mirror
	}
	return st, nil
}

// unexpectedEOF turns the io.EOF that json.Decoder.Token returns for an
// object cut short into the error it is.
func unexpectedEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// describeToken names what stands where the object should start.
func describeToken(tok json.Token) string {
	switch tok.(type) {
	case json.Delim:
		return "an array"
	case string:
		return "a string"
	case float64, json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%v", tok)
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

var (
	_ Rollout  = (*File)(nil)
	_ Mirrorer = (*File)(nil)
)

// errFileClosed is what a Reload after Close, or one that Close cut short,
// returns.
var errFileClosed = errors.New("flags: rollout file: closed")

// NewFile reads the rollout file at path and starts checking it for
// changes. It fails when the file cannot be read within Timeout or parsed
// at start, so a broken deploy is caught at once, and for a negative
// Interval or Timeout. nil opts mean defaults.
func NewFile(path string, opts *FileOptions) (*File, error) {
	return newFile(path, opts, readRegular)
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
	st, err := parseFile(path, data)
	if err != nil {
		return nil, err
	}
	f.apply(st)
	f.data, f.haveData = data, true
	go f.watch()
	return f, nil
}

// readRegular reads the file at path if it is a regular file. The open does
// not block on a FIFO (O_NONBLOCK where there is one), and the type is
// checked on the open file, so nothing at the path can make it wait for a
// writer.
func readRegular(path string) ([]byte, error) {
	fh, err := os.OpenFile(path, os.O_RDONLY|openNonblock, 0)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	info, err := fh.Stat()
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is %s, not a regular file", path, describeMode(info.Mode()))
	}
	return io.ReadAll(io.LimitReader(fh, MaxFileSize+1))
}

func describeMode(m fs.FileMode) string {
	switch t := m.Type(); {
	case t&fs.ModeDir != 0:
		return "a directory"
	case t&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case t&fs.ModeSocket != 0:
		return "a socket"
	case t&fs.ModeDevice != 0:
		return "a device"
	default:
		return fmt.Sprintf("of type %v", t)
	}
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

// parseFile parses data read from path, for an error that names the file.
func parseFile(path string, data []byte) (Settings, error) {
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
		var s Settings
		if s, err = parseFile(f.path, data); err == nil {
			f.setErr(nil)
			if s != f.Settings() {
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

// Settings returns the settings in force.
func (f *File) Settings() Settings {
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

// Close stops checking the file; the settings in force stay. It never waits
// for a read of the file: one still running is left to finish. It is safe
// to call more than once.
func (f *File) Close() error {
	f.closeOnce.Do(func() { close(f.stop) })
	<-f.done
	return nil
}
