// Package rollout holds what the rollout sources of package flags share
// with flags/unleash, package migration and the throttlekit command: the
// bucketing of keys (Bucketer), and the rollout file's format and its
// atomic replacement.
package rollout

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// ErrPercent is Marshal's and Write's error for a percentage outside
// [0, 100] (flags.ErrPercent is Percent's).
var ErrPercent = errors.New("flags: percentage must be within [0, 100]")

// Settings is the content of a rollout file: flags.Settings, which
// converts to and from it.
type Settings struct {
	Percent int  `json:"percent"`
	Mirror  bool `json:"mirror"`
}

// MaxFileSize is the largest rollout file read; a larger one is an error.
const MaxFileSize = 64 << 10

// ErrSettings is returned for a rollout file that cannot be used.
var ErrSettings = errors.New("flags: invalid rollout settings")

// Parse parses a rollout file's content: one JSON object with a required
// "percent" (an integer from 0 to 100) and an optional "mirror" (a boolean). It
// is stricter than encoding/json: an unknown field, a field given twice and a
// field spelt in another case ("PERCENT") are errors, so that a misspelt or
// contradictory setting is caught instead of ignored or decided by whichever
// came last. Every error matches ErrSettings.
func Parse(data []byte) (Settings, error) {
	s, err := parse(data)
	if err != nil {
		return Settings{}, fmt.Errorf("%w: %w", ErrSettings, err)
	}
	return s, nil
}

// parse is Parse with errors that say what is wrong and nothing else, for the
// caller to prefix. It walks the object's tokens itself: encoding/json matches
// names case-insensitively and lets a repeated name overwrite the first.
func parse(data []byte) (Settings, error) {
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

// ReadRegular reads the file at path if it is a regular file. The open does
// not block on a FIFO (O_NONBLOCK where there is one), and the type is
// checked on the open file, so nothing at the path can make it wait for a
// writer.
func ReadRegular(path string) ([]byte, error) {
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

// ParseFile parses data read from path, for an error that names the file.
func ParseFile(path string, data []byte) (Settings, error) {
	s, err := parse(data)
	if err != nil {
		return Settings{}, fmt.Errorf("%w: %s: %w", ErrSettings, path, err)
	}
	return s, nil
}

// Marshal returns s as the content of a rollout file, for example
// {"percent":25,"mirror":true} and a newline: what Parse, and so a
// flags.File, reads back as s. A percentage outside [0, 100] is an error
// matching ErrPercent.
func Marshal(s Settings) ([]byte, error) {
	if s.Percent < 0 || s.Percent > 100 {
		return nil, fmt.Errorf("%w: got %d", ErrPercent, s.Percent)
	}
	data, err := json.Marshal(s) // Settings' own field names
	if err != nil {
		return nil, fmt.Errorf("flags: %w", err)
	}
	data = append(data, '\n')
	// What is written must be what the strict reader takes: a field added
	// to Settings without a case in parse would fail here, not in
	// every process that reads the file.
	if back, err := parse(data); err != nil || back != s {
		return nil, fmt.Errorf("flags: %s does not read back as %+v (%v)", data, s, err)
	}
	return data, nil
}

// Read reads the rollout file at path as a flags.File does: only a regular
// file, at most MaxFileSize bytes, parsed strictly (Parse). An invalid file is
// an error matching ErrSettings.
func Read(path string) (Settings, error) {
	if path == "" {
		return Settings{}, errors.New("flags: rollout file: the path is empty")
	}
	data, err := ReadRegular(path)
	if err != nil {
		return Settings{}, fmt.Errorf("flags: rollout file: %w", err)
	}
	return ParseFile(path, data)
}

// Write replaces the rollout file at path with s, atomically, so that a
// flags.File checking it reads either the old settings or the new ones, never a
// part: it writes a temporary file in the same directory, syncs it to disk, and
// renames it over path. A symbolic link at path is followed (the file it points
// to is replaced, the link stays), and the replaced file's permissions are
// kept; a new file gets 0644. Something other than a regular file at path is an
// error, and so is a percentage outside [0, 100] (ErrPercent). Two writers at
// once do not mix: the last rename wins whole.
func Write(path string, s Settings) error {
	data, err := Marshal(s)
	if err != nil {
		return err
	}
	if path == "" {
		return errors.New("flags: rollout file: the path is empty")
	}
	target, mode, err := writeTarget(path)
	if err != nil {
		return fmt.Errorf("flags: rollout file: %w", err)
	}
	if err := replaceFile(target, data, mode); err != nil {
		return fmt.Errorf("flags: rollout file: %w", err)
	}
	return nil
}

// writeTarget resolves path to the file to replace and the permissions to
// give it: a link's target, so that a link an operator points at one of
// several prepared files keeps pointing.
func writeTarget(path string) (string, fs.FileMode, error) {
	target := path
	if resolved, err := filepath.EvalSymlinks(path); err == nil {
		target = resolved
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", 0, err
	} else if l, lerr := os.Lstat(path); lerr == nil && l.Mode()&fs.ModeSymlink != 0 {
		return "", 0, fmt.Errorf("%s is a link to a file that does not exist", path)
	}
	info, err := os.Stat(target)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return target, 0o644, nil
	case err != nil:
		return "", 0, err
	case !info.Mode().IsRegular():
		return "", 0, fmt.Errorf("%s is %s, not a regular file", target, describeMode(info.Mode()))
	}
	return target, info.Mode().Perm(), nil
}

// replaceFile writes data to a temporary file next to target and renames it
// over target. The temporary file never outlives a failure.
func replaceFile(target string, data []byte, mode fs.FileMode) (err error) {
	dir, base := filepath.Split(target)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		return err
	}
	if err = tmp.Chmod(mode); err != nil {
		return err
	}
	// Synced before the rename: after a crash the path holds the old
	// content or the new, never an empty file.
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp.Name(), target); err != nil {
		return err
	}
	// The rename is durable once the directory is synced. It has been
	// applied either way, so a directory that cannot be synced (not every
	// system can open one) is no failure of the write.
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
