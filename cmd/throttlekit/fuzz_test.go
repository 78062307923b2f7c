package main

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzParsePolicy: a spec is refused with an error, or read as a policy
// that Validate accepts and that formatPolicy writes back as a spec read as
// the same policy.
func FuzzParsePolicy(f *testing.F) {
	for _, s := range []string{
		"name=api,limit=5000,window=1h",
		"name=search,limit=10,window=1s,algorithm=token-bucket,burst=20",
		"limit=1,window=1500ms,algorithm=sliding-log",
		"limit=3,window=1m,algorithm=sliding-window,name=",
		"limit=1,window=1ms,name=a=b",
		"limit=9223372036854775807,window=1s",
		"limit=1,window=-1s", "limit=1,,window=1s", "=,=", "limit", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		p, err := parsePolicy(spec)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("parsePolicy(%q): an empty error", spec)
			}
			return
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("parsePolicy(%q) = %+v, which Validate refuses: %v", spec, p, err)
		}
		back, err := parsePolicy(formatPolicy(p))
		if err != nil || back != p {
			t.Fatalf("parsePolicy(formatPolicy(%+v)) = %+v, %v (spec %q, formatted %q)", p, back, err, spec, formatPolicy(p))
		}
	})
}

// FuzzCommandLine: any command line of inspect, rollout get or help ends
// with a documented exit status, and a usage error writes nothing to
// standard output. The stores are in memory.
func FuzzCommandLine(f *testing.F) {
	for _, s := range []string{
		"--policy limit=1,window=1s --key k --redis h:1",
		"--policy name=a,limit=5,window=1m --policy limit=2,window=1s,algorithm=token-bucket --key k --memcached h:1 --redis h:2,h:3 --redis-replica h:4,h:5 --json",
		"--policy limit=0,window=1s --key k",
		"--key --policy",
		"-- --key",
		"--file /nonexistent --json",
		"--enforcement --file /nonexistent",
		"inspect",
	} {
		for cmd := range byte(3) {
			f.Add(cmd, s)
		}
	}
	f.Fuzz(func(t *testing.T, cmd byte, line string) {
		if !utf8.ValidString(line) {
			return
		}
		args := strings.Fields(line)
		switch cmd % 3 {
		case 0:
			args = append([]string{"inspect"}, args...)
		case 1:
			args = append([]string{"rollout", "get"}, args...)
		case 2:
			args = append([]string{"help"}, args...)
		}
		te := newTestEnv(t)
		code := te.run(args...)
		if code < exitOK || code > exitFailed {
			t.Fatalf("%q: exit status %d", args, code)
		}
		if code == exitUsage && te.out.Len() > 0 {
			t.Fatalf("%q: a usage error wrote to standard output: %q", args, te.out.String())
		}
		if code != exitOK && te.errb.Len() == 0 && te.out.Len() == 0 {
			t.Fatalf("%q: exit status %d with nothing said", args, code)
		}
	})
}
