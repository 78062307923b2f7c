package redis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/backendtest"
	"github.com/throttlekit/throttlekit/throttler"
)

var leasePolicy = throttler.ConcurrencyPolicy{Name: "jobs", Limit: 3, TTL: time.Minute}

// leaseRefusingReplica is a replica (in fact the primary's server, so
// that the rate Peeks it serves are consistent) that fails the test when a
// lease script reaches it: leases are writes, which a replica never serves.
type leaseRefusingReplica struct {
	Client
	t *testing.T
}

func (r leaseRefusingReplica) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *goredis.Cmd {
	if sha == acquireScript.Hash() || sha == releaseScript.Hash() {
		r.t.Error("a lease call reached a replica")
	}
	return r.Client.EvalSha(ctx, sha, keys, args...)
}

func (r leaseRefusingReplica) Eval(ctx context.Context, src string, keys []string, args ...any) *goredis.Cmd {
	if src == acquireSource || src == releaseSource {
		r.t.Error("a lease call reached a replica")
	}
	return r.Client.Eval(ctx, src, keys, args...)
}

// client is a new client of its own (its own connections) on a local
// server's port, closed with the test.
func client(t *testing.T, port int) *goredis.Client {
	rdb := goredis.NewClient(&goredis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), PoolSize: 32})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// The lease suite against real Redis servers started for the test: one
// server, and two shards each with a replica that must never be called.
// Every backend the suite asks for is on clients of its own, so its
// concurrency case runs over several connection pools, as several
// processes would.
func TestLeaseConformanceLocalRedis(t *testing.T) {
	_, port := startRedis(t)
	backendtest.RunLeases(t, func(t *testing.T) backendtest.LeaseStore {
		b, err := New(client(t, port), &Options{Prefix: "lease:"})
		require.NoError(t, err)
		return b
	})
}

func TestLeaseConformanceSharded(t *testing.T) {
	_, p1 := startRedis(t)
	_, p2 := startRedis(t)
	backendtest.RunLeases(t, func(t *testing.T) backendtest.LeaseStore {
		c1, c2 := client(t, p1), client(t, p2)
		b, err := NewSharded([]Shard{
			{Primary: c1, Replicas: []Client{leaseRefusingReplica{c1, t}}},
			{Primary: c2, Replicas: []Client{leaseRefusingReplica{c2, t}}},
		}, nil)
		require.NoError(t, err)
		return b
	})
}

// The key lives until its latest lease ends plus the margin, set as a
// duration from the caller's now (the suite's instants are years away
// from the server's clock); a release leaves it, and the last one deletes
// the set.
func TestLeaseKeyExpiry(t *testing.T) {
	rdb, _ := startRedis(t)
	b, err := New(rdb, &Options{ExpiryMargin: 2 * time.Second})
	require.NoError(t, err)
	ctx := context.Background()
	p := throttler.ConcurrencyPolicy{Name: "exp", Limit: 5, TTL: 4 * time.Second}
	sk, _ := b.leaseKey(p, "k")
	s, ms := time.Second, time.Millisecond
	for _, step := range []struct {
		acquire bool
		id      throttler.LeaseID
		at      time.Duration // from T0
		want    time.Duration // PTTL after the call; -2: no key
	}{
		{true, 1, 0, 6 * s},
		{true, 2, 1500 * ms, 6 * s},           // latest T0+5.5s
		{true, 3, -2000 * ms, 9500 * ms},      // a clock behind: still T0+5.5s
		{false, 2, 0, 9500 * ms},              // a release sets nothing
		{true, 1, 10 * s, 6 * s},              // every other lease ended
		{false, 1, 10 * s, time.Duration(-2)}, // the last release empties the set: no key
	} {
		now, sent := backendtest.T0.Add(step.at), time.Now()
		if step.acquire {
			_, err = b.Acquire(ctx, "k", p, step.id, now)
		} else {
			_, _, err = b.Release(ctx, "k", p, step.id, now)
		}
		require.NoError(t, err)
		ttl, err := rdb.PTTL(ctx, sk).Result()
		require.NoError(t, err)
		if step.want < 0 {
			assert.Equal(t, step.want, ttl, "at T0%+v", step.at)
			continue
		}
		// The expiry has run down since the call was sent (plus
		// pttlSlack), however loaded the machine.
		assert.True(t, ttl <= step.want && ttl >= step.want-time.Since(sent)-pttlSlack, "at T0%+v: PTTL %v, want %v", step.at, ttl, step.want)
	}
}

// A key that another program wrote with another type is the key's failure,
// never the store's.
func TestLeaseWrongTypeIsTheKeys(t *testing.T) {
	rdb, _ := startRedis(t)
	b, err := New(rdb, nil)
	require.NoError(t, err)
	ctx := context.Background()
	sk, _ := b.leaseKey(leasePolicy, "k")
	require.NoError(t, rdb.Set(ctx, sk, "x", 0).Err())
	_, err = b.Acquire(ctx, "k", leasePolicy, 1, backendtest.T0)
	assert.True(t, errors.Is(err, throttler.ErrKeyState), "%v", err)
	assert.False(t, errors.Is(err, throttler.ErrUnavailable), "%v", err)
	_, _, err = b.Release(ctx, "k", leasePolicy, 1, backendtest.T0)
	assert.True(t, errors.Is(err, throttler.ErrKeyState), "%v", err)
}

// leaseFake answers every script with reply and records what it was sent.
type leaseFake struct {
	goredis.Scripter
	reply any
	err   error
	keys  []string
	args  []any
}

func (f *leaseFake) EvalSha(ctx context.Context, _ string, keys []string, args ...any) *goredis.Cmd {
	f.keys, f.args = keys, args
	cmd := goredis.NewCmd(ctx)
	cmd.SetVal(f.reply)
	cmd.SetErr(f.err)
	return cmd
}

func (f *leaseFake) Eval(ctx context.Context, s string, keys []string, args ...any) *goredis.Cmd {
	return f.EvalSha(ctx, s, keys, args...)
}

func (f *leaseFake) HMGet(ctx context.Context, _ string, _ ...string) *goredis.SliceCmd {
	return goredis.NewSliceCmd(ctx)
}

// The scripts get the caller's now, the ID in decimal (all 64 bits), the
// expiry and the margin as numbers, and the lease key.
func TestLeaseScriptArgs(t *testing.T) {
	f := &leaseFake{}
	b := newBackend(t, f, &Options{ExpiryMargin: 3 * time.Second})
	now := backendtest.T0.Add(700 * time.Microsecond)
	ms := backendtest.T0.UnixMilli()
	id := throttler.LeaseID(1<<64 - 1)
	f.reply = []any{int64(1), int64(1), ms + 60_000}
	d, err := b.Acquire(context.Background(), "k", leasePolicy, id, now)
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprint([]any{ms, "18446744073709551615", ms + 60_000, int64(3), int64(3000)}), fmt.Sprint(f.args))
	sk, _ := b.leaseKey(leasePolicy, "k")
	assert.Equal(t, []string{sk}, f.keys)
	assert.Equal(t, throttler.Decision{Allowed: true, Limit: 3, Used: 1, Remaining: 2, ResetAt: time.UnixMilli(ms + 60_000)}, d)

	f.reply = []any{int64(0), int64(0), int64(0)}
	held, d, err := b.Release(context.Background(), "k", leasePolicy, id, now)
	require.NoError(t, err)
	assert.False(t, held)
	assert.Equal(t, fmt.Sprint([]any{ms, "18446744073709551615"}), fmt.Sprint(f.args))
	assert.Equal(t, throttler.Decision{Allowed: true, Limit: 3, Remaining: 3, ResetAt: time.UnixMilli(ms + 60_000)}, d)
}

// Replies the scripts never give are errors, never a Decision or a panic.
func TestLeaseReplies(t *testing.T) {
	ms := backendtest.T0.UnixMilli()
	for _, tc := range []struct {
		name  string
		reply any
		err   error
		want  error
	}{
		{"not an array", "OK", nil, ErrUnexpectedReply},
		{"nil", nil, goredis.Nil, ErrUnexpectedReply},
		{"two values", []any{int64(1), int64(1)}, nil, ErrUnexpectedReply},
		{"a string", []any{int64(1), "1", ms + 1}, nil, ErrUnexpectedReply},
		{"flag 2", []any{int64(2), int64(1), ms + 1}, nil, ErrUnexpectedReply},
		{"negative used", []any{int64(0), int64(-1), int64(0)}, nil, ErrUnexpectedReply},
		{"held but no expiry after now", []any{int64(1), int64(1), ms}, nil, ErrUnexpectedReply},
		{"none held but an expiry", []any{int64(0), int64(0), ms + 5}, nil, ErrUnexpectedReply},
		{"a store failure", nil, io.EOF, throttler.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &leaseFake{reply: tc.reply, err: tc.err}
			b := newBackend(t, f, nil)
			_, err := b.Acquire(context.Background(), "k", leasePolicy, 1, backendtest.T0)
			assert.True(t, errors.Is(err, tc.want), "Acquire: %v", err)
			assert.True(t, strings.HasPrefix(fmt.Sprint(err), "redis: acquire "), "%v", err)
			_, _, err = b.Release(context.Background(), "k", leasePolicy, 1, backendtest.T0)
			assert.True(t, errors.Is(err, tc.want), "Release: %v", err)
		})
	}
	// An admitted Acquire that holds nothing is a broken script.
	f := &leaseFake{reply: []any{int64(1), int64(0), int64(0)}}
	_, err := newBackend(t, f, nil).Acquire(context.Background(), "k", leasePolicy, 1, backendtest.T0)
	assert.True(t, errors.Is(err, ErrUnexpectedReply), "%v", err)
}

// Bad input is refused before any call; so is an instant whose expiry a
// double score cannot hold exactly.
func TestLeaseBadInput(t *testing.T) {
	f := &leaseFake{}
	b := newBackend(t, f, nil)
	ctx := context.Background()
	for _, tc := range []struct {
		key  string
		p    throttler.ConcurrencyPolicy
		id   throttler.LeaseID
		now  time.Time
		want error
	}{
		{"", leasePolicy, 1, backendtest.T0, throttler.ErrInvalidKey},
		{"k", throttler.Concurrent(0, time.Second), 1, backendtest.T0, throttler.ErrInvalidPolicy},
		{"k", leasePolicy, 0, backendtest.T0, throttler.ErrInvalidLease},
		{"k", leasePolicy, 1, time.UnixMilli(1<<53 - 1000), throttler.ErrInvalidPolicy},
		{"k", leasePolicy, 1, time.UnixMilli(-1 << 53), throttler.ErrInvalidPolicy},
	} {
		_, err := b.Acquire(ctx, tc.key, tc.p, tc.id, tc.now)
		assert.True(t, errors.Is(err, tc.want), "Acquire: %v", err)
		_, _, err = b.Release(ctx, tc.key, tc.p, tc.id, tc.now)
		assert.True(t, errors.Is(err, tc.want), "Release: %v", err)
	}
	assert.Nil(t, f.args, "nothing was sent")
}

// A lease key is in the algorithms' layout under the lease identity: '+'
// after a tag that hashes the rest, so one slot and one shard, and never a
// rate policy's key of the same name. LeaseStore names its shard.
func TestLeaseKeys(t *testing.T) {
	shards := make([]Shard, 4)
	fakes := make([]*leaseFake, 4)
	for i := range shards {
		fakes[i] = &leaseFake{reply: []any{int64(1), int64(1), backendtest.T0.UnixMilli() + 60_000}}
		shards[i] = Shard{Primary: fakes[i]}
	}
	b, err := NewSharded(shards, &Options{Prefix: "p:"})
	require.NoError(t, err)
	sk, h := b.leaseKey(leasePolicy, "k{x}")
	assert.Equal(t, fmt.Sprintf("p:{%016x}+7:jobs cc:k{x}", h), sk, "the tag is the key's hash")
	for a := throttler.FixedWindow; a <= throttler.SlidingWindow; a++ {
		rp := throttler.Policy{Name: "jobs", Limit: 3, Window: time.Minute, Algorithm: a}
		rk, _ := b.algorithmKey(rp, "k{x}")
		plain, _ := b.storageKey(rp, "k{x}")
		assert.NotEqual(t, sk, rk)
		assert.NotEqual(t, sk, plain)
	}
	unnamed, _ := b.leaseKey(throttler.Concurrent(3, time.Minute), "k")
	assert.Contains(t, unnamed, "}+11: cc 3/60000:k")
	for i := range 100 {
		key := fmt.Sprint("user-", i)
		_, h := b.leaseKey(leasePolicy, key)
		want := jumpHash(h, 4)
		assert.Equal(t, b.shards[want].name, b.leaseStore(key, leasePolicy))
		for _, f := range fakes {
			f.args = nil
		}
		_, err := b.Acquire(context.Background(), key, leasePolicy, 1, backendtest.T0)
		require.NoError(t, err)
		for j, f := range fakes {
			assert.Equal(t, j == want, f.args != nil, "%s: shard %d called", key, j)
		}
	}
}
