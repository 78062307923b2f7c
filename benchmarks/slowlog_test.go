package benchmarks

import (
	"context"
	"slices"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"
)

// slowLogAll makes the server log every command in its slow log, emptied,
// so that a benchmark can read back the server's own time per call.
func slowLogAll(b *testing.B, ctx context.Context, c *goredis.Client) {
	b.Helper()
	for _, kv := range [][2]string{{"slowlog-log-slower-than", "0"}, {"slowlog-max-len", "1000000"}} {
		if err := c.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			b.Fatal(err)
		}
	}
	if err := c.SlowLogReset(ctx).Err(); err != nil {
		b.Fatal(err)
	}
}

// reportScriptServerTime reads the slow log and reports, for each of
// names, the mean server time of the fastest 90% of its script calls, in
// µs, as "<name>-server-us": on a shared machine the slowest tenth is other
// processes' time. name gives a script call's name from its arguments
// (EVALSHA or EVAL, the script, the key count, then keys and values), or
// "" to leave it out. Every name must have calls.
func reportScriptServerTime(b *testing.B, ctx context.Context, c *goredis.Client, names []string, name func(args []string) string) {
	b.Helper()
	logs, err := c.SlowLogGet(ctx, -1).Result()
	if err != nil {
		b.Fatal(err)
	}
	us := map[string][]float64{}
	for _, e := range logs {
		if len(e.Args) < 4 || !strings.EqualFold(e.Args[0], "evalsha") && !strings.EqualFold(e.Args[0], "eval") {
			continue
		}
		if n := name(e.Args); n != "" {
			us[n] = append(us[n], float64(e.Duration.Nanoseconds())/1e3)
		}
	}
	for _, n := range names {
		v := us[n]
		if len(v) == 0 {
			b.Fatalf("%s: no calls in the slow log", n)
		}
		slices.Sort(v)
		v = v[:max(1, len(v)*9/10)]
		sum := 0.0
		for _, x := range v {
			sum += x
		}
		b.ReportMetric(sum/float64(len(v)), n+"-server-us")
	}
}
