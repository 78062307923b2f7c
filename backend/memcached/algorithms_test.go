package memcached

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/throttlekit/throttlekit/backend/backendtest"
	"github.com/throttlekit/throttlekit/internal/algo"
	"github.com/throttlekit/throttlekit/throttler"
)

var algPolicies = []throttler.Policy{
	{Name: "tb", Limit: 10, Window: time.Second, Algorithm: throttler.TokenBucket, Burst: 3},
	{Name: "sl", Limit: 3, Window: time.Second, Algorithm: throttler.SlidingLog},
	{Name: "sw", Limit: 3, Window: time.Second, Algorithm: throttler.SlidingWindow},
}

// startMemcached runs a memcached process on a free local port for the
// test and returns its address (see memcachedBinary).
func startMemcached(t testing.TB) string {
	t.Helper()
	bin := memcachedBinary(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	args := []string{"-p", strconv.Itoa(port), "-l", "127.0.0.1", "-U", "0", "-c", "4096"}
	if os.Geteuid() == 0 {
		args = append(args, "-u", "nobody") // memcached refuses to run as root
	}
	var stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return addr
		}
		select {
		case <-exited:
			t.Fatalf("memcached exited: %s", stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("memcached at %s did not start: %v", addr, err)
		}
		time.Sleep(10 * time.Millisecond) // waiting for a process, not moving a clock
	}
}

// memcachedBinary returns the path of memcached. Without it the test is
// skipped, so that a checkout without memcached still tests the rest; but
// under CI=true it fails: a green CI run must have run these tests.
func memcachedBinary(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("memcached")
	switch {
	case err == nil:
		return bin
	case os.Getenv("CI") == "true":
		t.Fatalf("memcached is not on PATH, and CI=true: install it (Debian: apt-get install memcached) so that these tests run: %v", err)
	default:
		t.Skip("memcached is not on PATH (under CI=true this fails)")
	}
	return ""
}

// recorder is a testing.TB that records how a helper ended the test, on a
// goroutine of its own (Fatal and Skip end it with runtime.Goexit).
type recorder struct {
	testing.TB
	failed, skipped bool
}

func (r *recorder) Fatalf(string, ...any) { r.failed = true; runtime.Goexit() }
func (r *recorder) Skip(...any)           { r.skipped = true; runtime.Goexit() }

func (r *recorder) run(f func(testing.TB)) {
	done := make(chan struct{})
	go func() { defer close(done); f(r) }()
	<-done
}

// Without the memcached binary, the tests that need it are skipped, except
// under CI=true, where they fail: a green CI run cannot have tested nothing.
func TestMissingMemcachedFailsUnderCI(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	for _, ci := range []string{"", "false", "true"} {
		t.Setenv("CI", ci)
		r := &recorder{TB: t}
		r.run(func(tb testing.TB) { memcachedBinary(tb) })
		if want := ci == "true"; r.failed != want || r.skipped == want {
			t.Errorf("CI=%q: failed %v, skipped %v; want failed %v", ci, r.failed, r.skipped, want)
		}
	}
}

func newRealClient(addr string) *memcache.Client {
	c := memcache.New(addr)
	c.Timeout = 2 * time.Second
	c.MaxIdleConns = 128
	return c
}

// TestConformanceReal runs the whole suite, every algorithm included,
// against a real memcached.
func TestConformanceReal(t *testing.T) {
	c := newRealClient(startMemcached(t))
	backendtest.Run(t, func(t *testing.T) throttler.Backend { return mustNew(t, c, nil) })
}

// TestConformanceFake runs the suite on the in-process fake, so that it
// runs where memcached is not installed.
func TestConformanceFake(t *testing.T) {
	f := newFakeClient()
	backendtest.Run(t, func(t *testing.T) throttler.Backend { return mustNew(t, f, nil) })
}

// casCounter counts the cas and add calls that lost to another writer.
type casCounter struct {
	Client
	lost atomic.Int64
}

func (c *casCounter) CompareAndSwap(it *memcache.Item) error {
	err := c.Client.CompareAndSwap(it)
	if errors.Is(err, memcache.ErrCASConflict) || errors.Is(err, memcache.ErrNotStored) || errors.Is(err, memcache.ErrCacheMiss) {
		c.lost.Add(1)
	}
	return err
}

func (c *casCounter) Add(it *memcache.Item) error {
	err := c.Client.Add(it)
	if errors.Is(err, memcache.ErrNotStored) {
		c.lost.Add(1)
	}
	return err
}

// TestContentionReal: 64 goroutines take from one key of a real memcached
// at one instant, through one Backend or through 8 (as 8 processes would);
// exactly the capacity is admitted, and the lost rounds (cas or add that
// lost to another writer) per admitted Take are logged. Through one
// Backend no call fails (its callers take turns); across 8, a call may run
// out of MaxAttempts, and then fails with ErrContention, never admitting.
func TestContentionReal(t *testing.T) {
	addr := startMemcached(t)
	for _, backends := range []int{1, 8} {
		for _, alg := range []throttler.Algorithm{throttler.TokenBucket, throttler.SlidingLog, throttler.SlidingWindow} {
			t.Run(fmt.Sprintf("%d backends/%v", backends, alg), func(t *testing.T) {
				p := throttler.Policy{Name: "hot" + strconv.Itoa(backends), Limit: 500, Window: time.Hour, Algorithm: alg}
				var bs []*Backend
				var ccs []*casCounter
				for range backends {
					cc := &casCounter{Client: newRealClient(addr)}
					ccs = append(ccs, cc)
					bs = append(bs, mustNew(t, cc, nil))
				}
				var admitted, errs, otherErrs atomic.Int64
				var wg sync.WaitGroup
				start := time.Now()
				for g := 0; g < 64; g++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := 0; i < 10; i++ {
							d, err := bs[g%backends].Take(context.Background(), "k", p, 1, t0)
							if err != nil {
								errs.Add(1)
								if !errors.Is(err, ErrContention) {
									otherErrs.Add(1)
								}
								continue
							}
							if d.Allowed {
								admitted.Add(1)
							}
						}
					}()
				}
				wg.Wait()
				var lost int64
				for _, cc := range ccs {
					lost += cc.lost.Load()
				}
				if admitted.Load() != 500 || otherErrs.Load() != 0 || (backends == 1 && errs.Load() != 0) {
					t.Errorf("admitted %d, %d errors (%d not ErrContention); want 500", admitted.Load(), errs.Load(), otherErrs.Load())
				}
				t.Logf("%d backends, %v: 640 takes by 64 goroutines, %d admitted, %d ErrContention, %d lost cas/add: %.2f retries per admitted take, %v",
					backends, alg, admitted.Load(), errs.Load(), lost, float64(lost)/float64(admitted.Load()), time.Since(start).Round(time.Millisecond))
			})
		}
	}
}

// TestAlgorithmRoundTrips pins the server calls of each path.
func TestAlgorithmRoundTrips(t *testing.T) {
	ctx := context.Background()
	type want = map[string]int
	for _, p := range algPolicies {
		t.Run(p.Algorithm.String(), func(t *testing.T) {
			f := newFakeClient()
			b := mustNew(t, f, nil)
			var taken throttler.Decision // the Take the refund names
			checkCalls(t, f, []callStep{
				{"peek, no state", func() error { _, err := b.Peek(ctx, "k", p, t0); return err }, want{"get": 1}},
				{"refund, no state", func() error { _, err := b.Refund(ctx, "k", p, 1, t0.Add(p.Window), t0); return err }, want{"get": 1}},
				{"first take", func() error { _, err := b.Take(ctx, "k", p, 1, t0); return err }, want{"get": 1, "add": 1}},
				{"take", func() (err error) { taken, err = b.Take(ctx, "k", p, 2, t0); return err }, want{"get": 1, "cas": 1}},
				{"denied take", func() error { _, err := b.Take(ctx, "k", p, 1, t0); return err }, want{"get": 1}},
				{"peek", func() error { _, err := b.Peek(ctx, "k", p, t0); return err }, want{"get": 1}},
				{"refund", func() error { _, err := b.Refund(ctx, "k", p, 1, taken.ResetAt, t0); return err }, want{"get": 1, "cas": 1}},
			})
		})
	}
}

// callStep is a call and the server commands it must make, by name.
type callStep struct {
	name string
	do   func() error
	want map[string]int
}

// checkCalls makes each step's call and checks the commands it made on f.
func checkCalls(t *testing.T, f *fakeClient, steps []callStep) {
	t.Helper()
	for _, s := range steps {
		f.callCounts()
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := f.callCounts(); !maps.Equal(got, s.want) {
			t.Errorf("%s: calls %v, want %v", s.name, got, s.want)
		}
	}
}

// TestAlgorithmContention: a cas that keeps losing is retried up to
// MaxAttempts rounds, then the call fails with ErrContention and writes
// nothing; losing fewer times than that still admits, exactly once.
func TestAlgorithmContention(t *testing.T) {
	ctx := context.Background()
	for _, p := range algPolicies {
		for _, tt := range []struct {
			losses  int
			wantErr bool
		}{{0, false}, {1, false}, {3, false}, {4, true}, {100, true}} {
			name := fmt.Sprintf("%v/lose %d", p.Algorithm, tt.losses)
			maxAttempts := 4
			if !tt.wantErr {
				maxAttempts = tt.losses + 1
			}
			t.Run(name, func(t *testing.T) {
				f := newFakeClient()
				b := mustNew(t, f, &Options{MaxAttempts: maxAttempts})
				if _, err := b.Take(ctx, "k", p, 1, t0); err != nil { // creates the item: later writes are cas
					t.Fatal(err)
				}
				var lost int
				f.setBefore(func(op, key string) error {
					if op == "cas" && lost < tt.losses {
						lost++
						return memcache.ErrCASConflict
					}
					return nil
				})
				f.callCounts()
				d, err := b.Take(ctx, "k", p, 1, t0)
				calls := f.callCounts()
				f.setBefore(nil)
				if tt.wantErr {
					if !errors.Is(err, ErrContention) || !strings.HasPrefix(err.Error(), "memcached: ") {
						t.Fatalf("err %v, want ErrContention", err)
					}
					if calls["get"] != maxAttempts || calls["cas"] != maxAttempts {
						t.Errorf("calls %v, want %d gets and cas", calls, maxAttempts)
					}
				} else {
					if err != nil || !d.Allowed || d.Remaining != 1 {
						t.Fatalf("got %+v, %v; want admitted with 1 left", d, err)
					}
					if calls["get"] != tt.losses+1 || calls["cas"] != tt.losses+1 {
						t.Errorf("calls %v, want %d gets and cas", calls, tt.losses+1)
					}
				}
				want := int64(1) // what is left: only the successful takes counted
				if tt.wantErr {
					want = 2
				}
				if d, err := b.Peek(ctx, "k", p, t0); err != nil || d.Remaining != want {
					t.Errorf("after: %+v, %v; want %d left", d, err, want)
				}
			})
		}
	}
	// A lost add (another process created the item first) is a lost round too.
	f := newFakeClient()
	b := mustNew(t, f, &Options{MaxAttempts: 2})
	p := algPolicies[2]
	k := newItemKeys(b.opts.Prefix, p, "k").state()
	f.setBefore(func(op, key string) error {
		if op == "add" {
			f.setBefore(nil)
			f.set(key, string(appendCounter(nil, algo.CounterState{K: t0.UnixMilli() / 1000, Curr: 2, Window: 1000})))
		}
		return nil
	})
	if d, err := b.Take(ctx, "k", p, 1, t0); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Errorf("after a lost add: %+v, %v; want admitted on the other's count", d, err)
	}
	if v, _ := f.value(k); !bytes.Equal([]byte(v), appendCounter(nil, algo.CounterState{K: t0.UnixMilli() / 1000, Curr: 3, Window: 1000})) {
		t.Errorf("stored %x", v)
	}
}

// TestAlgorithmBadItems: a value that is not this algorithm's state is
// ErrBadItem for every operation, and is left alone.
func TestAlgorithmBadItems(t *testing.T) {
	ctx := context.Background()
	bucket := appendBucket(nil, algo.TokenBucketState{Tokens: 1000, At: t0.UnixMilli(), Window: 1000})
	counter := appendCounter(nil, algo.CounterState{K: 5, Curr: 1, Prev: 2, Window: 1000})
	log := appendLog(nil, []algo.LogEntry{{At: 10, Units: 1}, {At: 12, Units: 2}})
	bad := map[throttler.Algorithm][]struct {
		name  string
		value []byte
	}{
		throttler.TokenBucket: {
			{"empty", nil},
			{"a fixed-window count", []byte("12")},
			{"a counter", counter},
			{"a later version", append([]byte{0xB2}, bucket[1:]...)},
			{"truncated", bucket[:len(bucket)-1]},
			{"trailing byte", append(bytes.Clone(bucket), 0)},
			{"zero window", appendBucket(nil, algo.TokenBucketState{Tokens: 1, Window: 0})},
			{"tokens above 2^53", appendBucket(nil, algo.TokenBucketState{Tokens: 1<<53 + 1, Window: 1})},
			{"overlong varint", append([]byte{0xB1}, bytes.Repeat([]byte{0xff}, 11)...)},
		},
		throttler.SlidingWindow: {
			{"empty", nil},
			{"a bucket", bucket},
			{"truncated", counter[:len(counter)-1]},
			{"trailing byte", append(bytes.Clone(counter), 1)},
			{"curr above MaxLimit", appendCounter(nil, algo.CounterState{Curr: throttler.MaxLimit + 1, Window: 1})},
			{"negative window", append([]byte{0xC1}, appendBucket(nil, algo.TokenBucketState{Window: -1})[1:]...)},
		},
		throttler.SlidingLog: {
			{"empty", nil},
			{"a counter", counter},
			{"truncated", log[:len(log)-1]},
			{"trailing byte", append(bytes.Clone(log), 1)},
			{"more entries than bytes", []byte{0xD1, 0x90, 0x4e}},
			{"above MaxLogLimit entries", binaryLog(throttler.MaxLogLimit+1, 1)},
			{"at not increasing", append(appendLog(nil, []algo.LogEntry{{At: 10, Units: 1}})[:1], 2, 20, 1, 0, 1)},
			{"zero units", appendLog(nil, []algo.LogEntry{{At: 10, Units: 0}})},
			{"units above MaxLogLimit", appendLog(nil, []algo.LogEntry{{At: 10, Units: throttler.MaxLogLimit + 1}})},
			{"at overflows", appendLog(nil, []algo.LogEntry{{At: 1<<63 - 2, Units: 1}, {At: -(1 << 63) + 5, Units: 1}})},
		},
	}
	for _, p := range algPolicies {
		for _, tt := range bad[p.Algorithm] {
			t.Run(p.Algorithm.String()+"/"+tt.name, func(t *testing.T) {
				f := newFakeClient()
				b := mustNew(t, f, nil)
				k := newItemKeys(b.opts.Prefix, p, "k").state()
				f.set(k, string(tt.value))
				for op, call := range map[string]func() error{
					"take":   func() error { _, err := b.Take(ctx, "k", p, 1, t0); return err },
					"peek":   func() error { _, err := b.Peek(ctx, "k", p, t0); return err },
					"refund": func() error { _, err := b.Refund(ctx, "k", p, 1, t0.Add(p.Window), t0); return err },
				} {
					if err := call(); !errors.Is(err, ErrBadItem) || !strings.HasPrefix(err.Error(), "memcached: ") {
						t.Errorf("%s: err %v, want ErrBadItem", op, err)
					}
				}
				if v, _ := f.value(k); v != string(tt.value) {
					t.Errorf("the item was changed to %x", v)
				}
			})
		}
	}
}

// binaryLog is a log of n entries 1 ms apart, each of units.
func binaryLog(n int, units int64) []byte {
	log := make([]algo.LogEntry, n)
	for i := range log {
		log[i] = algo.LogEntry{At: t0.UnixMilli() + int64(i), Units: units}
	}
	return appendLog(nil, log)
}

// TestAlgorithmKeys: the state item is a legal key apart from the
// fixed-window items of the same name and key.
func TestAlgorithmKeys(t *testing.T) {
	f := newFakeClient()
	b := mustNew(t, f, nil)
	ctx := context.Background()
	fw := throttler.Policy{Name: "api", Limit: 1, Window: time.Second}
	if _, err := b.Take(ctx, "k", fw, 1, t0); err != nil {
		t.Fatal(err)
	}
	for _, p := range algPolicies {
		p.Name = "api"
		if d, err := b.Take(ctx, "k", p, 1, t0); err != nil || !d.Allowed {
			t.Fatalf("%v: %+v, %v", p.Algorithm, d, err)
		}
		for _, key := range []string{"k", strings.Repeat("é", 200), "a b\x00c"} {
			ik := newItemKeys(b.opts.Prefix, p, key).state()
			if !legalKey(ik) || !strings.HasPrefix(ik, "throttlekit:s:") {
				t.Errorf("%v, %q: item key %q", p.Algorithm, key, ik)
			}
		}
	}
	f.mu.Lock()
	n := len(f.items)
	f.mu.Unlock()
	if n != 5 { // fixed window: head and counter; one state each
		t.Errorf("%d items, want 5", n)
	}
}

// TestAlgorithmExptime: the state item expires when its state ends, plus
// the margin, rounded up to seconds; beyond 30 days it never expires.
func TestAlgorithmExptime(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		p    throttler.Policy
		want int32
	}{
		// One token of three taken, 10 per second: full again in 100 ms.
		{throttler.Policy{Limit: 10, Window: time.Second, Algorithm: throttler.TokenBucket, Burst: 3}, 3},
		// The entry at t0 ends at t0+1s.
		{throttler.Policy{Limit: 3, Window: time.Second, Algorithm: throttler.SlidingLog}, 3},
		// t0 is at the start of a second: (K+2)·w is t0+2s.
		{throttler.Policy{Limit: 3, Window: time.Second, Algorithm: throttler.SlidingWindow}, 4},
		{throttler.Policy{Limit: 3, Window: 29 * 24 * time.Hour, Algorithm: throttler.SlidingLog}, 29*24*3600 + 2},
		{throttler.Policy{Limit: 3, Window: 31 * 24 * time.Hour, Algorithm: throttler.SlidingLog}, 0},
		{throttler.Policy{Limit: 3, Window: 31 * 24 * time.Hour, Algorithm: throttler.SlidingWindow}, 0},
	}
	for _, tt := range tests {
		f := newFakeClient()
		b := mustNew(t, f, nil)
		if _, err := b.Take(ctx, "k", tt.p, 1, t0); err != nil {
			t.Fatal(err)
		}
		k := newItemKeys(b.opts.Prefix, tt.p, "k").state()
		if got := f.exptimeOf(k); got != tt.want {
			t.Errorf("%v: exptime %d, want %d", tt.p, got, tt.want)
		}
	}
}

// TestFullLogReal: a log of MaxLogLimit entries fits in one item of a
// real memcached (1 MB default) and is read and written back.
func TestFullLogReal(t *testing.T) {
	c := newRealClient(startMemcached(t))
	b := mustNew(t, c, nil)
	ctx := context.Background()
	p := throttler.Policy{Name: "full", Limit: throttler.MaxLogLimit, Window: 24 * time.Hour, Algorithm: throttler.SlidingLog}
	log := make([]algo.LogEntry, throttler.MaxLogLimit-1)
	for i := range log { // one take every 8.6 s: the largest distance that fits in a day
		log[i] = algo.LogEntry{At: t0.UnixMilli() + int64(i)*8_639, Units: 1}
	}
	value := appendLog(nil, log)
	t.Logf("a log of %d entries over a day: %d bytes", len(log), len(value))
	if len(value) > 64<<10 {
		t.Errorf("%d bytes", len(value))
	}
	k := newItemKeys(b.opts.Prefix, p, "k").state()
	if err := c.Set(&memcache.Item{Key: k, Value: value}); err != nil {
		t.Fatal(err)
	}
	now := time.UnixMilli(log[len(log)-1].At + 1)
	if d, err := b.Take(ctx, "k", p, 1, now); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("take: %+v, %v", d, err)
	}
	if d, err := b.Take(ctx, "k", p, 1, now); err != nil || d.Allowed {
		t.Fatalf("take when full: %+v, %v", d, err)
	}
	it, err := c.Get(k)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeLog(it.Value)
	if err != nil || len(got) != throttler.MaxLogLimit {
		t.Fatalf("stored log: %d entries, %v", len(got), err)
	}
}

// TestStateEncoding: states round trip, and a full log stays far below
// Memcached's item limit.
func TestStateEncoding(t *testing.T) {
	for _, st := range []algo.TokenBucketState{
		{}, {Tokens: 1 << 53, At: -1 << 63, Window: 1}, {Tokens: 7, At: 1<<63 - 1, Window: maxWindowMs},
	} {
		st.Window = max(st.Window, 1)
		if got, err := decodeBucket(appendBucket(nil, st)); err != nil || got != st {
			t.Errorf("bucket %+v: %+v, %v", st, got, err)
		}
	}
	for _, st := range []algo.CounterState{
		{Window: 1}, {K: -1 << 63, Curr: throttler.MaxLimit, Prev: throttler.MaxLimit, Window: maxWindowMs},
	} {
		if got, err := decodeCounter(appendCounter(nil, st)); err != nil || got != st {
			t.Errorf("counter %+v: %+v, %v", st, got, err)
		}
	}
	for _, log := range [][]algo.LogEntry{
		nil,
		{{At: -5, Units: 3}},
		{{At: -5, Units: throttler.MaxLogLimit}, {At: 1 << 62, Units: 1}, {At: 1<<63 - 1, Units: 2}},
	} {
		got, err := decodeLog(appendLog(nil, log))
		if err != nil || len(got) != len(log) || (len(log) > 0 && !slicesEqual(got, log)) {
			t.Errorf("log %v: %v, %v", log, got, err)
		}
	}
	v := binaryLog(throttler.MaxLogLimit, 1)
	if len(v) > 3*throttler.MaxLogLimit {
		t.Errorf("a log of %d entries 1 ms apart takes %d bytes", throttler.MaxLogLimit, len(v))
	}
}

const maxWindowMs = int64(maxWindow)

func slicesEqual(a, b []algo.LogEntry) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// FuzzDecodeState: no value makes a decoder panic, and what decodes
// encodes to a value that decodes to the same state.
func FuzzDecodeState(f *testing.F) {
	f.Add(appendBucket(nil, algo.TokenBucketState{Tokens: 5, At: 1925089445000, Window: 1000}))
	f.Add(appendCounter(nil, algo.CounterState{K: 1925089445, Curr: 3, Prev: 9, Window: 1000}))
	f.Add(appendLog(nil, []algo.LogEntry{{At: 1925089445000, Units: 2}, {At: 1925089445007, Units: 1}}))
	f.Add([]byte("1925089445000"))
	f.Add([]byte{0xD1, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, v []byte) {
		if st, err := decodeBucket(v); err == nil {
			if again, err := decodeBucket(appendBucket(nil, st)); err != nil || again != st {
				t.Fatalf("bucket %+v: %+v, %v", st, again, err)
			}
		}
		if st, err := decodeCounter(v); err == nil {
			if again, err := decodeCounter(appendCounter(nil, st)); err != nil || again != st {
				t.Fatalf("counter %+v: %+v, %v", st, again, err)
			}
		}
		if log, err := decodeLog(v); err == nil {
			for i := 1; i < len(log); i++ {
				if log[i].At <= log[i-1].At || log[i].Units < 1 {
					t.Fatalf("log not increasing: %v", log)
				}
			}
			if again, err := decodeLog(appendLog(nil, log)); err != nil || !slicesEqual(again, log) {
				t.Fatalf("log %v: %v, %v", log, again, err)
			}
		}
	})
}
