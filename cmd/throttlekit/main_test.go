package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// t0 is the instant every test starts at.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// testEnv runs commands on memory stores, named as the store options name
// them, at a clock that only the synthetic traffic's pacing moves.
type testEnv struct {
	*env
	out, errb bytes.Buffer
	clock     time.Time
	backends  map[string]throttler.Backend
}

func newTestEnv(t testing.TB) *testEnv {
	te := &testEnv{clock: t0, backends: map[string]throttler.Backend{}}
	te.env = &env{
		stdout: &te.out, stderr: &te.errb,
		now: func() time.Time { return te.clock },
		sleepUntil: func(_ context.Context, at time.Time) {
			if at.After(te.clock) {
				te.clock = at
			}
		},
		open: func(cfg storeConfig) (*stores, error) {
			s := &stores{}
			for _, name := range cfg.names() {
				s.list = append(s.list, store{name: name, addrs: testAddrs(cfg, name), b: te.backend(t, name)})
			}
			return s, nil
		},
	}
	return te
}

// backend returns the memory store standing for the store name.
func (te *testEnv) backend(t testing.TB, name string) throttler.Backend {
	if b, ok := te.backends[name]; ok {
		return b
	}
	b, err := memory.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	te.backends[name] = b
	return b
}

func testAddrs(cfg storeConfig, name string) []string {
	switch name {
	case storeMemcached:
		return cfg.memcached
	case storeRedis:
		return cfg.redis
	}
	for i, r := range cfg.redisReplicas {
		if replicaName(i) == name {
			return r
		}
	}
	return nil
}

// take counts cost against key on the named store, to set a scene.
func (te *testEnv) take(t testing.TB, store, key string, p throttler.Policy, cost int64, at time.Time) {
	t.Helper()
	if _, err := te.backend(t, store).Take(context.Background(), key, p, cost, at); err != nil {
		t.Fatal(err)
	}
}

func (te *testEnv) run(args ...string) int { return te.env.run(context.Background(), args) }

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (run with -update to accept):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

func TestUsageErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		args []string
		want string // in stderr
	}{
		{"no command", nil, "missing command"},
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"rollout alone", []string{"rollout"}, "missing subcommand"},
		{"rollout unknown", []string{"rollout", "del"}, `unknown command "rollout del"`},
		{"unknown flag", []string{"inspect", "--colour"}, "flag provided but not defined: -colour"},
		{"get without file", []string{"rollout", "get"}, "--file is required"},
		{"get extra argument", []string{"rollout", "get", "--file", "f", "x"}, `unexpected argument "x"`},
		{"set without percent", []string{"rollout", "set", "--file", "f"}, "missing the percentage"},
		{"set percent above 100", []string{"rollout", "set", "--file", "f", "101"}, "percentage 101 is outside 0 to 100"},
		{"set negative percent", []string{"rollout", "set", "--file", "f", "--", "-5"}, "percentage -5 is outside 0 to 100"},
		{"set percent as a flag", []string{"rollout", "set", "--file", "f", "-5"}, "flag provided but not defined: -5"},
		{"set percent not a number", []string{"rollout", "set", "--file", "f", "half"}, `percentage "half" is not a whole number`},
		{"set two percents", []string{"rollout", "set", "--file", "f", "5", "6"}, `unexpected argument "6"`},
		{"set bad mirror", []string{"rollout", "set", "--file", "f", "--mirror", "maybe", "5"}, `"maybe": want on or off`},
		{"set mirror of an enforcement", []string{"rollout", "set", "--enforcement", "--file", "f", "--mirror", "off", "5"}, "--mirror is a store migration's setting; an enforcement file has none"},
		{"inspect without policy", []string{"inspect", "--key", "k", "--redis", "h:1"}, "--policy is required"},
		{"inspect without key", []string{"inspect", "--policy", "limit=1,window=1s", "--redis", "h:1"}, "--key is required"},
		{"inspect without store", []string{"inspect", "--policy", "limit=1,window=1s", "--key", "k"}, "no store"},
		{"inspect key too long", []string{"inspect", "--policy", "limit=1,window=1s", "--redis", "h:1", "--key", strings.Repeat("k", throttler.MaxKeyLen+1)}, "--key: throttler: invalid key"},
		{"policy without limit", []string{"inspect", "--policy", "window=1s"}, `field "limit" is required`},
		{"policy bad limit", []string{"inspect", "--policy", "limit=0,window=1s"}, "limit must be between 1 and 2^48, got 0"},
		{"policy unknown field", []string{"inspect", "--policy", "limit=1,window=1s,colour=red"}, `unknown field "colour"`},
		{"policy bad algorithm", []string{"inspect", "--policy", "limit=1,window=1s,algorithm=leaky"}, `unknown algorithm "leaky"`},
		{"policy burst on fixed window", []string{"inspect", "--policy", "limit=1,window=1s,burst=3"}, "burst is only for a token bucket"},
		{"policy window not a duration", []string{"inspect", "--policy", "limit=1,window=60"}, `"60" is not a duration`},
		{"bad address", []string{"inspect", "--redis", "localhost"}, `address "localhost": want host:port`},
		{"bad port", []string{"inspect", "--memcached", "h:0"}, `port "0" is not a number from 1 to 65535`},
		{"redis twice", []string{"inspect", "--redis", "h:1", "--redis", "h:2"}, "given twice"},
		{"replica without redis", []string{"inspect", "--policy", "limit=1,window=1s", "--key", "k", "--redis-replica", "h:1"}, "--redis-replica needs --redis"},
		{"replicas do not match shards", []string{"inspect", "--policy", "limit=1,window=1s", "--key", "k", "--redis", "h:1,h:2", "--redis-replica", "h:3"}, "lists 1 addresses for 2 shards"},
		{"zero timeout", []string{"inspect", "--policy", "limit=1,window=1s", "--key", "k", "--redis", "h:1", "--timeout", "0s"}, "--timeout is 0s"},
		{"shadow same store", []string{"shadow", "--control", "redis", "--candidate", "redis", "--redis", "h:1", "--policy", "limit=1,window=1s"}, "both redis"},
		{"shadow store not configured", []string{"shadow", "--control", "memcached", "--candidate", "redis", "--redis", "h:1", "--policy", "limit=1,window=1s"}, "--control memcached: not a configured store; configured: redis"},
		{"shadow takes on a replica", []string{"shadow", "--control", "redis", "--candidate", "redis-replica", "--redis", "h:1", "--redis-replica", "h:2", "--policy", "limit=1,window=1s"}, "redis-replica is read only"},
		{"shadow no calls", []string{"shadow", "--control", "memcached", "--candidate", "redis", "--redis", "h:1", "--memcached", "h:2", "--policy", "limit=1,window=1s", "--rate", "1", "--duration", "500ms"}, "makes no call"},
		{"shadow too many calls", []string{"shadow", "--control", "memcached", "--candidate", "redis", "--redis", "h:1", "--memcached", "h:2", "--policy", "limit=1,window=1s", "--rate", "1e6", "--duration", "1h"}, "at most"},
		{"shadow cost above capacity", []string{"shadow", "--control", "memcached", "--candidate", "redis", "--redis", "h:1", "--memcached", "h:2", "--policy", "limit=1,window=1s", "--cost", "2"}, "more than the policy's capacity of 1"},
		{"shadow synthetic option on given keys", []string{"shadow", "--control", "memcached", "--candidate", "redis", "--redis", "h:1", "--memcached", "h:2", "--policy", "limit=1,window=1s", "--key", "k", "--keys", "5"}, "--keys shapes synthetic traffic"},
		{"shadow live without keys", []string{"shadow", "--control", "memcached", "--candidate", "redis", "--redis", "h:1", "--memcached", "h:2", "--policy", "limit=1,window=1s", "--live"}, "--live needs the keys"},
		{"shadow bad op", []string{"shadow", "--ops", "take,steal"}, `operation "steal"`},
		{"shadow empty key prefix", []string{"shadow", "--control", "memcached", "--candidate", "redis", "--redis", "h:1", "--memcached", "h:2", "--policy", "limit=1,window=1s", "--key-prefix", ""}, "--key-prefix is empty"},
		{"shadow missing keys file", []string{"shadow", "--control", "memcached", "--candidate", "redis", "--redis", "h:1", "--memcached", "h:2", "--policy", "limit=1,window=1s", "--keys-file", filepath.Join(dir, "none")}, "--keys-file: open"},
		{"help of nothing", []string{"help", "frob"}, `unknown command "frob"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			te := newTestEnv(t)
			if code := te.run(tt.args...); code != exitUsage {
				t.Errorf("exit status %d, want %d; stderr:\n%s", code, exitUsage, te.errb.String())
			}
			if !strings.Contains(te.errb.String(), tt.want) {
				t.Errorf("stderr %q does not say %q", te.errb.String(), tt.want)
			}
			if !strings.Contains(te.errb.String(), "--help' for usage") {
				t.Errorf("stderr %q does not point to --help", te.errb.String())
			}
			if te.out.Len() > 0 {
				t.Errorf("stdout is not empty: %q", te.out.String())
			}
			if len(te.backends) > 0 {
				t.Errorf("a usage error opened stores")
			}
		})
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{
		{"--help"}, {"-h"}, {"help"}, {"help", "inspect"}, {"help", "rollout"}, {"help", "rollout", "set"},
		{"rollout", "--help"}, {"rollout", "get", "--help"}, {"rollout", "set", "-h"}, {"inspect", "--help"}, {"shadow", "-help"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			te := newTestEnv(t)
			if code := te.run(args...); code != exitOK {
				t.Fatalf("exit status %d; stderr %s", code, te.errb.String())
			}
			for _, s := range []string{"NAME\n", "SYNOPSIS\n", "DESCRIPTION\n", "OPTIONS\n", "EXIT STATUS\n", "EXAMPLES\n"} {
				if !strings.Contains(te.out.String(), s) {
					t.Errorf("the manual has no %q section", strings.TrimSpace(s))
				}
			}
			if te.errb.Len() > 0 {
				t.Errorf("stderr is not empty: %q", te.errb.String())
			}
		})
	}
}

// TestManualsListEveryOption: each page's OPTIONS names every flag, each
// with a description, and its EXIT STATUS the statuses the command returns.
func TestManualsListEveryOption(t *testing.T) {
	for _, c := range commands() {
		t.Run(c.name, func(t *testing.T) {
			te := newTestEnv(t)
			te.printPages(&te.out, c.name)
			page := te.out.String()
			fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
			c.flags(te.env, fs)
			fs.VisitAll(func(f *flag.Flag) {
				if !strings.Contains(page, "\n       --"+f.Name) {
					t.Errorf("OPTIONS does not list --%s", f.Name)
				}
				if f.Usage == "" {
					t.Errorf("--%s has no description", f.Name)
				}
			})
			for _, line := range strings.Split(page, "\n") {
				if len(line) > pageWidth && !strings.HasPrefix(line, "           ") {
					t.Errorf("line wider than %d outside an example: %q", pageWidth, line)
				}
			}
		})
	}
}

func TestRollout(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rollout.json")
	steps := []struct {
		args     []string
		wantCode int
		wantOut  string
		wantErr  string
		wantFile string // the file's content after the step
	}{
		{[]string{"rollout", "get", "--file", path}, exitFailed, "", "no such file or directory", ""},
		{[]string{"rollout", "set", "--file", path, "0"}, exitFailed, "", "the file does not exist: give --mirror on or --mirror off", ""},
		{[]string{"rollout", "set", "--file", path, "--mirror", "on", "0"}, exitOK,
			"file:    " + path + "\npercent: 0\nmirror:  on\n", "", `{"percent":0,"mirror":true}` + "\n"},
		// Flags after the percentage, and a trailing %.
		{[]string{"rollout", "set", "10%", "--file", path}, exitOK,
			"file:    " + path + "\npercent: 0 -> 10\nmirror:  on\n", "", `{"percent":10,"mirror":true}` + "\n"},
		{[]string{"rollout", "get", "--file", path}, exitOK,
			"file:    " + path + "\npercent: 10\nmirror:  on\n", "", `{"percent":10,"mirror":true}` + "\n"},
		{[]string{"rollout", "get", "-json", "-file=" + path}, exitOK,
			`{"percent":10,"mirror":true}` + "\n", "", `{"percent":10,"mirror":true}` + "\n"},
		{[]string{"rollout", "set", "--file", path, "--mirror=off", "--json", "100"}, exitOK,
			"{\n  \"file\": \"" + path + "\",\n  \"before\": {\n    \"percent\": 10,\n    \"mirror\": true\n  },\n  \"after\": {\n    \"percent\": 100,\n    \"mirror\": false\n  }\n}\n", "", `{"percent":100,"mirror":false}` + "\n"},
		{[]string{"rollout", "set", "--file", path, "100"}, exitOK,
			"file:    " + path + "\npercent: 100\nmirror:  off\n", "", `{"percent":100,"mirror":false}` + "\n"},
	}
	for i, s := range steps {
		te := newTestEnv(t)
		code := te.run(s.args...)
		if code != s.wantCode || te.out.String() != s.wantOut || !strings.Contains(te.errb.String(), s.wantErr) {
			t.Errorf("step %d %q: exit %d, stdout %q, stderr %q; want exit %d, stdout %q, stderr with %q",
				i, s.args, code, te.out.String(), te.errb.String(), s.wantCode, s.wantOut, s.wantErr)
		}
		data, _ := os.ReadFile(path)
		if string(data) != s.wantFile {
			t.Errorf("step %d: file holds %q, want %q", i, data, s.wantFile)
		}
	}
}

func TestRolloutInvalidFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rollout.json")
	if err := os.WriteFile(path, []byte(`{"percent": 10, "Mirror": true}`), 0o600); err != nil {
		t.Fatal(err)
	}
	te := newTestEnv(t)
	if code := te.run("rollout", "get", "--file", path); code != exitFailed || !strings.Contains(te.errb.String(), `field "Mirror": names are case-sensitive`) {
		t.Errorf("get: exit %d, stderr %q", code, te.errb.String())
	}
	// An invalid file's mirror setting cannot be kept: set needs --mirror,
	// and with it repairs the file (the emergency rollback).
	te = newTestEnv(t)
	if code := te.run("rollout", "set", "--file", path, "0"); code != exitFailed || !strings.Contains(te.errb.String(), "the mirror setting cannot be kept") {
		t.Errorf("set without --mirror: exit %d, stderr %q", code, te.errb.String())
	}
	te = newTestEnv(t)
	if code := te.run("rollout", "set", "--file", path, "--mirror", "on", "0"); code != exitOK {
		t.Errorf("set --mirror on: exit %d, stderr %q", code, te.errb.String())
	}
	if data, _ := os.ReadFile(path); string(data) != `{"percent":0,"mirror":true}`+"\n" {
		t.Errorf("file holds %q", data)
	}
}

// TestRunReal goes through run and the real stores' construction, without
// a call that would dial: a prefix a backend refuses is a usage error.
func TestRunReal(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"--help"}, &out, &errb); code != exitOK || !strings.HasPrefix(out.String(), "NAME\n") {
		t.Errorf("run --help: exit %d, stdout %.40q", code, out.String())
	}
	out.Reset()
	code := run([]string{"inspect", "--key", "k", "--policy", "limit=1,window=1s", "--redis", "127.0.0.1:1", "--redis-prefix", "a{b"}, &out, &errb)
	if code != exitUsage || !strings.Contains(errb.String(), `redis: Options.Prefix "a{b" holds a brace`) {
		t.Errorf("a bad prefix: exit %d, stderr %q", code, errb.String())
	}
}

func TestOpenStores(t *testing.T) {
	s, err := openStores(storeConfig{
		memcached: []string{"127.0.0.1:1"}, redis: []string{"127.0.0.1:2", "127.0.0.1:3"},
		redisReplicas: [][]string{{"127.0.0.1:4", "127.0.0.1:5"}, {"127.0.0.1:6", "127.0.0.1:7"}},
		redisPrefix:   "throttlekit:", memcachedPrefix: "throttlekit:", timeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var got []string
	for _, st := range s.list {
		got = append(got, fmt.Sprintf("%s %v ro=%v", st.name, st.addrs, st.readOnly))
	}
	want := []string{
		"memcached [127.0.0.1:1] ro=false",
		"redis [127.0.0.1:2 127.0.0.1:3] ro=false",
		"redis-replica [127.0.0.1:4 127.0.0.1:5] ro=true",
		"redis-replica-2 [127.0.0.1:6 127.0.0.1:7] ro=true",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("stores:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
