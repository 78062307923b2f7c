// Command throttlekit is the operator's tool for a migration between stores,
// and for a new limit's enforcement: it reads and sets a file rollout's
// percentage (a migration's, or with --enforcement the share of keys a
// policy is enforced for), inspects one key under a policy on each store
// side by side, and runs a short shadow comparison.
// Run "throttlekit help" for the manual; docs/cli.md has the same text.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Exit statuses, documented in every manual page (EXIT STATUS).
const (
	exitOK          = 0 // done; stores agree
	exitDiffer      = 1 // the stores' answers differ, or a comparison failed
	exitUsage       = 2 // bad command line: nothing was read or written
	exitUnreachable = 3 // a store did not answer (a failure of the store itself)
	exitFailed      = 4 // anything else failed: a rollout file, a store's error about a key
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs the command line args (without the program's name), writing to
// stdout and stderr, and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	// The first interrupt stops a comparison, which still reports what it
	// compared; a second one kills the program as usual.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done() // a signal, or stop
		stop()
	}()
	return newEnv(stdout, stderr).run(ctx, args)
}

// env is what a command reaches outside itself: tests replace the clock,
// the pacing of synthetic traffic and the stores.
type env struct {
	stdout, stderr io.Writer
	now            func() time.Time
	// sleepUntil waits until t on the clock of now, or until ctx ends.
	sleepUntil func(ctx context.Context, t time.Time)
	// open connects to the stores that cfg names.
	open func(cfg storeConfig) (*stores, error)
}

func newEnv(stdout, stderr io.Writer) *env {
	return &env{
		stdout: stdout, stderr: stderr,
		now: time.Now,
		sleepUntil: func(ctx context.Context, t time.Time) {
			timer := time.NewTimer(time.Until(t))
			defer timer.Stop()
			select {
			case <-timer.C:
			case <-ctx.Done():
			}
		},
		open: openStores,
	}
}

// command is one subcommand: its manual page and what it does.
type command struct {
	name string
	page manPage
	// flags declares the command's options on fs and returns the function
	// that runs it on the positional arguments.
	flags func(e *env, fs *flag.FlagSet) func(ctx context.Context, args []string) int
}

func commands() []*command {
	return []*command{rolloutGetCommand(), rolloutSetCommand(), inspectCommand(), shadowCommand()}
}

func (e *env) run(ctx context.Context, args []string) int {
	if len(args) == 0 {
		e.usageError("", errors.New("missing command"))
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help":
		e.printMain(e.stdout)
		return exitOK
	case "help":
		return e.help(args[1:])
	case "rollout":
		if len(args) < 2 {
			e.usageError("rollout", errors.New("missing subcommand: get or set"))
			return exitUsage
		}
		switch args[1] {
		case "-h", "-help", "--help":
			e.printPages(e.stdout, "rollout get", "rollout set")
			return exitOK
		}
		return e.runCommand(ctx, "rollout "+args[1], args[2:])
	}
	return e.runCommand(ctx, args[0], args[1:])
}

func findCommand(name string) *command {
	for _, c := range commands() {
		if c.name == name {
			return c
		}
	}
	return nil
}

func (e *env) runCommand(ctx context.Context, name string, args []string) int {
	c := findCommand(name)
	if c == nil {
		e.usageError("", fmt.Errorf("unknown command %q", name))
		return exitUsage
	}
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported below, in one format
	fs.Usage = func() {}
	do := c.flags(e, fs)
	pos, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		c.page.write(e.stdout, fs)
		return exitOK
	}
	if err != nil {
		e.usageError(c.name, err)
		return exitUsage
	}
	return do(ctx, pos)
}

// parseInterspersed parses flags that may come before, between or after the
// positional arguments ("rollout set 50 --file f"), as most CLIs accept; a
// "--" ends the flags.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// usageError reports a bad command line in one format: what is wrong, then
// where the manual is.
func (e *env) usageError(cmd string, err error) {
	prog := "throttlekit"
	if cmd != "" {
		prog += " " + cmd
	}
	fmt.Fprintf(e.stderr, "%s: %v\n", prog, err)
	fmt.Fprintf(e.stderr, "Run '%s --help' for usage.\n", prog)
}

// usage is a usageError that returns exitUsage, for the commands' checks.
func (e *env) usage(cmd string, format string, a ...any) int {
	e.usageError(cmd, fmt.Errorf(format, a...))
	return exitUsage
}

// fail reports an error that is not the command line's and returns code.
func (e *env) fail(cmd string, code int, err error) int {
	fmt.Fprintf(e.stderr, "throttlekit %s: %v\n", cmd, err)
	return code
}

func (e *env) help(args []string) int {
	switch len(args) {
	case 0:
		e.printMain(e.stdout)
		return exitOK
	case 1:
		if args[0] == "rollout" {
			e.printPages(e.stdout, "rollout get", "rollout set")
			return exitOK
		}
	case 2:
		args = []string{args[0] + " " + args[1]}
	default:
		return e.usage("help", "too many arguments: %q", args)
	}
	if findCommand(args[0]) == nil {
		return e.usage("help", "unknown command %q", args[0])
	}
	e.printPages(e.stdout, args[0])
	return exitOK
}

// printPages writes the manual pages of the named commands, their options
// read from the flags each command declares.
func (e *env) printPages(w io.Writer, names ...string) {
	for i, name := range names {
		if i > 0 {
			fmt.Fprintln(w)
		}
		c := findCommand(name)
		fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
		c.flags(e, fs)
		c.page.write(w, fs)
	}
}
