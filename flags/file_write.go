package flags

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// MarshalSettings returns s as the content of a rollout file, for example
// {"percent":25,"mirror":true} and a newline: what ParseSettings, and so a
// File, reads back as s. A percentage outside [0, 100] is an error matching
// ErrPercent.
func MarshalSettings(s Settings) ([]byte, error) {
	if err := checkPercent(s.Percent); err != nil {
		return nil, err
	}
	data, err := json.Marshal(s) // Settings' own field names
	if err != nil {
		return nil, fmt.Errorf("flags: %w", err)
	}
	data = append(data, '\n')
	// What is written must be what the strict reader takes: a field added
	// to Settings without a case in parseSettings would fail here, not in
	// every process that reads the file.
	if back, err := parseSettings(data); err != nil || back != s {
		return nil, fmt.Errorf("flags: %s does not read back as %+v (%v)", data, s, err)
	}
	return data, nil
}

// ReadSettings reads the rollout file at path as a File does: only a
// regular file, at most MaxFileSize bytes, parsed strictly (ParseSettings).
// An invalid file is an error matching ErrSettings.
func ReadSettings(path string) (Settings, error) {
	if path == "" {
		return Settings{}, errors.New("flags: rollout file: the path is empty")
	}
	data, err := readRegular(path)
	if err != nil {
		return Settings{}, fmt.Errorf("flags: rollout file: %w", err)
	}
	return parseFile(path, data)
}

// WriteSettings replaces the rollout file at path with s, atomically, so
// that a File checking it reads either the old settings or the new ones,
// never a part: it writes a temporary file in the same directory, syncs it
// to disk, and renames it over path. A symbolic link at path is followed
// (the file it points to is replaced, the link stays), and the replaced
// file's permissions are kept; a new file gets 0644. Something other than a
// regular file at path is an error, and so is a percentage outside
// [0, 100] (ErrPercent). Two writers at once do not mix: the last rename
// wins whole.
func WriteSettings(path string, s Settings) error {
	data, err := MarshalSettings(s)
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
