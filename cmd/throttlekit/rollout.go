package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"strconv"
	"strings"

	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/internal/rollout"
)

// onOff is a --mirror: on or off, and whether it was given.
type onOff struct {
	set, on bool
}

func (o *onOff) String() string {
	if o == nil || !o.set {
		return ""
	}
	return onOffWord(o.on)
}

func (o *onOff) Set(s string) error {
	switch strings.ToLower(s) {
	case "on", "true":
		o.on = true
	case "off", "false":
		o.on = false
	default:
		return fmt.Errorf("%q: want on or off", s)
	}
	o.set = true
	return nil
}

func onOffWord(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

func rolloutGetCommand() *command {
	return &command{name: "rollout get", page: rolloutGetPage, flags: func(e *env, fs *flag.FlagSet) func(context.Context, []string) int {
		file := fs.String("file", "", "The rollout `file` (required): the path the application's flags.NewFile reads.")
		enforcement := fs.Bool("enforcement", false, enforcementUsage)
		asJSON := fs.Bool("json", false, "Print the settings as the JSON object the file holds, in its canonical form.")
		var keys []string
		fs.Func("key", "Say where the `key` stands: its bucket, and whether the percentage puts it in (on the new store, or enforced) or from which percentage it would be. Repeat it for several keys; it needs --group.", func(s string) error {
			if err := validateKey(s); err != nil {
				return err
			}
			keys = append(keys, s)
			return nil
		})
		group := fs.String("group", "", "The bucketing `group` of --key: the application's FileOptions.GroupID, or "+flags.DefaultGroupID+" when it gives none (flags.DefaultGroupID).")
		return func(_ context.Context, args []string) int {
			const cmd = "rollout get"
			switch {
			case *file == "":
				return e.usage(cmd, "--file is required")
			case len(args) > 0:
				return e.usage(cmd, "unexpected argument %q", args[0])
			case len(keys) > 0 && *group == "":
				return e.usage(cmd, "--key needs --group, the group the application buckets the file's keys in (FileOptions.GroupID; %s when it gives none)", flags.DefaultGroupID)
			case *group != "" && len(keys) == 0:
				return e.usage(cmd, "--group is for --key; give the keys to look up")
			case len(keys) > 0 && *asJSON:
				return e.usage(cmd, "--key is printed as text; leave out --json")
			}
			s, err := rollout.Read(*file)
			if err == nil && *enforcement {
				err = checkEnforcementFile(*file, s)
			}
			if err != nil {
				return e.fail(cmd, exitFailed, err)
			}
			switch {
			case *asJSON:
				data, _ := rollout.Marshal(s) // s was read, so it is valid
				e.stdout.Write(data)
			case *enforcement:
				fmt.Fprintf(e.stdout, "file:     %s\nenforced: %s\n", *file, enforcedShare("", s.Percent))
			default:
				fmt.Fprintf(e.stdout, "file:    %s\npercent: %d\nmirror:  %s\n", *file, s.Percent, onOffWord(s.Mirror))
			}
			for _, k := range keys {
				fmt.Fprintf(e.stdout, "key %q: %s\n", k, keyStanding(*group, k, s.Percent, *enforcement))
			}
			return exitOK
		}
	}}
}

func rolloutSetCommand() *command {
	return &command{name: "rollout set", page: rolloutSetPage, flags: func(e *env, fs *flag.FlagSet) func(context.Context, []string) int {
		file := fs.String("file", "", "The rollout `file` (required). It is created if it does not exist.")
		var mirror onOff
		fs.Var(&mirror, "mirror", "Set mirroring `on|off` as well. Without it the file's mirror setting is kept; it is required when the file does not exist or cannot be read, unless --enforcement is given.")
		enforcement := fs.Bool("enforcement", false, enforcementUsage+" A missing or unreadable file is written anew, mirroring off, so that a rollback never waits on a repair.")
		asJSON := fs.Bool("json", false, "Print the settings before and after as JSON.")
		return func(_ context.Context, args []string) int {
			const cmd = "rollout set"
			switch {
			case *file == "":
				return e.usage(cmd, "--file is required")
			case *enforcement && mirror.set:
				return e.usage(cmd, "--mirror is a store migration's setting; an enforcement file has none (it is always off)")
			case len(args) == 0:
				return e.usage(cmd, "missing the percentage, a whole number from 0 to 100")
			case len(args) > 1:
				return e.usage(cmd, "unexpected argument %q after the percentage", args[1])
			}
			pct, err := parsePercent(args[0])
			if err != nil {
				return e.usage(cmd, "%v", err)
			}
			old, readErr := rollout.Read(*file)
			if readErr == nil && *enforcement {
				if err := checkEnforcementFile(*file, old); err != nil {
					return e.fail(cmd, exitFailed, err)
				}
			}
			if readErr != nil && !mirror.set && !*enforcement {
				hint := "the mirror setting cannot be kept"
				if errors.Is(readErr, iofs.ErrNotExist) {
					hint = "the file does not exist"
				}
				return e.fail(cmd, exitFailed, fmt.Errorf("%v\n%s: give --mirror on or --mirror off", readErr, hint))
			}
			next := rollout.Settings{Percent: pct, Mirror: old.Mirror}
			if mirror.set {
				next.Mirror = mirror.on
			}
			if err := rollout.Write(*file, next); err != nil {
				return e.fail(cmd, exitFailed, err)
			}
			// Read back as the application will, so that what is printed
			// is what is on disk.
			got, err := rollout.Read(*file)
			if err != nil {
				return e.fail(cmd, exitFailed, fmt.Errorf("written, but reading it back failed: %w", err))
			}
			if readErr != nil && *enforcement && !errors.Is(readErr, iofs.ErrNotExist) {
				// Replaced without its settings: say what was there.
				fmt.Fprintf(e.stderr, "throttlekit %s: replaced a file that could not be read: %v\n", cmd, readErr)
			}
			if *asJSON {
				out := struct {
					File   string            `json:"file"`
					Before *rollout.Settings `json:"before"` // null: no valid file before
					After  rollout.Settings  `json:"after"`
				}{File: *file, After: got}
				if readErr == nil {
					out.Before = &old
				}
				if err := writeJSON(e.stdout, out); err != nil {
					return e.fail(cmd, exitFailed, err)
				}
				return exitOK
			}
			if *enforcement {
				was := ""
				if readErr == nil && old.Percent != got.Percent {
					was = strconv.Itoa(old.Percent) + "% -> "
				}
				fmt.Fprintf(e.stdout, "file:     %s\nenforced: %s\n", *file, enforcedShare(was, got.Percent))
				return exitOK
			}
			before := func(now, was string) string {
				if readErr != nil || now == was {
					return now
				}
				return was + " -> " + now
			}
			fmt.Fprintf(e.stdout, "file:    %s\npercent: %s\nmirror:  %s\n", *file,
				before(strconv.Itoa(got.Percent), strconv.Itoa(old.Percent)),
				before(onOffWord(got.Mirror), onOffWord(old.Mirror)))
			return exitOK
		}
	}}
}

const enforcementUsage = "The file is a policy's enforcement (flags.Enforcement over a flags.File): show the share of keys the policy is enforced for, the others being in dry run, and refuse a file with mirroring on, which only a store migration's rollout file has."

// checkEnforcementFile refuses, as an enforcement file, one with mirroring
// on: that is a store migration's rollout file, where a percentage moves
// keys between stores instead of enforcing a limit.
func checkEnforcementFile(path string, s rollout.Settings) error {
	if !s.Mirror {
		return nil
	}
	return fmt.Errorf("%s has mirroring on, as a store migration's rollout file has and an enforcement file never has;\n"+
		"check the path; if this is the enforcement file, repair it with --mirror off instead of --enforcement", path)
}

// enforcedShare words a policy's enforcement at p percent of keys, after was
// (the percentage it replaced, as "1% -> ", or nothing).
func enforcedShare(was string, p int) string {
	switch p {
	case 0:
		return fmt.Sprintf("%s0%% of keys: every key in dry run", was)
	case 100:
		return fmt.Sprintf("%s100%% of keys", was)
	}
	return fmt.Sprintf("%s%d%% of keys; the others in dry run", was, p)
}

// keyStanding says where key stands in a rollout of p percent bucketed in
// group: in it (on the new store, or enforced) or from which percentage.
func keyStanding(group, key string, p int, enforcement bool) string {
	b := flags.Bucket(group, key)
	in, out := "on the new store", "on the old store"
	if enforcement {
		in, out = "enforced", "in dry run"
	}
	if b <= p {
		return fmt.Sprintf("bucket %d of group %q: %s", b, group, in)
	}
	return fmt.Sprintf("bucket %d of group %q: %s until the percentage reaches %d", b, group, out, b)
}

// parsePercent reads "25" or "25%", a whole number from 0 to 100.
func parsePercent(s string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSuffix(s, "%"))
	if err != nil {
		return 0, fmt.Errorf("percentage %q is not a whole number from 0 to 100", s)
	}
	if n < 0 || n > 100 {
		return 0, fmt.Errorf("percentage %d is outside 0 to 100", n)
	}
	return n, nil
}

// writeJSON writes v indented, as every --json output is.
func writeJSON(w io.Writer, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(data, '\n'))
	return err
}
