package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// syntheticKey is key i of a run started at t0.
func syntheticKey(i int) string {
	return defaultKeyPrefix + strconv.FormatInt(t0.UnixMilli(), 36) + ":" + strconv.Itoa(i)
}

var shadowArgs = []string{"shadow", "--control", "memcached", "--candidate", "redis",
	"--memcached", "10.0.0.5:11211", "--redis", "10.0.1.5:6379",
	"--policy", "name=core,limit=3,window=1m", "--duration", "2s", "--rate", "20", "--keys", "4"}

func withArgs(base []string, more ...string) []string {
	return append(append([]string{}, base...), more...)
}

func TestShadowAgree(t *testing.T) {
	te := newTestEnv(t)
	if code := te.run(shadowArgs...); code != exitOK {
		t.Errorf("exit status %d, want 0; stderr %s", code, te.errb.String())
	}
	golden(t, "shadow_agree.txt", te.out.Bytes())
	// 40 calls paced 50ms apart: the last one was due 1.95s after the start.
	if want := t0.Add(1950 * time.Millisecond); !te.clock.Equal(want) {
		t.Errorf("the traffic ended at %v, want %v", te.clock, want)
	}
	// The synthetic keys were counted in both stores alike: key 0 went
	// through take, take, peek, refund twice and two more takes, the last
	// one denied at the limit of 3.
	p := throttler.Policy{Name: "core", Limit: 3, Window: time.Minute}
	for _, s := range []string{storeMemcached, storeRedis} {
		d, err := te.backends[s].Peek(context.Background(), syntheticKey(0), p, t0.Add(2*time.Second))
		if err != nil || d.Used != 3 {
			t.Errorf("%s: synthetic key 0 used %d (%v), want 3", s, d.Used, err)
		}
	}
}

// The candidate lost key 0's window (an evicting store would): its answers
// for that key differ, and the report says how.
func TestShadowDiffer(t *testing.T) {
	p := throttler.Policy{Name: "core", Limit: 3, Window: time.Minute}
	for _, format := range []string{"txt", "json"} {
		t.Run(format, func(t *testing.T) {
			te := newTestEnv(t)
			te.take(t, storeMemcached, syntheticKey(0), p, 2, t0.Add(-time.Second))
			args := shadowArgs
			if format == "json" {
				args = withArgs(args, "--json", "--show", "3")
			}
			if code := te.run(args...); code != exitDiffer {
				t.Errorf("exit status %d, want %d; stderr %s", code, exitDiffer, te.errb.String())
			}
			golden(t, "shadow_differ."+format, te.out.Bytes())
		})
	}
}

// Given keys are compared by Peek alone, once under each policy, and
// nothing is written.
func TestShadowPeekOnly(t *testing.T) {
	te := newTestEnv(t)
	p := throttler.Policy{Name: "core", Limit: 3, Window: time.Minute}
	te.take(t, storeMemcached, "user:1", p, 2, t0.Add(-time.Second))
	te.take(t, storeRedis, "user:1", p, 2, t0.Add(-time.Second))
	te.take(t, storeMemcached, "user:2", p, 1, t0.Add(-time.Second))
	keysFile := filepath.Join(t.TempDir(), "keys.txt")
	if err := os.WriteFile(keysFile, []byte("# hot keys\nuser:2\n\nuser:3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code := te.run("shadow", "--control", "memcached", "--candidate", "redis",
		"--memcached", "10.0.0.5:11211", "--redis", "10.0.1.5:6379",
		"--policy", "name=core,limit=3,window=1m", "--policy", "name=search,limit=5,window=1s,algorithm=sliding-window",
		"--key", "user:1", "--keys-file", keysFile)
	if code != exitDiffer {
		t.Errorf("exit status %d, want %d; stderr %s", code, exitDiffer, te.errb.String())
	}
	golden(t, "shadow_peek.txt", te.out.Bytes())
	for _, c := range []struct {
		store, key string
		used       int64
	}{{storeMemcached, "user:1", 2}, {storeRedis, "user:1", 2}, {storeMemcached, "user:2", 1}, {storeRedis, "user:2", 0}, {storeRedis, "user:3", 0}} {
		d, err := te.backends[c.store].Peek(context.Background(), c.key, p, t0)
		if err != nil || d.Used != c.used {
			t.Errorf("%s %s: used %d (%v) after a Peek-only run, want %d", c.store, c.key, d.Used, err, c.used)
		}
	}
}

// --live sends the traffic to the given keys: their clients pay for it.
func TestShadowLive(t *testing.T) {
	te := newTestEnv(t)
	code := te.run("shadow", "--control", "memcached", "--candidate", "redis",
		"--memcached", "10.0.0.5:11211", "--redis", "10.0.1.5:6379",
		"--policy", "name=core,limit=3,window=1m", "--key", "user:9", "--live", "--duration", "1s", "--rate", "5", "--ops", "take")
	if code != exitOK {
		t.Errorf("exit status %d; stderr %s", code, te.errb.String())
	}
	if !strings.Contains(te.out.String(), "traffic:   LIVE keys (1 given)") {
		t.Errorf("the report does not say the keys were live:\n%s", te.out.String())
	}
	p := throttler.Policy{Name: "core", Limit: 3, Window: time.Minute}
	for _, s := range []string{storeMemcached, storeRedis} {
		if d, _ := te.backends[s].Peek(context.Background(), "user:9", p, t0.Add(time.Second)); d.Used != 3 {
			t.Errorf("%s: user:9 used %d, want 3 (5 takes, 3 admitted)", s, d.Used)
		}
	}
}

// A store that does not answer stops the run before any traffic.
func TestShadowUnreachable(t *testing.T) {
	te := newTestEnv(t)
	te.backends[storeRedis] = failing(fmt.Errorf("%w: dial tcp 10.0.1.5:6379: connection refused", throttler.ErrUnavailable))
	if code := te.run(shadowArgs...); code != exitUnreachable {
		t.Errorf("exit status %d, want %d", code, exitUnreachable)
	}
	if want := "throttlekit shadow: redis (10.0.1.5:6379): throttler: backend unavailable: dial tcp"; !strings.Contains(te.errb.String(), want) {
		t.Errorf("stderr %q lacks %q", te.errb.String(), want)
	}
	p := throttler.Policy{Name: "core", Limit: 3, Window: time.Minute}
	if d, _ := te.backends[storeMemcached].Peek(context.Background(), syntheticKey(0), p, t0); d.Used != 0 {
		t.Errorf("the control was written to: used %d", d.Used)
	}
}

// Stores slower than the rate: the run ends at its duration with the calls
// it made, and says so; an interrupt ends it too, and what was sent is
// still compared and reported.
func TestShadowCutShort(t *testing.T) {
	t.Run("slow", func(t *testing.T) {
		te := newTestEnv(t)
		te.sleepUntil = func(_ context.Context, at time.Time) {
			te.clock = te.clock.Add(100 * time.Millisecond) // each call takes 100ms
		}
		if code := te.run(shadowArgs...); code != exitOK {
			t.Errorf("exit status %d; stderr %s", code, te.errb.String())
		}
		if want := "calls:     20 of 40 made (take 12, peek 4, refund 4); the stores were too slow for the rate"; !strings.Contains(te.out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, te.out.String())
		}
	})
	t.Run("interrupted", func(t *testing.T) {
		te := newTestEnv(t)
		ctx, cancel := context.WithCancel(context.Background())
		calls := 0
		te.sleepUntil = func(_ context.Context, at time.Time) {
			if calls++; calls > 6 {
				cancel()
			}
			te.clock = at
		}
		if code := te.env.run(ctx, shadowArgs); code != exitOK {
			t.Errorf("exit status %d; stderr %s", code, te.errb.String())
		}
		if want := "calls:     6 of 40 made (take 6); interrupted"; !strings.Contains(te.out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, te.out.String())
		}
		if want := "compared 6"; !strings.Contains(spaced(te.out.String()), want) {
			t.Errorf("report lacks %q:\n%s", want, te.out.String())
		}
	})
}

// With calls in flight on several workers, each key's calls still reach the
// stores in order: the same counts as one at a time, and the same
// mismatches on the key the candidate lost.
func TestShadowConcurrency(t *testing.T) {
	p := throttler.Policy{Name: "core", Limit: 3, Window: time.Minute}
	sequential := newTestEnv(t)
	sequential.take(t, storeMemcached, syntheticKey(0), p, 2, t0.Add(-time.Second))
	if code := sequential.run(withArgs(shadowArgs, "--json")...); code != exitDiffer {
		t.Fatalf("one at a time: exit %d; %s", code, sequential.errb.String())
	}
	for _, n := range []string{"2", "4", "9"} {
		t.Run(n, func(t *testing.T) {
			te := newTestEnv(t)
			te.take(t, storeMemcached, syntheticKey(0), p, 2, t0.Add(-time.Second))
			if code := te.run(withArgs(shadowArgs, "--json", "--concurrency", n)...); code != exitDiffer {
				t.Fatalf("exit %d; %s", code, te.errb.String())
			}
			// Everything but the concurrency is the sequential run's.
			want := strings.Replace(sequential.out.String(), `"concurrency": 1,`, `"concurrency": `+map[string]string{"2": "2", "4": "4", "9": "4"}[n]+`,`, 1)
			if te.out.String() != want {
				t.Errorf("report differs from the sequential run's:\n%s\nwant:\n%s", te.out.String(), want)
			}
			for i := range 4 {
				for _, s := range []string{storeMemcached, storeRedis} {
					got, _ := te.backends[s].Peek(context.Background(), syntheticKey(i), p, t0.Add(2*time.Second))
					seq, _ := sequential.backends[s].Peek(context.Background(), syntheticKey(i), p, t0.Add(2*time.Second))
					if got != seq {
						t.Errorf("%s key %d: %+v, one at a time %+v", s, i, got, seq)
					}
				}
			}
		})
	}
}
