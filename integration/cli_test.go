package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/throttlekit/throttlekit/backend/memcached"
	"github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/throttler"
)

// cliBuild builds cmd/throttlekit into a directory of the test's and
// returns the program's path: the tests run the program an operator runs,
// exit statuses included.
func cliBuild(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "throttlekit")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/throttlekit/throttlekit/cmd/throttlekit")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build cmd/throttlekit: %v\n%s", err, out)
	}
	return bin
}

// cliRun runs the program with args and returns its standard output and
// error and its exit status.
func cliRun(t *testing.T, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("run %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

type cliPeek struct {
	Store   string   `json:"store"`
	Allowed bool     `json:"allowed"`
	Used    int64    `json:"used"`
	Differs []string `json:"differs"`
	Error   string   `json:"error"`
}

type cliInspect struct {
	Policies []struct {
		Stores []cliPeek `json:"stores"`
	} `json:"policies"`
	Exit int `json:"exit_status"`
}

type cliShadow struct {
	Mode       string            `json:"mode"`
	KeyPrefix  string            `json:"key_prefix"`
	Planned    int               `json:"planned"`
	Made       int               `json:"made"`
	Compared   uint64            `json:"compared"`
	Mismatched uint64            `json:"mismatched"`
	ByKind     map[string]uint64 `json:"by_kind"`
	Exit       int               `json:"exit_status"`
}

func decodeJSON(t *testing.T, out string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("output is not the JSON expected: %v\n%s", err, out)
	}
}

// TestCLI runs the operator's program against a Memcached, a Redis primary
// and its replica, next to the library writing to them as an application
// does: what the program reads is what the backends stored, it writes
// nothing but its own synthetic keys, and its exit statuses say what it
// found.
func TestCLI(t *testing.T) {
	bin := cliBuild(t)
	primary, replicas := redisReplicaSet(t, 1)
	mc := memcachedStart(t)

	rdb := redisClient(t, primary.Addr)
	rstore, err := redis.New(rdb, nil)
	if err != nil {
		t.Fatal(err)
	}
	mstore, err := memcached.New(memcachedClient(t, 2*time.Second, mc.addr), nil)
	if err != nil {
		t.Fatal(err)
	}
	replica, err := redis.New(redisClient(t, replicas[0].Addr), nil)
	if err != nil {
		t.Fatal(err)
	}
	stores := []string{"--memcached", mc.addr, "--redis", primary.Addr, "--redis-replica", replicas[0].Addr, "--timeout", "2s"}
	ctx := context.Background()
	core := throttler.Policy{Name: "core", Limit: 10, Window: time.Hour}
	bucket := throttler.Policy{Name: "search", Limit: 10, Window: time.Hour}.WithBurst(20)
	policyArgs := []string{"--policy", "name=core,limit=10,window=1h", "--policy", "name=search,limit=10,window=1h,algorithm=token-bucket,burst=20"}

	// The application's calls, at one instant on both stores as a
	// migration's mirror makes them: the windows agree to the millisecond.
	now := time.Now()
	take := func(b throttler.Backend, key string, p throttler.Policy, cost int64) {
		t.Helper()
		if _, err := b.Take(ctx, key, p, cost, now); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range []throttler.Backend{mstore, rstore} {
		take(b, "user:1", core, 3)
		take(b, "user:1", bucket, 20)
	}
	waitReplica := func(key string, used int64) {
		waitFor(t, 10*time.Second, "the replica to hold "+key, func(ctx context.Context) bool {
			d, err := replica.Peek(ctx, key, core, time.Now())
			return err == nil && d.Used == used
		})
	}
	waitReplica("user:1", 3)

	t.Run("inspect agree", func(t *testing.T) {
		out, errOut, code := cliRun(t, bin, append(append([]string{"inspect", "--key", "user:1", "--json"}, policyArgs...), stores...)...)
		if code != 0 {
			t.Fatalf("exit status %d, want 0; stderr %s\n%s", code, errOut, out)
		}
		var rep cliInspect
		decodeJSON(t, out, &rep)
		if len(rep.Policies) != 2 || len(rep.Policies[0].Stores) != 3 {
			t.Fatalf("report has %d policies, want 2 with 3 stores each:\n%s", len(rep.Policies), out)
		}
		for _, s := range rep.Policies[0].Stores {
			if s.Used != 3 || s.Error != "" {
				t.Errorf("core on %s: used %d (%s), want 3", s.Store, s.Used, s.Error)
			}
		}
		for _, s := range rep.Policies[1].Stores {
			if s.Allowed || s.Error != "" { // 20 of 20 taken: a token refills every 6 minutes
				t.Errorf("search on %s: allowed %v (%s), want a denial", s.Store, s.Allowed, s.Error)
			}
		}
	})

	t.Run("inspect differ", func(t *testing.T) {
		take(rstore, "user:2", core, 4)
		take(mstore, "user:2", core, 1)
		waitReplica("user:2", 4)
		out, errOut, code := cliRun(t, bin, append([]string{"inspect", "--key", "user:2", "--policy", "name=core,limit=10,window=1h"}, stores...)...)
		if code != 1 {
			t.Fatalf("exit status %d, want 1; stderr %s\n%s", code, errOut, out)
		}
		text := collapse(out)
		for _, want := range []string{
			"memcached " + mc.addr + " yes 1 9 ",
			"redis " + primary.Addr + " yes 4 6 ",
			"redis-replica " + replicas[0].Addr + " yes 4 6 ",
			"redis differs from memcached (used)",
			"redis-replica differs from memcached (used)",
		} {
			if !strings.Contains(text, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
	})

	t.Run("inspect unreachable", func(t *testing.T) {
		start := time.Now()
		out, errOut, code := cliRun(t, bin, "inspect", "--key", "user:1", "--policy", "name=core,limit=10,window=1h",
			"--memcached", mc.addr, "--redis", closedAddr(t), "--timeout", "1s")
		if code != 3 {
			t.Fatalf("exit status %d, want 3; stderr %s\n%s", code, errOut, out)
		}
		// The start-up check stops it (Redis has Check): no report, the
		// store and the cause on stderr.
		if !strings.Contains(errOut, "connection refused") || !strings.Contains(errOut, "store redis (") ||
			!strings.Contains(errOut, "does not answer") {
			t.Errorf("output does not say why:\n%s\n%s", errOut, out)
		}
		if d := time.Since(start); d > 20*time.Second {
			t.Errorf("took %v", d)
		}
	})

	t.Run("inspect corrupt item", func(t *testing.T) {
		head, _ := memcachedItems("core", "user:bad", time.Now())
		mcRaw := memcachedClient(t, 2*time.Second, mc.addr)
		if err := mcRaw.Set(&memcache.Item{Key: head, Value: []byte("garbage"), Expiration: 3600}); err != nil {
			t.Fatal(err)
		}
		out, errOut, code := cliRun(t, bin, append([]string{"inspect", "--key", "user:bad", "--policy", "name=core,limit=10,window=1h"}, stores...)...)
		if code != 4 {
			t.Fatalf("exit status %d, want 4; stderr %s\n%s", code, errOut, out)
		}
		if !strings.Contains(out, "unexpected item value") || !strings.Contains(out, "a store failed") {
			t.Errorf("output does not say why:\n%s", out)
		}
	})

	t.Run("shadow synthetic agree", func(t *testing.T) {
		keysBefore := rdb.DBSize(ctx).Val()
		out, errOut, code := cliRun(t, bin, append(append([]string{"shadow", "--control", "memcached", "--candidate", "redis",
			"--duration", "2s", "--rate", "100", "--keys", "10", "--concurrency", "4", "--json",
			"--policy", "name=hooks,limit=5,window=1m,algorithm=sliding-log"}, policyArgs...), stores...)...)
		if code != 0 {
			t.Fatalf("exit status %d, want 0; stderr %s\n%s", code, errOut, out)
		}
		var rep cliShadow
		decodeJSON(t, out, &rep)
		t.Logf("synthetic run: %d of %d calls made, %d compared, %d mismatched", rep.Made, rep.Planned, rep.Compared, rep.Mismatched)
		if rep.Mode != "synthetic" || rep.Made < 50 || rep.Compared != uint64(rep.Made) || rep.Mismatched != 0 {
			t.Errorf("made %d, compared %d, mismatched %d (mode %s); want every call compared, none mismatched:\n%s",
				rep.Made, rep.Compared, rep.Mismatched, rep.Mode, out)
		}
		// Only the run's own keys were written: every key Redis gained
		// names the synthetic prefix.
		var gained []string
		iter := rdb.Scan(ctx, 0, "*", 1000).Iterator()
		for iter.Next(ctx) {
			if k := iter.Val(); !strings.Contains(k, "user:") {
				gained = append(gained, k)
			}
		}
		if err := iter.Err(); err != nil {
			t.Fatal(err)
		}
		if n := rdb.DBSize(ctx).Val() - keysBefore; len(gained) == 0 || int64(len(gained)) != n {
			t.Fatalf("Redis gained %d keys, and holds %d that are not the application's", n, len(gained))
		}
		for _, k := range gained {
			if !strings.Contains(k, rep.KeyPrefix) {
				t.Errorf("key %q written outside the synthetic prefix %q", k, rep.KeyPrefix)
			}
		}
	})

	t.Run("shadow peek differ", func(t *testing.T) {
		before := rdb.DBSize(ctx).Val()
		out, errOut, code := cliRun(t, bin, append([]string{"shadow", "--control", "memcached", "--candidate", "redis",
			"--key", "user:1", "--key", "user:2", "--policy", "name=core,limit=10,window=1h", "--json"}, stores...)...)
		if code != 1 {
			t.Fatalf("exit status %d, want 1; stderr %s\n%s", code, errOut, out)
		}
		var rep cliShadow
		decodeJSON(t, out, &rep)
		if rep.Mode != "peek" || rep.Compared != 2 || rep.Mismatched != 1 || rep.ByKind["used"] != 1 {
			t.Errorf("peek run: compared %d, mismatched %d, used %d; want 2, 1 (user:2), 1:\n%s", rep.Compared, rep.Mismatched, rep.ByKind["used"], out)
		}
		if after := rdb.DBSize(ctx).Val(); after != before {
			t.Errorf("a Peek-only run changed Redis: %d keys, then %d", before, after)
		}
	})

	t.Run("shadow replica", func(t *testing.T) {
		out, errOut, code := cliRun(t, bin, append([]string{"shadow", "--control", "redis", "--candidate", "redis-replica",
			"--key", "user:1", "--key", "user:2", "--policy", "name=core,limit=10,window=1h"}, stores...)...)
		if code != 0 {
			t.Fatalf("exit status %d, want 0; stderr %s\n%s", code, errOut, out)
		}
	})

	t.Run("shadow unreachable candidate", func(t *testing.T) {
		before := rdb.DBSize(ctx).Val()
		dead := closedAddr(t)
		out, errOut, code := cliRun(t, bin, "shadow", "--control", "redis", "--candidate", "memcached",
			"--redis", primary.Addr, "--memcached", dead, "--timeout", "1s",
			"--policy", "name=core,limit=10,window=1h", "--duration", "1s")
		if code != 3 {
			t.Fatalf("exit status %d, want 3; stderr %s\n%s", code, errOut, out)
		}
		if !strings.Contains(errOut, "memcached ("+dead+")") {
			t.Errorf("stderr does not name the store: %s", errOut)
		}
		if after := rdb.DBSize(ctx).Val(); after != before {
			t.Errorf("the control was written to before the candidate answered: %d keys, then %d", before, after)
		}
	})

	t.Run("rollout", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "rollout.json")
		if _, errOut, code := cliRun(t, bin, "rollout", "set", "--file", path, "--mirror", "on", "0"); code != 0 {
			t.Fatalf("set: exit status %d; %s", code, errOut)
		}
		src, err := flags.NewFile(path, &flags.FileOptions{Interval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		if _, errOut, code := cliRun(t, bin, "rollout", "set", "--file", path, "25"); code != 0 {
			t.Fatalf("set 25: exit status %d; %s", code, errOut)
		}
		if err := src.Reload(); err != nil {
			t.Fatal(err)
		}
		if src.Percent() != 25 || !src.Mirroring() {
			t.Errorf("the application's File reads percent %d, mirror %v after set 25", src.Percent(), src.Mirroring())
		}
		out, _, code := cliRun(t, bin, "rollout", "get", "--file", path, "--json")
		if code != 0 || out != `{"percent":25,"mirror":true}`+"\n" {
			t.Errorf("get: exit %d, %q", code, out)
		}
		if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
			t.Errorf("the directory holds %d entries, want the rollout file alone", len(entries))
		}
		// The migration's file is no enforcement file.
		if _, errOut, code := cliRun(t, bin, "rollout", "set", "--enforcement", "--file", path, "0"); code != 4 || !strings.Contains(errOut, "has mirroring on") {
			t.Errorf("set --enforcement on the migration's file: exit %d, %s", code, errOut)
		}
	})

	// A policy's enforcement, ramped by the program through a file that the
	// application reads with flags.Enforcement(flags.File), on Redis: at
	// each step the keys refused are those bucketed within the percentage.
	t.Run("rollout --enforcement", func(t *testing.T) {
		const group = "limit-cli"
		path := filepath.Join(t.TempDir(), "limit-cli.json")
		set := func(pct int) {
			t.Helper()
			out, errOut, code := cliRun(t, bin, "rollout", "set", "--enforcement", "--file", path, fmt.Sprint(pct))
			if code != 0 || !strings.Contains(out, fmt.Sprintf("enforced: %d%%", pct)) && !strings.Contains(out, fmt.Sprintf("-> %d%%", pct)) {
				t.Fatalf("set %d: exit status %d, stdout %q, stderr %s", pct, code, out, errOut)
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
		keys := make([]string, 300)
		for i := range keys {
			keys[i] = fmt.Sprintf("cli-enforce:%d", i)
		}
		th, p := enforceAtLimit(t, rstore, enforce, keys, now)
		for _, pct := range []int{1, 10, 100, 0} {
			set(pct)
			if err := src.Reload(); err != nil {
				t.Fatal(err)
			}
			refused, n := enforceRefused(t, th, p, keys)
			for i, k := range keys {
				if want := flags.Bucket(group, k) <= pct; refused[i] != want {
					t.Fatalf("at %d%%: %q refused %v; its bucket says enforced %v", pct, k, refused[i], want)
				}
			}
			if pct > 0 && n == 0 {
				t.Errorf("at %d%%: no key refused", pct)
			}
			out, _, code := cliRun(t, bin, "rollout", "get", "--enforcement", "--file", path)
			if code != 0 || !strings.Contains(out, fmt.Sprintf("enforced: %d%% of keys", pct)) {
				t.Errorf("get at %d%%: exit %d, %q", pct, code, out)
			}
		}
	})
}

// collapse turns each run of spaces into one, so that a check does not
// depend on a table's column widths.
func collapse(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.Join(strings.Fields(l), " ") + " "
	}
	return strings.Join(lines, "\n")
}
