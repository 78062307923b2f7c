package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/backend"
	"github.com/throttlekit/throttlekit/throttler"
)

var core = throttler.Policy{Name: "core", Limit: 10, Window: time.Minute}

var inspectArgs = []string{"inspect", "--policy", "name=core,limit=10,window=1m", "--key", "user:42",
	"--memcached", "10.0.0.5:11211", "--redis", "10.0.1.5:6379", "--redis-replica", "10.0.1.6:6379"}

// A replica that has not received the last Take yet: it differs in used.
func TestInspectDiffer(t *testing.T) {
	for _, format := range []string{"txt", "json"} {
		t.Run(format, func(t *testing.T) {
			te := newTestEnv(t)
			te.take(t, storeMemcached, "user:42", core, 3, t0.Add(-10*time.Second))
			te.take(t, storeRedis, "user:42", core, 3, t0.Add(-10*time.Second))
			te.take(t, storeRedisReplica, "user:42", core, 2, t0.Add(-10*time.Second))
			args := inspectArgs
			if format == "json" {
				args = append(args[:len(args):len(args)], "--json")
			}
			if code := te.run(args...); code != exitDiffer {
				t.Errorf("exit status %d, want %d; stderr %s", code, exitDiffer, te.errb.String())
			}
			golden(t, "inspect_differ."+format, te.out.Bytes())
		})
	}
}

// Two policies, the stores agreeing on both; a key without a window reads
// as empty, with the reset-at a window opened now would have.
func TestInspectAgree(t *testing.T) {
	te := newTestEnv(t)
	for _, s := range []string{storeMemcached, storeRedis} {
		te.take(t, s, "user:42", core, 10, t0.Add(-59*time.Second)) // denied from here on
	}
	code := te.run("inspect", "--policy", "name=core,limit=10,window=1m", "--policy", "name=search,limit=10,window=1s,algorithm=token-bucket,burst=20",
		"--key", "user:42", "--memcached", "10.0.0.5:11211", "--redis", "10.0.1.5:6379")
	if code != exitOK {
		t.Errorf("exit status %d, want 0; stderr %s", code, te.errb.String())
	}
	golden(t, "inspect_agree.txt", te.out.Bytes())
}

func TestInspectOneStore(t *testing.T) {
	te := newTestEnv(t)
	te.take(t, storeRedis, "user:42", core, 4, t0.Add(-time.Second))
	if code := te.run("inspect", "--policy", "name=core,limit=10,window=1m", "--key", "user:42", "--redis", "10.0.1.5:6379"); code != exitOK {
		t.Errorf("exit status %d, want 0", code)
	}
	for _, want := range []string{"redis 10.0.1.5:6379 yes 4 6", "one store: nothing to compare"} {
		if !strings.Contains(spaced(te.out.String()), want) {
			t.Errorf("output lacks %q:\n%s", want, te.out.String())
		}
	}
}

// failing is a store whose every call fails with err.
func failing(err error) throttler.Backend {
	return backend.OpFunc(func(context.Context, throttler.Op, string, throttler.Policy, int64, time.Time, time.Time) (throttler.Decision, error) {
		return throttler.Decision{}, err
	})
}

func TestInspectFailures(t *testing.T) {
	unavailable := fmt.Errorf("%w: dial tcp 10.0.1.5:6379: connection refused", throttler.ErrUnavailable)
	corrupt := throttler.KeyFailure(fmt.Errorf("memcached: unexpected item value"))
	tests := []struct {
		name      string
		broken    string // the store that fails
		err       error
		wantCode  int
		wantLines []string
	}{
		{"candidate unreachable", storeRedis, unavailable, exitUnreachable, []string{"redis 10.0.1.5:6379 - - - - - error", "error: redis: throttler: backend unavailable: dial tcp", "a store is unreachable"}},
		{"reference unreachable", storeMemcached, unavailable, exitUnreachable, []string{"memcached 10.0.0.5:11211 - - - - - error", "redis 10.0.1.5:6379 yes 0 10", "a store is unreachable"}},
		{"corrupt item", storeRedisReplica, corrupt, exitFailed, []string{"error: redis-replica: memcached: unexpected item value", "a store failed"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			te := newTestEnv(t)
			te.backends[tt.broken] = failing(tt.err)
			if code := te.run(inspectArgs...); code != tt.wantCode {
				t.Errorf("exit status %d, want %d", code, tt.wantCode)
			}
			out := spaced(te.out.String())
			for _, want := range tt.wantLines {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, te.out.String())
				}
			}
		})
	}
}

// TestInspectReadsOnly: inspecting a key changes nothing in any store.
func TestInspectReadsOnly(t *testing.T) {
	te := newTestEnv(t)
	te.take(t, storeRedis, "user:42", core, 3, t0.Add(-time.Second))
	for range 3 {
		te.out.Reset()
		te.run(inspectArgs...)
	}
	for name, want := range map[string]int64{storeMemcached: 0, storeRedis: 3, storeRedisReplica: 0} {
		d, err := te.backends[name].Peek(context.Background(), "user:42", core, t0)
		if err != nil || d.Used != want {
			t.Errorf("%s: used %d (%v) after inspecting, want %d", name, d.Used, err, want)
		}
	}
}

// spaced collapses each run of spaces in s to one, so that a test does not
// depend on a table's column widths.
func spaced(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.Join(strings.Fields(l), " ")
	}
	return strings.Join(lines, "\n")
}

// The manual's example is the output of TestInspectDiffer, so that it shows
// what the program prints.
func TestInspectManualExample(t *testing.T) {
	want, err := os.ReadFile(filepath.Join("testdata", "inspect_differ.txt"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(want), "\n"), "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = "    " + l
		}
	}
	if !strings.Contains(inspectPage.examples, strings.Join(lines, "\n")) {
		t.Errorf("the inspect manual's example is not testdata/inspect_differ.txt")
	}
}

// A store that does not answer within --timeout is reported as timed out, in the shadow's
// words, not as a bare "context deadline exceeded".
func TestInspectTimeout(t *testing.T) {
	te := newTestEnv(t)
	te.backends[storeRedis] = backend.OpFunc(func(ctx context.Context, _ throttler.Op, _ string, _ throttler.Policy, _ int64, _, _ time.Time) (throttler.Decision, error) {
		<-ctx.Done()
		return throttler.Decision{}, ctx.Err()
	})
	code := te.run("inspect", "--policy", "name=core,limit=10,window=1m", "--key", "user:42",
		"--memcached", "10.0.0.5:11211", "--redis", "10.0.1.5:6379", "--timeout", "20ms")
	if code != exitFailed {
		t.Errorf("exit status %d, want %d", code, exitFailed)
	}
	if want := "error: redis: shadow: candidate timed out after 20ms"; !strings.Contains(te.out.String(), want) {
		t.Errorf("output lacks %q:\n%s", want, te.out.String())
	}
}
