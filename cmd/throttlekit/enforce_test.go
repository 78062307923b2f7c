package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/throttler"
)

// TestRolloutEnforcement ramps a policy's enforcement file as the
// operator's playbook does (1, 10, 100, back to 0) and reads it back, with
// what each step prints and leaves in the file.
func TestRolloutEnforcement(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limit-api.json")
	file := func(p int) string { return fmt.Sprintf(`{"percent":%d,"mirror":false}`+"\n", p) }
	out := func(enforced string) string { return "file:     " + path + "\nenforced: " + enforced + "\n" }
	steps := []struct {
		args     []string
		wantCode int
		wantOut  string
		wantErr  string
		wantFile string // the file's content after the step
	}{
		{[]string{"get", "--enforcement"}, exitFailed, "", "no such file or directory", ""},
		// A new file needs no --mirror.
		{[]string{"set", "--enforcement", "1"}, exitOK, out("1% of keys; the others in dry run"), "", file(1)},
		{[]string{"set", "10%", "--enforcement"}, exitOK, out("1% -> 10% of keys; the others in dry run"), "", file(10)},
		{[]string{"get", "--enforcement"}, exitOK, out("10% of keys; the others in dry run"), "", file(10)},
		{[]string{"set", "--enforcement", "100"}, exitOK, out("10% -> 100% of keys"), "", file(100)},
		{[]string{"set", "--enforcement", "0"}, exitOK, out("100% -> 0% of keys: every key in dry run"), "", file(0)},
		{[]string{"set", "--enforcement", "0"}, exitOK, out("0% of keys: every key in dry run"), "", file(0)},
		{[]string{"get", "--enforcement", "--json"}, exitOK, file(0), "", file(0)},
		{[]string{"set", "--enforcement", "--json", "5"}, exitOK,
			"{\n  \"file\": \"" + path + "\",\n  \"before\": {\n    \"percent\": 0,\n    \"mirror\": false\n  },\n  \"after\": {\n    \"percent\": 5,\n    \"mirror\": false\n  }\n}\n", "", file(5)},
		// Bad input changes nothing.
		{[]string{"set", "--enforcement", "101"}, exitUsage, "", "percentage 101 is outside 0 to 100", file(5)},
		{[]string{"set", "--enforcement", "--mirror", "off", "0"}, exitUsage, "", "--mirror is a store migration's setting", file(5)},
		{[]string{"set", "--enforcement"}, exitUsage, "", "missing the percentage", file(5)},
	}
	for i, s := range steps {
		te := newTestEnv(t)
		args := append([]string{"rollout"}, s.args...)
		code := te.run(append(args, "--file", path)...)
		if code != s.wantCode || te.out.String() != s.wantOut || !strings.Contains(te.errb.String(), s.wantErr) {
			t.Errorf("step %d %q: exit %d, stdout %q, stderr %q; want exit %d, stdout %q, stderr with %q",
				i, s.args, code, te.out.String(), te.errb.String(), s.wantCode, s.wantOut, s.wantErr)
		}
		if s.wantErr == "" && te.errb.Len() > 0 {
			t.Errorf("step %d %q: stderr %q", i, s.args, te.errb.String())
		}
		data, _ := os.ReadFile(path)
		if string(data) != s.wantFile {
			t.Errorf("step %d: file holds %q, want %q", i, data, s.wantFile)
		}
	}
}

// TestRolloutEnforcementRefusesMigrationFile: a file with mirroring on is a
// store migration's rollout; --enforcement neither reads nor writes it, so
// a mistyped path cannot move every key between stores.
func TestRolloutEnforcementRefusesMigrationFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rollout.json")
	const content = `{"percent":40,"mirror":true}` + "\n"
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"rollout", "get", "--enforcement", "--file", path},
		{"rollout", "get", "--enforcement", "--json", "--file", path},
		{"rollout", "set", "--enforcement", "--file", path, "0"},
	} {
		te := newTestEnv(t)
		if code := te.run(args...); code != exitFailed || te.out.Len() > 0 ||
			!strings.Contains(te.errb.String(), path+" has mirroring on, as a store migration's rollout file has") ||
			!strings.Contains(te.errb.String(), "repair it with --mirror off") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, te.out.String(), te.errb.String())
		}
		if data, _ := os.ReadFile(path); string(data) != content {
			t.Errorf("%q: the file holds %q", args, data)
		}
	}
}

// TestRolloutEnforcementRepairs: an enforcement file that cannot be read is
// replaced by set, so a rollback to 0 needs no other step, and stderr says
// what was replaced.
func TestRolloutEnforcementRepairs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limit-api.json")
	if err := os.WriteFile(path, []byte(`{"percent": 10, "PERCENT": 20}`), 0o644); err != nil {
		t.Fatal(err)
	}
	te := newTestEnv(t)
	if code := te.run("rollout", "get", "--enforcement", "--file", path); code != exitFailed || !strings.Contains(te.errb.String(), `names are case-sensitive`) {
		t.Errorf("get: exit %d, stderr %q", code, te.errb.String())
	}
	te = newTestEnv(t)
	code := te.run("rollout", "set", "--enforcement", "--file", path, "0")
	if want := "file:     " + path + "\nenforced: 0% of keys: every key in dry run\n"; code != exitOK || te.out.String() != want {
		t.Errorf("set 0: exit %d, stdout %q, want %q", code, te.out.String(), want)
	}
	if !strings.Contains(te.errb.String(), "replaced a file that could not be read") || !strings.Contains(te.errb.String(), "case-sensitive") {
		t.Errorf("set 0: stderr %q does not say what was replaced", te.errb.String())
	}
	if data, _ := os.ReadFile(path); string(data) != `{"percent":0,"mirror":false}`+"\n" {
		t.Errorf("the file holds %q", data)
	}
}

// TestRolloutEnforcementDrivesPolicy: each step the command writes is what
// an application's flags.Enforcement(flags.File) enforces once the file
// is checked: the keys refused are exactly those the bucketing puts within
// the percentage, a step up releases none, and 0 refuses none.
func TestRolloutEnforcementDrivesPolicy(t *testing.T) {
	const group = "limit-api"
	path := filepath.Join(t.TempDir(), "limit-api.json")
	set := func(p int) {
		t.Helper()
		te := newTestEnv(t)
		if code := te.run("rollout", "set", "--enforcement", "--file", path, fmt.Sprint(p)); code != exitOK {
			t.Fatalf("set %d: exit %d, stderr %q", p, code, te.errb.String())
		}
	}
	set(0)
	src, err := flags.NewFile(path, &flags.FileOptions{GroupID: group, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	enforce, err := flags.Enforcement(src)
	if err != nil {
		t.Fatal(err)
	}
	m, err := memory.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	th, err := throttler.New(m, &throttler.Options{Clock: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	p := throttler.PerHour(1).Named("api").EnforcedBy(enforce)
	ctx := context.Background()
	keys := make([]string, 2000)
	for i := range keys {
		keys[i] = fmt.Sprintf("user:%d", i)
		// Every key at its limit: its next call is a denial or a
		// would-be denial.
		if d, err := th.Allow(ctx, keys[i], p); err != nil || !d.Allowed || d.WouldDeny {
			t.Fatalf("first call of %q: %+v, %v", keys[i], d, err)
		}
	}
	refusedBefore := map[string]bool{}
	for _, pct := range []int{0, 1, 10, 100, 0} {
		set(pct)
		if err := src.Reload(); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, k := range keys {
			d, err := th.Allow(ctx, k, p)
			if err != nil {
				t.Fatal(err)
			}
			want := flags.Bucket(group, k) <= pct
			switch {
			case !d.Allowed != want:
				t.Fatalf("at %d%%: %q refused %v, its bucket says %v", pct, k, !d.Allowed, want)
			case d.Allowed && !d.WouldDeny:
				t.Fatalf("at %d%%: %q admitted without a would-be denial: %+v", pct, k, d)
			case refusedBefore[k] && d.Allowed && pct > 0:
				t.Fatalf("at %d%%: %q released by a step up", pct, k)
			}
			refusedBefore[k] = !d.Allowed
			if !d.Allowed {
				n++
			}
		}
		t.Logf("%d%%: %d of %d keys refused", pct, n, len(keys))
		if pct > 0 && n == 0 {
			t.Fatalf("at %d%%: no key refused", pct)
		}
	}
}

// TestRolloutGetKey: what get --key says of each key is what the
// application's File says at that percentage (enforced, or on the new
// store), and the percentage it names is the first that takes the key in.
func TestRolloutGetKey(t *testing.T) {
	const group = "limit-api"
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content string
		flags         []string
		in, out       string
	}{
		{"enforcement", `{"percent":30,"mirror":false}`, []string{"--enforcement"}, "enforced", "in dry run"},
		{"migration", `{"percent":30,"mirror":true}`, nil, "on the new store", "on the old store"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name+".json")
			if err := os.WriteFile(path, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			src, err := flags.NewFile(path, &flags.FileOptions{GroupID: group, Interval: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			args := append([]string{"rollout", "get", "--file", path, "--group", group}, tc.flags...)
			keys := make([]string, 300)
			for i := range keys {
				keys[i] = fmt.Sprintf("user:%d", i)
				args = append(args, "--key", keys[i])
			}
			te := newTestEnv(t)
			if code := te.run(args...); code != exitOK {
				t.Fatalf("exit %d, stderr %q", code, te.errb.String())
			}
			lines := strings.Split(strings.TrimSuffix(te.out.String(), "\n"), "\n")
			if len(lines) < len(keys) {
				t.Fatalf("%d lines for %d keys:\n%s", len(lines), len(keys), te.out.String())
			}
			lines = lines[len(lines)-len(keys):]
			in := 0
			for i, k := range keys {
				prefix := fmt.Sprintf("key %q: bucket ", k)
				var bucket int
				var rest string
				if !strings.HasPrefix(lines[i], prefix) {
					t.Fatalf("line %q does not start with %q", lines[i], prefix)
				}
				if _, err := fmt.Sscanf(lines[i][len(prefix):], "%d of group %q:", &bucket, new(string)); err != nil {
					t.Fatalf("line %q: %v", lines[i], err)
				}
				rest = lines[i][strings.LastIndex(lines[i], ": ")+2:]
				if src.UseNew(k) {
					in++
					if rest != tc.in {
						t.Errorf("%q is in the File's 30%%, the command says %q", k, lines[i])
					}
					continue
				}
				if want := fmt.Sprintf("%s until the percentage reaches %d", tc.out, bucket); rest != want {
					t.Errorf("%q: %q, want %q", k, lines[i], want)
				}
				// The percentage named is the first that takes the key in.
				for _, p := range []int{bucket - 1, bucket} {
					pct, err := flags.NewPercentFor(group, p)
					if err != nil {
						t.Fatal(err)
					}
					if pct.UseNew(k) != (p == bucket) {
						t.Errorf("%q: at %d%% in the rollout %v", k, p, pct.UseNew(k))
					}
				}
			}
			if in == 0 || in == len(keys) {
				t.Errorf("%d of %d keys in a 30%% rollout", in, len(keys))
			}
		})
	}
}

func TestRolloutGetKeyUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--key", "user:1"}, "--key needs --group"},
		{[]string{"--group", "g"}, "--group is for --key"},
		{[]string{"--group", "g", "--key", "user:1", "--json"}, "--key is printed as text; leave out --json"},
		{[]string{"--group", "g", "--key", strings.Repeat("k", throttler.MaxKeyLen+1)}, "throttler: invalid key"},
	} {
		te := newTestEnv(t)
		args := append([]string{"rollout", "get", "--file", "f"}, tc.args...)
		if code := te.run(args...); code != exitUsage || te.out.Len() > 0 || !strings.Contains(te.errb.String(), tc.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want a usage error saying %q", tc.args, code, te.out.String(), te.errb.String(), tc.want)
		}
	}
}
