package benchmarks

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/throttler"
)

// The algorithm benchmarks on Redis all pair their variants in one loop (1
// goroutine: one call of each per iteration, timed apart) or in rounds (64
// goroutines: each variant runs for redisBurst in turn), so that all see
// the same machine: on a shared 2-core machine separate runs move by 2x.

// redisAlgClient is a client with a pool of n connections on addr, the
// floor script loaded.
func redisAlgClient(b *testing.B, addr string, n int) *goredis.Client {
	b.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: n})
	b.Cleanup(func() { _ = c.Close() })
	if err := redisFloorScript.Load(context.Background(), c).Err(); err != nil {
		b.Fatal(err)
	}
	return c
}

// fillLog takes one unit per ms from start on, n times, so that a sliding
// log of n per n ms holds n live entries at start + n ms, when the
// benchmark's clock starts.
func fillLog(b *testing.B, be throttler.Backend, key string, p throttler.Policy, start time.Time, n int) {
	b.Helper()
	for i := range n {
		if d, err := be.Take(context.Background(), key, p, 1, start.Add(time.Duration(i)*time.Millisecond)); err != nil || !d.Allowed {
			b.Fatalf("fill %d: %+v, %v", i, d, err)
		}
	}
}

// redisAlgorithmTakes are the policies of the Redis algorithm benchmarks:
// every Take admitted, the logs filled with fill live entries (one per
// ms) before the clock starts.
var redisAlgorithmTakes = []struct {
	name string
	p    throttler.Policy
	fill int
}{
	{"fixed-window", throttler.PerSecond(1 << 40).Named("bench"), 0},
	{"token-bucket", throttler.PerSecond(1 << 40).WithAlgorithm(throttler.TokenBucket).Named("bench"), 0},
	{"sliding-window", throttler.PerSecond(1 << 40).WithAlgorithm(throttler.SlidingWindow).Named("bench"), 0},
	{"sliding-log-100", throttler.Policy{Name: "bench100", Limit: 100, Window: 100 * time.Millisecond, Algorithm: throttler.SlidingLog}, 100},
	{"sliding-log-10000", throttler.Policy{Name: "bench10k", Limit: throttler.MaxLogLimit, Window: 10 * time.Second, Algorithm: throttler.SlidingLog}, throttler.MaxLogLimit},
}

// BenchmarkRedisAlgorithmsTakePaired measures, on 1 goroutine, the latency
// of each algorithm's Take against the one-round-trip floor (a bare
// EVALSHA of INCRBY+PEXPIREAT), in one loop, one call of each per
// iteration. The clock moves 1 ms per iteration and every call is
// admitted: the sliding logs, filled before the clock starts, hold 100 and
// 10,000 (the bound) live entries throughout, one of which ends per call.
// The algorithms take turns at coming first after the floor. It reports
// each one's mean (ns/call), its ratio to the floor, and the sliding-window
// counter's to the fixed window.
func BenchmarkRedisAlgorithmsTakePaired(b *testing.B) {
	addr := redisServe(b)
	ctx := context.Background()
	c := redisAlgClient(b, addr, 1)
	be, err := redis.NewSharded([]redis.Shard{{Primary: c}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	limits := redisAlgorithmTakes
	start := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	key := strconv.FormatInt(time.Now().UnixNano(), 36)
	for _, l := range limits {
		if l.fill > 0 {
			// Filled to end just as the clock starts: the first
			// call drops one entry and logs one.
			fillLog(b, be, key, l.p, start.Add(-time.Duration(l.fill)*time.Millisecond), l.fill)
		}
	}
	reset := strconv.FormatInt(start.Add(time.Hour).UnixMilli(), 10)
	floor := time.Duration(0)
	took := make([]time.Duration, len(limits))
	n := 0
	for b.Loop() {
		now := start.Add(time.Duration(n) * time.Millisecond)
		n++
		t0 := time.Now()
		if err := redisFloorScript.EvalSha(ctx, c, []string{"floor:" + key}, 1, reset).Err(); err != nil {
			b.Fatal(err)
		}
		floor += time.Since(t0)
		for k := range limits {
			i := (k + n) % len(limits) // each in every position in turn
			l := limits[i]
			t0 := time.Now()
			d, err := be.Take(ctx, key, l.p, 1, now)
			took[i] += time.Since(t0)
			if err != nil || !d.Allowed {
				b.Fatalf("%s: %+v, %v", l.name, d, err)
			}
		}
	}
	b.ReportMetric(float64(floor.Nanoseconds())/float64(n), "floor-ns/call")
	for i, l := range limits {
		b.ReportMetric(float64(took[i].Nanoseconds())/float64(n), l.name+"-ns/call")
		b.ReportMetric(float64(took[i])/float64(floor), l.name+"/floor")
	}
	b.ReportMetric(float64(took[2])/float64(took[0]), "sliding-window/fixed-window")
}

// sortedSetLogScript is a sliding log written the way the Circles post
// and most sorted-set limiters write one: drop what ended, count, log the
// request under a member of its own, set the expiry. Only admitted
// requests are logged. It counts requests, not units.
//
// KEYS[1] the sorted set; ARGV: now − window (ended at or before), now,
// limit, the request's member, expiry in ms.
var sortedSetLogScript = goredis.NewScript(`redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local n = redis.call('ZCARD', KEYS[1])
if n >= tonumber(ARGV[3]) then
  return {0, n}
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {1, n + 1}`)

// logBoundScript is a bound, not a limiter: the least a script on this
// layout (one member per unit) can do to answer an admitted Take as the
// contract asks. It counts the live units without dropping first (a
// denied Take stores nothing: ZCARD, less a ZCOUNT of the ended ones when
// the Take does not fit whole), learns whether a unit lies ahead of now
// (ResetAt is the newest unit's end), then drops the ended units and logs
// the Take. It sets no expiry, numbers no units (the client names the
// member) and answers nothing else, so the sliding log can only be
// slower. If this bound is no faster than sortedSetLogScript, no exact
// sliding log on a sorted set is.
//
// KEYS[1] the sorted set; ARGV: now, window, limit, cost, now − window,
// the unit's member.
var logBoundScript = goredis.NewScript(`local t, w = tonumber(ARGV[1]), tonumber(ARGV[2])
local limit, cost = tonumber(ARGV[3]), tonumber(ARGV[4])
local card = redis.call('ZCARD', KEYS[1])
local used, ended = card, nil
if card + cost > limit then
  ended = redis.call('ZCOUNT', KEYS[1], '-inf', ARGV[5])
  used = card - ended
end
local ahead = redis.call('ZCOUNT', KEYS[1], '(' .. ARGV[1], '+inf')
if used + cost > limit then
  return struct.pack('<dddd', 0, used, t + w, 1)
end
if ended == nil then
  used = used - redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[5])
elseif ended > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[5])
end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[6])
return struct.pack('<dddd', 1, used + cost, t + w, ahead)`)

// takeBound runs logBoundScript at now (every call admitted here).
func (s *sortedSetLog) takeBound(ctx context.Context, key string, now time.Time) error {
	s.seq++
	ms := now.UnixMilli()
	res, err := logBoundScript.Run(ctx, s.c, []string{key}, ms, s.window.Milliseconds(), s.limit, 1,
		ms-s.window.Milliseconds(), strconv.FormatInt(ms, 10)+"-"+strconv.FormatInt(s.seq, 10)).Text()
	if err == nil && (len(res) != 32 || math.Float64frombits(binary.LittleEndian.Uint64([]byte(res[:8]))) != 1) {
		err = fmt.Errorf("bound: denied or odd reply %x", res)
	}
	return err
}

// sortedSetLog runs sortedSetLogScript at now for a log of limit per window.
type sortedSetLog struct {
	c      goredis.Scripter
	limit  int64
	window time.Duration
	seq    int64
}

func (s *sortedSetLog) take(ctx context.Context, key string, now time.Time) (bool, error) {
	s.seq++
	ms := now.UnixMilli()
	res, err := sortedSetLogScript.Run(ctx, s.c, []string{key},
		ms-s.window.Milliseconds(), ms, s.limit, strconv.FormatInt(ms, 10)+"-"+strconv.FormatInt(s.seq, 10),
		s.window.Milliseconds()+1000).Int64Slice()
	if err != nil {
		return false, err
	}
	return res[0] == 1, nil
}

// takeMulti is the same as take in one MULTI/EXEC, as the post sends it:
// a transaction cannot branch, so the request is logged before the count
// (and a denied one removed after, not needed here: every call is
// admitted).
func (s *sortedSetLog) takeMulti(ctx context.Context, c *goredis.Client, key string, now time.Time) (bool, error) {
	s.seq++
	ms := now.UnixMilli()
	var card *goredis.IntCmd
	_, err := c.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		p.ZRemRangeByScore(ctx, key, "-inf", strconv.FormatInt(ms-s.window.Milliseconds(), 10))
		card = p.ZCard(ctx, key)
		p.ZAdd(ctx, key, goredis.Z{Score: float64(ms), Member: strconv.FormatInt(ms, 10) + "-" + strconv.FormatInt(s.seq, 10)})
		p.PExpire(ctx, key, s.window+time.Second)
		return nil
	})
	if err != nil {
		return false, err
	}
	return card.Val() < s.limit, nil
}

// BenchmarkRedisSlidingLogVsSortedSet compares the sliding log's Take with
// the usual sorted-set log (sortedSetLogScript, as a script and as a
// MULTI), the bound of any exact log on this layout (logBoundScript) and
// the floor, on 1 goroutine, in one loop; after the floor, the four take
// turns at coming first. Logs of N per N ms,
// filled with N live entries before the clock starts, which moves 1 ms per
// iteration: every call is admitted, drops one entry and logs one.
func BenchmarkRedisSlidingLogVsSortedSet(b *testing.B) {
	for _, entries := range []int{100, throttler.MaxLogLimit} {
		b.Run(fmt.Sprintf("entries=%d", entries), func(b *testing.B) {
			addr := redisServe(b)
			ctx := context.Background()
			c := redisAlgClient(b, addr, 1)
			be, err := redis.NewSharded([]redis.Shard{{Primary: c}}, nil)
			if err != nil {
				b.Fatal(err)
			}
			for _, s := range []*goredis.Script{sortedSetLogScript, logBoundScript} {
				if err := s.Load(ctx, c).Err(); err != nil {
					b.Fatal(err)
				}
			}
			w := time.Duration(entries) * time.Millisecond
			p := throttler.Policy{Name: "bench", Limit: int64(entries), Window: w, Algorithm: throttler.SlidingLog}
			ss := &sortedSetLog{c: c, limit: int64(entries), window: w}
			start := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
			run := strconv.FormatInt(time.Now().UnixNano(), 36)
			ours, script, multi, bound := "ours:"+run, "zset:"+run, "multi:"+run, "bound:"+run
			fillLog(b, be, ours, p, start.Add(-w), entries)
			for i := range entries {
				at := start.Add(-w + time.Duration(i)*time.Millisecond)
				if ok, err := ss.take(ctx, script, at); err != nil || !ok {
					b.Fatal(ok, err)
				}
				if ok, err := ss.takeMulti(ctx, c, multi, at); err != nil || !ok {
					b.Fatal(ok, err)
				}
				if err := ss.takeBound(ctx, bound, at); err != nil {
					b.Fatal(err)
				}
			}
			reset := strconv.FormatInt(start.Add(time.Hour).UnixMilli(), 10)
			var floor, take, zs, zm, zb time.Duration
			n := 0
			for b.Loop() {
				now := start.Add(time.Duration(n) * time.Millisecond)
				n++
				t0 := time.Now()
				if err := redisFloorScript.EvalSha(ctx, c, []string{"floor:" + run}, 1, reset).Err(); err != nil {
					b.Fatal(err)
				}
				floor += time.Since(t0)
				// The three take turns at coming first after the floor
				// (as in TakePaired): a call's place moves its time.
				for k := range 4 {
					t1 := time.Now()
					switch (k + n) % 4 {
					case 0:
						if d, err := be.Take(ctx, ours, p, 1, now); err != nil || !d.Allowed {
							b.Fatal(d, err)
						}
						take += time.Since(t1)
					case 1:
						if ok, err := ss.take(ctx, script, now); err != nil || !ok {
							b.Fatal(ok, err)
						}
						zs += time.Since(t1)
					case 2:
						if ok, err := ss.takeMulti(ctx, c, multi, now); err != nil || !ok {
							b.Fatal(ok, err)
						}
						zm += time.Since(t1)
					case 3:
						if err := ss.takeBound(ctx, bound, now); err != nil {
							b.Fatal(err)
						}
						zb += time.Since(t1)
					}
				}
			}
			nf := float64(n)
			b.ReportMetric(float64(floor.Nanoseconds())/nf, "floor-ns/call")
			b.ReportMetric(float64(take.Nanoseconds())/nf, "take-ns/call")
			b.ReportMetric(float64(zs.Nanoseconds())/nf, "zset-script-ns/call")
			b.ReportMetric(float64(zm.Nanoseconds())/nf, "zset-multi-ns/call")
			b.ReportMetric(float64(take)/float64(floor), "take/floor")
			b.ReportMetric(float64(take)/float64(zs), "take/zset-script")
			b.ReportMetric(float64(take)/float64(zm), "take/zset-multi")
			b.ReportMetric(float64(zb.Nanoseconds())/nf, "bound-ns/call")
			b.ReportMetric(float64(take)/float64(zb), "take/bound")
			b.ReportMetric(float64(zb)/float64(zs), "bound/zset-script")
		})
	}
}

// redisBucketKeys are the keys of the "10k-keys" shape, made once.
var redisBucketKeys = sync.OnceValue(func() []string {
	k := make([]string, 10_000)
	for i := range k {
		k[i] = "client-" + strconv.Itoa(i)
	}
	return k
})

// BenchmarkRedisTokenBucketVsRedisRate compares the token bucket's Take
// with redis_rate/v10's Allow (GCRA, one script), on one hot key and over
// 10,000 keys (taken at a stride, so that consecutive calls hit different
// keys, each holding state from a first pass before the timing), every
// call admitted, on a plain client. With 1 goroutine the floor, Take and
// Allow alternate in one loop, timed apart; with 64, each runs for
// redisBurst in turn, round after round (run it with -benchtime=Nx: N
// rounds), and calls/s are counted.
func BenchmarkRedisTokenBucketVsRedisRate(b *testing.B) {
	addr := redisServe(b)
	ctx := context.Background()
	p := throttler.PerSecond(1 << 40).WithAlgorithm(throttler.TokenBucket).Named("bench")
	rateLimit := redis_rate.Limit{Rate: 1 << 30, Burst: 1 << 30, Period: time.Second}
	keys := redisBucketKeys()
	const stride = 7919 // prime, coprime with len(keys)
	for _, shape := range []string{"hot-key", "10k-keys"} {
		keyOf := func(prefix string, i int) string {
			if shape == "hot-key" {
				return prefix
			}
			return prefix + keys[(i*stride)%len(keys)]
		}
		b.Run(shape+"/goroutines=1", func(b *testing.B) {
			c := redisAlgClient(b, addr, 1)
			be := redisBackend(b, c, nil)
			l := redis_rate.NewLimiter(c)
			run := strconv.FormatInt(time.Now().UnixNano(), 36)
			reset := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
			if shape != "hot-key" {
				warm(b, func(i int) error {
					if err := redisFloorScript.EvalSha(ctx, c, []string{keyOf("floor:"+run+":", i)}, 1, reset).Err(); err != nil {
						return err
					}
					if _, err := be.Take(ctx, keyOf("tb:"+run+":", i), p, 1, time.Now()); err != nil {
						return err
					}
					_, err := l.Allow(ctx, keyOf("rate:"+run+":", i), rateLimit)
					return err
				})
			}
			var floor, take, rate time.Duration
			i := 0
			for b.Loop() {
				i++
				t0 := time.Now()
				if err := redisFloorScript.EvalSha(ctx, c, []string{keyOf("floor:"+run+":", i)}, 1, reset).Err(); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				// Take and Allow take turns at coming first after the
				// floor: the call after the floor runs faster or slower
				// than the next on this machine, whichever it is.
				for k := range 2 {
					ts := time.Now()
					if (k+i)%2 == 0 {
						if d, err := be.Take(ctx, keyOf("tb:"+run+":", i), p, 1, ts); err != nil || !d.Allowed {
							b.Fatal(d, err)
						}
						take += time.Since(ts)
					} else {
						if res, err := l.Allow(ctx, keyOf("rate:"+run+":", i), rateLimit); err != nil || res.Allowed == 0 {
							b.Fatal(res, err)
						}
						rate += time.Since(ts)
					}
				}
				floor += t1.Sub(t0)
			}
			n := float64(i)
			b.ReportMetric(float64(floor.Nanoseconds())/n, "floor-ns/call")
			b.ReportMetric(float64(take.Nanoseconds())/n, "take-ns/call")
			b.ReportMetric(float64(rate.Nanoseconds())/n, "redis_rate-ns/call")
			b.ReportMetric(float64(take)/float64(floor), "take/floor")
			b.ReportMetric(float64(take)/float64(rate), "take/redis_rate")
		})
		b.Run(shape+"/goroutines=64", func(b *testing.B) {
			const goroutines = 64
			c := redisAlgClient(b, addr, goroutines)
			be := redisBackend(b, c, nil)
			l := redis_rate.NewLimiter(c)
			run := strconv.FormatInt(time.Now().UnixNano(), 36)
			variants := []struct {
				name string
				f    func(key string) error
			}{
				{"take", func(key string) error {
					d, err := be.Take(ctx, key, p, 1, time.Now())
					if err == nil && !d.Allowed {
						err = fmt.Errorf("denied: %+v", d)
					}
					return err
				}},
				{"redis_rate", func(key string) error {
					res, err := l.Allow(ctx, key, rateLimit)
					if err == nil && res.Allowed == 0 {
						err = fmt.Errorf("denied: %+v", res)
					}
					return err
				}},
			}
			if shape != "hot-key" {
				warm(b, func(i int) error {
					for _, v := range variants {
						if err := v.f(keyOf(v.name+":"+run+":", i)); err != nil {
							return err
						}
					}
					return nil
				})
			}
			calls := make([]int64, len(variants))
			var elapsed time.Duration
			for b.Loop() {
				for vi, v := range variants {
					prefix := v.name + ":" + run + ":"
					calls[vi] += burst(b, goroutines, redisBurst, func(g, i int) error {
						return v.f(keyOf(prefix, g+i*goroutines))
					})
				}
				elapsed += redisBurst
			}
			take, rate := float64(calls[0])/elapsed.Seconds(), float64(calls[1])/elapsed.Seconds()
			b.ReportMetric(take, "take-calls/s")
			b.ReportMetric(rate, "redis_rate-calls/s")
			b.ReportMetric(take/rate, "take/redis_rate")
		})
	}
}

// warm calls f for every index of redisBucketKeys, from 64 goroutines, so
// that the keys hold state before the timing starts.
func warm(b *testing.B, f func(i int) error) {
	b.Helper()
	n := len(redisBucketKeys())
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				if err := f(i); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// serverTimeRig starts what the server-time benchmarks compare on one
// server: our backend, redis_rate (a rate that never denies) and the
// sorted-set log of BenchmarkRedisSlidingLogVsSortedSet, filled with 100
// live entries before start.
func serverTimeRig(b *testing.B) (*goredis.Client, *redis.Backend, *redis_rate.Limiter, redis_rate.Limit, time.Time, *sortedSetLog) {
	ctx := context.Background()
	c := redisAlgClient(b, redisServe(b), 1)
	be := redisBackend(b, c, nil)
	if err := sortedSetLogScript.Load(ctx, c).Err(); err != nil {
		b.Fatal(err)
	}
	start := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	ss := &sortedSetLog{c: c, limit: 100, window: 100 * time.Millisecond}
	for i := range 100 {
		if ok, err := ss.take(ctx, "zset", start.Add(time.Duration(i-100)*time.Millisecond)); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
	return c, be, redis_rate.NewLimiter(c), redis_rate.Limit{Rate: 1 << 30, Burst: 1 << 30, Period: time.Second}, start, ss
}

// BenchmarkRedisAlgorithmsServerTime reports the server's own time per
// call of each script, from SLOWLOG with every command logged (so it
// includes the slow log's own cost, alike for all): the floor, each
// algorithm's Take (logs of 100 and 10,000 live entries as in
// BenchmarkRedisAlgorithmsTakePaired), the sorted-set log of
// BenchmarkRedisSlidingLogVsSortedSet (100 entries) and redis_rate's Allow,
// interleaved one call of each per iteration on one server. The figure is
// the mean of the fastest 90% of each one's calls, in µs: on a shared
// machine the slowest tenth is other processes' time.
func BenchmarkRedisAlgorithmsServerTime(b *testing.B) {
	ctx := context.Background()
	c, be, l, rateLimit, start, ss := serverTimeRig(b)
	policies := redisAlgorithmTakes
	for _, p := range policies {
		if p.fill > 0 {
			fillLog(b, be, p.name, p.p, start.Add(-time.Duration(p.fill)*time.Millisecond), p.fill)
		}
	}
	reset := strconv.FormatInt(start.Add(time.Hour).UnixMilli(), 10)
	slowLogAll(b, ctx, c)
	n := 0
	for b.Loop() {
		now := start.Add(time.Duration(n) * time.Millisecond)
		n++
		if err := redisFloorScript.EvalSha(ctx, c, []string{"floor"}, 1, reset).Err(); err != nil {
			b.Fatal(err)
		}
		for _, p := range policies {
			if d, err := be.Take(ctx, p.name, p.p, 1, now); err != nil || !d.Allowed {
				b.Fatal(p.name, d, err)
			}
		}
		if ok, err := ss.take(ctx, "zset", now); err != nil || !ok {
			b.Fatal(ok, err)
		}
		if res, err := l.Allow(ctx, "redis_rate", rateLimit); err != nil || res.Allowed == 0 {
			b.Fatal(res, err)
		}
	}
	b.StopTimer()
	// Each script's calls, by the key they name (the storage keys end in
	// the policy's name and key).
	names := []string{"floor", "zset", "redis_rate"}
	for _, p := range policies {
		names = append(names, p.name)
	}
	reportScriptServerTime(b, ctx, c, names, func(args []string) string {
		for _, name := range names {
			if strings.HasSuffix(args[3], name) {
				return name
			}
		}
		return ""
	})
}

// BenchmarkRedisAlgorithmsCommandStats reports the server's own time per
// call as BenchmarkRedisAlgorithmsServerTime does, but from INFO
// commandstats with the slow log off: the slow log also logs every command
// a script runs, which adds its own cost per command and so favours the
// scripts of fewer commands. Each variant runs in blocks of
// commandStatsBlock calls, one block of each in turn (every iteration is
// one round of blocks), and its time is the growth of EVALSHA's usec over
// its blocks; the clock moves 1 ms per call of each variant.
func BenchmarkRedisAlgorithmsCommandStats(b *testing.B) {
	ctx := context.Background()
	c, be, l, rateLimit, start, ss := serverTimeRig(b)
	reset := strconv.FormatInt(start.Add(time.Hour).UnixMilli(), 10)
	type variant struct {
		name string
		call func(now time.Time) error
	}
	variants := []variant{
		{"floor", func(time.Time) error {
			return redisFloorScript.EvalSha(ctx, c, []string{"floor"}, 1, reset).Err()
		}},
		{"zset", func(now time.Time) error {
			ok, err := ss.take(ctx, "zset", now)
			if err == nil && !ok {
				err = fmt.Errorf("zset: denied")
			}
			return err
		}},
		{"redis_rate", func(time.Time) error {
			res, err := l.Allow(ctx, "redis_rate", rateLimit)
			if err == nil && res.Allowed == 0 {
				err = fmt.Errorf("redis_rate: denied %+v", res)
			}
			return err
		}},
	}
	for _, p := range redisAlgorithmTakes {
		if p.fill > 0 {
			fillLog(b, be, p.name, p.p, start.Add(-time.Duration(p.fill)*time.Millisecond), p.fill)
		}
		variants = append(variants, variant{p.name, func(now time.Time) error {
			d, err := be.Take(ctx, p.name, p.p, 1, now)
			if err == nil && !d.Allowed {
				err = fmt.Errorf("%s: denied %+v", p.name, d)
			}
			return err
		}})
	}
	usec := func() float64 {
		s, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			b.Fatal(err)
		}
		i := strings.Index(s, "cmdstat_evalsha:")
		if i < 0 {
			return 0
		}
		s = s[i:]
		i = strings.Index(s, "usec=")
		j := strings.IndexByte(s[i:], ',')
		v, err := strconv.ParseFloat(s[i+len("usec="):i+j], 64)
		if err != nil {
			b.Fatal(err)
		}
		return v
	}
	us := make([]float64, len(variants))
	n := 0
	for b.Loop() {
		for i, v := range variants {
			u0 := usec()
			for k := range commandStatsBlock {
				if err := v.call(start.Add(time.Duration(n+k) * time.Millisecond)); err != nil {
					b.Fatal(err)
				}
			}
			us[i] += usec() - u0
		}
		n += commandStatsBlock
	}
	for i, v := range variants {
		b.ReportMetric(us[i]/float64(n), v.name+"-server-us")
	}
	b.ReportMetric(us[4]/us[2], "token-bucket/redis_rate")
	b.ReportMetric(us[6]/us[1], "sliding-log-100/zset")
	b.ReportMetric(us[7]/us[1], "sliding-log-10000/zset")
	b.ReportMetric(us[5]/us[3], "sliding-window/fixed-window")
}

// commandStatsBlock is how many calls of one variant
// BenchmarkRedisAlgorithmsCommandStats makes between two readings of
// commandstats.
const commandStatsBlock = 100

// burst calls f from the given number of goroutines for d and returns how
// many calls returned nil; f gets its goroutine's number and how many
// calls that goroutine made before.
func burst(b *testing.B, goroutines int, d time.Duration, f func(g, i int) error) int64 {
	var n atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range goroutines {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if err := f(g, i); err != nil {
					b.Error(err)
					return
				}
				n.Add(1)
			}
		})
	}
	time.Sleep(d)
	close(stop)
	wg.Wait()
	return n.Load()
}
