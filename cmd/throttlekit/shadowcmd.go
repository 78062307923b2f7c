package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/throttlekit/throttlekit/shadow"
	"github.com/throttlekit/throttlekit/throttler"
)

// defaultKeyPrefix starts every synthetic key, with the run's id after it,
// so that a comparison never counts against a live client's key.
const defaultKeyPrefix = "throttlekit-cli-shadow:"

// shadowOpts is what the shadow command's options say.
type shadowOpts struct {
	control, candidate string
	policies           policyList
	duration           time.Duration
	keys               int
	rate               float64
	ops                []throttler.Op
	cost               int64
	keyPrefix          string
	given              []string // --key
	keysFile           string
	live               bool
	concurrency        int
	usedTolerance      int64
	resetTolerance     time.Duration
	show               int
	asJSON             bool
	cfg                storeConfig
}

// maxCalls bounds one run's synthetic calls: a comparison, not a load test.
const maxCalls = 1_000_000

// syntheticOnly are the options that shape synthetic traffic, refused in a
// Peek-only comparison of given keys.
var syntheticOnly = []string{"duration", "keys", "ops", "cost", "key-prefix", "concurrency"}

func shadowCommand() *command {
	return &command{name: "shadow", page: shadowPage, flags: func(e *env, fs *flag.FlagSet) func(context.Context, []string) int {
		o := &shadowOpts{}
		fs.StringVar(&o.control, "control", "", "The `store` that serves, as the application's shadow control: memcached, redis or redis-replica (required).")
		fs.StringVar(&o.candidate, "candidate", "", "The `store` compared with the control (required).")
		fs.Var(&o.policies, "policy", "A `policy` to send the calls under (see POLICIES); required. Repeat it to spread the calls over several policies.")
		fs.DurationVar(&o.duration, "duration", 10*time.Second, "How long the synthetic traffic runs.")
		fs.IntVar(&o.keys, "keys", 100, "How many synthetic keys (`n`) the traffic goes round.")
		fs.Float64Var(&o.rate, "rate", 100, "The `calls` per second, over all keys: the pace of the traffic, and of the Peeks of given keys (one at a time). A store slower than --concurrency/rate per call lowers it.")
		fs.Func("ops", "The operations each key goes through in turn, a comma-separated `list` of take, peek and refund. (default take,take,peek,refund)", func(s string) error {
			ops, err := parseOps(s)
			o.ops = ops
			return err
		})
		fs.IntVar(&o.concurrency, "concurrency", 1, "How many synthetic calls (`n`) may be in flight at once, for a rate above what one call at a time reaches; each key's calls stay in order.")
		fs.Int64Var(&o.cost, "cost", 1, "The `units` of each take and refund.")
		fs.StringVar(&o.keyPrefix, "key-prefix", defaultKeyPrefix, "The `prefix` every synthetic key starts with; the run's id and the key's number follow.")
		fs.Func("key", "Compare the live `key` by Peek alone, writing nothing (repeat it for several keys). With --live, send the synthetic traffic to it instead.", func(s string) error {
			if err := validateKey(s); err != nil {
				return err
			}
			o.given = append(o.given, s)
			return nil
		})
		fs.StringVar(&o.keysFile, "keys-file", "", "Compare the live keys listed in `file`, one per line (- for standard input; blank lines and lines starting with # are skipped), as --key does.")
		fs.BoolVar(&o.live, "live", false, "Send the synthetic traffic (takes and refunds) to the keys of --key and --keys-file: it spends those clients' budget. Only when asked.")
		fs.Int64Var(&o.usedTolerance, "used-tolerance", 0, "How many `units` used and remaining may differ by before a pair is a mismatch (shadow.Options.UsedTolerance).")
		fs.DurationVar(&o.resetTolerance, "reset-tolerance", time.Millisecond, "How far reset-at and retry-after may differ before a pair is a mismatch (shadow.Options.ResetAtTolerance).")
		fs.IntVar(&o.show, "show", 10, "How many (`n`) of the latest mismatches to list.")
		fs.BoolVar(&o.asJSON, "json", false, "Print the report as JSON.")
		addStoreFlags(fs, &o.cfg)
		return func(ctx context.Context, args []string) int {
			if len(args) > 0 {
				return e.usage("shadow", "unexpected argument %q", args[0])
			}
			set := map[string]bool{}
			fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
			return e.shadow(ctx, o, set)
		}
	}}
}

func parseOps(s string) ([]throttler.Op, error) {
	var ops []throttler.Op
	for name := range strings.SplitSeq(s, ",") {
		switch strings.TrimSpace(name) {
		case "take":
			ops = append(ops, throttler.OpTake)
		case "peek":
			ops = append(ops, throttler.OpPeek)
		case "refund":
			ops = append(ops, throttler.OpRefund)
		default:
			return nil, fmt.Errorf("operation %q: want take, peek or refund", name)
		}
	}
	return ops, nil
}

func formatOps(ops []throttler.Op) string {
	names := make([]string, len(ops))
	for i, op := range ops {
		names[i] = op.String()
	}
	return strings.Join(names, ",")
}

// check validates the options; the error is the command line's.
func (o *shadowOpts) check(set map[string]bool, readKeys func(string) ([]string, error)) error {
	if o.ops == nil {
		o.ops = []throttler.Op{throttler.OpTake, throttler.OpTake, throttler.OpPeek, throttler.OpRefund}
	}
	switch {
	case o.control == "" || o.candidate == "":
		return errors.New("--control and --candidate are required")
	case o.control == o.candidate:
		return fmt.Errorf("--control and --candidate are both %s; compare two stores", o.control)
	case len(o.policies) == 0:
		return errors.New("--policy is required")
	case o.rate <= 0:
		return fmt.Errorf("--rate is %v; want more than 0", o.rate)
	case o.show < 0:
		return fmt.Errorf("--show is %d; want 0 or more", o.show)
	case o.usedTolerance < 0:
		return fmt.Errorf("--used-tolerance is %d; want 0 or more", o.usedTolerance)
	case o.resetTolerance < 0:
		return fmt.Errorf("--reset-tolerance is %v; want 0 or more", o.resetTolerance)
	}
	if err := o.cfg.check(); err != nil {
		return err
	}
	names := o.cfg.names()
	for _, s := range []struct{ flag, name string }{{"--control", o.control}, {"--candidate", o.candidate}} {
		if !slices.Contains(names, s.name) {
			if len(names) == 0 {
				return fmt.Errorf("%s %s: no store is configured; give --memcached, --redis or --redis-replica", s.flag, s.name)
			}
			return fmt.Errorf("%s %s: not a configured store; configured: %s", s.flag, s.name, strings.Join(names, ", "))
		}
	}
	if o.keysFile != "" {
		keys, err := readKeys(o.keysFile)
		if err != nil {
			return err
		}
		o.given = append(o.given, keys...)
	}
	if o.peekOnly() {
		for _, name := range syntheticOnly {
			if set[name] {
				return fmt.Errorf("--%s shapes synthetic traffic; the keys of --key and --keys-file are compared by Peek alone (add --live to send the traffic to them)", name)
			}
		}
		if len(o.given) == 0 {
			return errors.New("--keys-file lists no key")
		}
		return nil
	}
	if o.live && len(o.given) == 0 {
		return errors.New("--live needs the keys to send the traffic to: --key or --keys-file")
	}
	for _, s := range []string{o.control, o.candidate} {
		if strings.HasPrefix(s, storeRedisReplica) {
			return fmt.Errorf("%s is read only: synthetic traffic takes and refunds; compare a replica by Peek (--key or --keys-file)", s)
		}
	}
	switch {
	case o.duration <= 0:
		return fmt.Errorf("--duration is %v; want more than 0", o.duration)
	case o.keys < 1 && !o.live:
		return fmt.Errorf("--keys is %d; want 1 or more", o.keys)
	case o.cost < 1:
		return fmt.Errorf("--cost is %d; want 1 or more", o.cost)
	case o.concurrency < 1:
		return fmt.Errorf("--concurrency is %d; want 1 or more", o.concurrency)
	case o.keyPrefix == "" && !o.live:
		return errors.New("--key-prefix is empty; synthetic keys need a prefix of their own")
	case o.planned() < 1:
		return fmt.Errorf("--rate %v for --duration %v makes no call", o.rate, o.duration)
	case o.rate*o.duration.Seconds() > maxCalls:
		return fmt.Errorf("--rate %v for --duration %v makes %.0f calls; at most %d in one run", o.rate, o.duration, o.rate*o.duration.Seconds(), maxCalls)
	}
	for _, p := range o.policies {
		if o.cost > p.Capacity() && slices.Contains(o.ops, throttler.OpTake) {
			return fmt.Errorf("--cost %d under %s: more than the policy's capacity of %d, so no take could be admitted", o.cost, formatPolicy(p), p.Capacity())
		}
	}
	return nil
}

// peekOnly: given keys are read, never written, unless --live.
func (o *shadowOpts) peekOnly() bool { return !o.live && (len(o.given) > 0 || o.keysFile != "") }

func (o *shadowOpts) planned() int { return int(o.rate * o.duration.Seconds()) }

// readKeysFile reads one key per line; - is standard input.
func readKeysFile(path string) ([]string, error) {
	var r io.Reader = os.Stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("--keys-file: %w", err)
		}
		defer f.Close()
		r = f
	}
	var keys []string
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, throttler.MaxKeyLen+2)
	for n := 1; sc.Scan(); n++ {
		k := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(k) == "" || strings.HasPrefix(k, "#") {
			continue
		}
		if err := validateKey(k); err != nil {
			return nil, fmt.Errorf("--keys-file %s, line %d: %v", path, n, err)
		}
		keys = append(keys, k)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--keys-file %s: %w", path, err)
	}
	return keys, nil
}

// collector keeps what Stats does not: the errors the shadow saw.
type collector struct {
	mu          sync.Mutex
	errs        []string
	unreachable bool
}

const keepErrors = 5

func (c *collector) publish(r shadow.Result) {
	for _, e := range []struct {
		side string
		err  error
	}{{"control", r.ControlErr}, {"candidate", r.CandidateErr}} {
		if e.err == nil {
			continue
		}
		c.mu.Lock()
		if errors.Is(e.err, throttler.ErrUnavailable) {
			c.unreachable = true
		}
		if len(c.errs) < keepErrors {
			c.errs = append(c.errs, fmt.Sprintf("%s %s %q: %v", e.side, r.Op, r.Key, e.err))
		}
		c.mu.Unlock()
	}
}

// shadowReport is what a comparison found.
type shadowReport struct {
	control, candidate *store
	peekOnly           bool
	keyPrefix          string // synthetic keys: the prefix with the run's id
	keys               int
	policies           []throttler.Policy
	ops                []throttler.Op
	duration           time.Duration
	rate               float64
	planned, made      int
	concurrency        int
	byOp               map[throttler.Op]int
	interrupted        bool
	stats              shadow.Stats
	errs               []string
	unreachable        bool
	flushErr           error
	show               int
}

func (e *env) shadow(ctx context.Context, o *shadowOpts, set map[string]bool) int {
	const cmd = "shadow"
	if err := o.check(set, readKeysFile); err != nil {
		return e.usage(cmd, "%v", err)
	}
	st, err := e.open(o.cfg)
	if err != nil {
		return e.openError(cmd, err)
	}
	defer st.Close()
	if err := checkStores(ctx, st.list, o.cfg.timeout); err != nil {
		return e.fail(cmd, exitFor(err), err)
	}
	control, candidate := st.get(o.control), st.get(o.candidate)
	start := e.now()
	runID := strconv.FormatInt(start.UnixMilli(), 36)
	rep := &shadowReport{
		control: control, candidate: candidate, peekOnly: o.peekOnly(),
		policies: o.policies, ops: o.ops, rate: o.rate, byOp: map[throttler.Op]int{}, show: o.show,
	}
	keys := o.given
	if !o.live && !rep.peekOnly {
		rep.keyPrefix = o.keyPrefix + runID + ":"
		keys = make([]string, o.keys)
		for i := range keys {
			keys[i] = rep.keyPrefix + strconv.Itoa(i)
		}
	}
	rep.keys = len(keys)

	// Both stores answer before any traffic, so that a typo in an address
	// is an unreachable store, not a report full of errors.
	for _, s := range []*store{control, candidate} {
		c, cancel := context.WithTimeout(ctx, o.cfg.timeout)
		_, err := s.b.Peek(c, keys[0], o.policies[0], start)
		cancel()
		if err != nil {
			return e.fail(cmd, exitFor(err), fmt.Errorf("%s (%s): %w", s.name, strings.Join(s.addrs, ","), err))
		}
	}

	var col collector
	sh, err := shadow.New(control.b, candidate.b, &shadow.Options{
		Timeout:          o.cfg.timeout,
		UsedTolerance:    o.usedTolerance,
		ResetAtTolerance: o.resetTolerance,
		KeepMismatches:   max(o.show, 1),
		Publish:          col.publish,
	})
	if err != nil {
		return e.usage(cmd, "%v", err)
	}
	interval := time.Duration(float64(time.Second) / o.rate)
	// A call runs to its own timeout even after an interrupt, so that the
	// calls already handed to a worker are answered, not failed.
	callCtx := context.WithoutCancel(ctx)
	var mu sync.Mutex // rep.made and rep.byOp, counted by the workers
	// A Refund names the latest admitted Take of its key and policy by
	// that Take's ResetAt, as a Throttler does; before any, its own
	// instant, which names no Take (nothing is refunded).
	type pair struct {
		key string
		p   throttler.Policy
	}
	receipts := map[pair]time.Time{}
	call := func(j job) {
		c, cancel := context.WithTimeout(callCtx, o.cfg.timeout)
		defer cancel()
		id := pair{j.key, j.p}
		switch j.op {
		case throttler.OpTake:
			if d, err := sh.Take(c, j.key, j.p, o.cost, j.at); err == nil && d.Allowed {
				mu.Lock()
				receipts[id] = d.ResetAt
				mu.Unlock()
			}
		case throttler.OpPeek:
			sh.Peek(c, j.key, j.p, j.at)
		case throttler.OpRefund:
			mu.Lock()
			receipt, ok := receipts[id]
			mu.Unlock()
			if !ok {
				receipt = j.at
			}
			sh.Refund(c, j.key, j.p, o.cost, receipt, j.at)
		}
		mu.Lock()
		rep.made++
		rep.byOp[j.op]++
		mu.Unlock()
	}
	if rep.peekOnly {
		rep.planned = len(keys) * len(o.policies)
		for i := range rep.planned {
			at := start.Add(time.Duration(i) * interval)
			if e.sleepUntil(ctx, at); ctx.Err() != nil {
				rep.interrupted = true
				break
			}
			call(job{throttler.OpPeek, keys[i/len(o.policies)], o.policies[i%len(o.policies)], e.now()})
		}
	} else {
		rep.duration, rep.planned, rep.concurrency = o.duration, o.planned(), min(o.concurrency, len(keys))
		rep.interrupted = e.synthetic(ctx, o, keys, start, interval, rep.concurrency, call)
	}
	// Every mirrored call is compared before the report, within a bound
	// that a stuck candidate cannot stretch: each call has its timeout.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*o.cfg.timeout+time.Second)
	rep.flushErr = sh.Flush(fctx)
	cancel()
	sh.Close()
	rep.stats = sh.Stats()
	col.mu.Lock()
	rep.errs, rep.unreachable = col.errs, col.unreachable
	col.mu.Unlock()

	code := rep.exitCode()
	if o.asJSON {
		if err := writeJSON(e.stdout, rep.toJSON(code)); err != nil {
			return e.fail(cmd, exitFailed, err)
		}
	} else {
		rep.writeText(e.stdout, code)
	}
	return code
}

// job is one call of the traffic.
type job struct {
	op  throttler.Op
	key string
	p   throttler.Policy
	at  time.Time
}

// synthetic paces the synthetic traffic and hands each call to one of
// workers goroutines, always the same one for a key, so that a key's calls
// reach the stores in order while several keys' calls are in flight at
// once. Call i goes to key i mod keys; each round of the keys takes the
// next operation, each cycle of the operations the next policy; its now is
// the instant it is due. It stops at the end of the duration, even with
// calls left (a worker behind holds the pacing up), and reports whether it
// was interrupted.
func (e *env) synthetic(ctx context.Context, o *shadowOpts, keys []string, start time.Time, interval time.Duration, workers int, call func(job)) (interrupted bool) {
	queues := make([]chan job, workers)
	var wg sync.WaitGroup
	for w := range queues {
		queues[w] = make(chan job, 16)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range queues[w] {
				call(j)
			}
		}()
	}
	defer func() {
		for _, q := range queues {
			close(q)
		}
		wg.Wait()
	}()
	deadline := start.Add(o.duration)
	for i := range o.planned() {
		at := start.Add(time.Duration(i) * interval)
		if e.sleepUntil(ctx, at); ctx.Err() != nil {
			return true
		}
		if e.now().After(deadline) {
			return false // behind schedule: the calls left are reported as not made
		}
		round := i / len(keys)
		j := job{o.ops[round%len(o.ops)], keys[i%len(keys)], o.policies[(round/len(o.ops))%len(o.policies)], at}
		select {
		case queues[(i%len(keys))%workers] <- j:
		case <-ctx.Done():
			return true
		}
	}
	return false
}

// exitCode: unreachable if a store failed as a store; otherwise agreement
// is every call compared and matched, nothing dropped or failed.
func (r *shadowReport) exitCode() int {
	s := r.stats
	switch {
	case r.unreachable:
		return exitUnreachable
	case s.Mismatched > 0, s.ByKind[shadow.CandidateError] > 0, s.ByKind[shadow.ControlError] > 0,
		s.ByKind[shadow.Dropped] > 0, r.flushErr != nil, s.Compared == 0:
		return exitDiffer
	}
	return exitOK
}

// mismatchRate is the share of compared pairs that really differ; 0 before any was compared.
func mismatchRate(s shadow.Stats) float64 {
	if s.Compared == 0 {
		return 0
	}
	return float64(s.Mismatched) / float64(s.Compared)
}

// reportKinds are the kinds a report lists, in its order.
var reportKinds = []shadow.Kind{shadow.AllowedDiffers, shadow.UsedDiffers, shadow.ResetAtDiffers,
	shadow.RetryAfterDiffers, shadow.CandidateError, shadow.ControlError, shadow.Dropped}

// inFlight says how many calls the traffic had in flight, when more than one.
func (r *shadowReport) inFlight() string {
	if r.concurrency > 1 {
		return fmt.Sprintf(", %d in flight", r.concurrency)
	}
	return ""
}

func describeStore(s *store) string { return s.name + " (" + strings.Join(s.addrs, ",") + ")" }

func formatDecision(d throttler.Decision) string {
	return fmt.Sprintf("allowed=%s used=%d remaining=%d reset_at=%s retry_after=%v",
		yesNo(d.Allowed), d.Used, d.Remaining, d.ResetAt.UTC().Format(timeLayout), d.RetryAfter)
}

func (r *shadowReport) writeText(w io.Writer, code int) {
	s := r.stats
	fmt.Fprintf(w, "control:   %s\ncandidate: %s\n", describeStore(r.control), describeStore(r.candidate))
	ps := make([]string, len(r.policies))
	for i, p := range r.policies {
		ps[i] = formatPolicy(p)
	}
	fmt.Fprintf(w, "policies:  %s\n", strings.Join(ps, " "))
	switch {
	case r.peekOnly:
		fmt.Fprintf(w, "traffic:   peek only, %d given keys\n", r.keys)
	case r.keyPrefix == "":
		fmt.Fprintf(w, "traffic:   LIVE keys (%d given), %v at %v calls/s, each key %s%s\n", r.keys, r.duration, r.rate, formatOps(r.ops), r.inFlight())
	default:
		fmt.Fprintf(w, "traffic:   %d synthetic keys %s*, %v at %v calls/s, each key %s%s\n", r.keys, r.keyPrefix, r.duration, r.rate, formatOps(r.ops), r.inFlight())
	}
	var ops []string
	for _, op := range []throttler.Op{throttler.OpTake, throttler.OpPeek, throttler.OpRefund} {
		if n := r.byOp[op]; n > 0 {
			ops = append(ops, fmt.Sprintf("%s %d", op, n))
		}
	}
	fmt.Fprintf(w, "calls:     %d of %d made", r.made, r.planned)
	if len(ops) > 0 {
		fmt.Fprintf(w, " (%s)", strings.Join(ops, ", "))
	}
	switch {
	case r.interrupted:
		fmt.Fprint(w, "; interrupted")
	case r.made < r.planned:
		fmt.Fprint(w, "; the stores were too slow for the rate")
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "compared\t%d\n", s.Compared)
	fmt.Fprintf(tw, "mismatched\t%d\t%.3f%%\n", s.Mismatched, 100*mismatchRate(s))
	if s.Ignored > 0 {
		fmt.Fprintf(tw, "ignored\t%d\n", s.Ignored)
	}
	for _, k := range reportKinds {
		fmt.Fprintf(tw, "  %s\t%d\n", k, s.ByKind[k])
	}
	tw.Flush()
	if r.flushErr != nil {
		fmt.Fprintf(w, "not every call was compared: %v\n", r.flushErr)
	}
	// A mismatch was compared and not Reordered: its Kinds are the ways the decisions differ.
	if n := len(s.LastMismatches); n > 0 && r.show > 0 {
		last := s.LastMismatches[max(0, n-r.show):]
		fmt.Fprintf(w, "\nlatest mismatches (%d of %d):\n", len(last), s.Mismatched)
		for _, m := range last {
			fmt.Fprintf(w, "  %s %q under %s at %s: %s\n", m.Op, m.Key, formatPolicy(m.Policy), m.Now.UTC().Format(timeLayout), m.Kinds)
			fmt.Fprintf(w, "    control:   %s\n", formatDecision(m.Control))
			fmt.Fprintf(w, "    candidate: %s\n", formatDecision(m.Candidate))
		}
	}
	if len(r.errs) > 0 {
		fmt.Fprintf(w, "\nfirst errors:\n")
		for _, e := range r.errs {
			fmt.Fprintf(w, "  %s\n", e)
		}
	}
	fmt.Fprintln(w)
	switch code {
	case exitOK:
		fmt.Fprintln(w, "the stores agree")
	case exitUnreachable:
		fmt.Fprintln(w, "a store was unreachable")
	default:
		fmt.Fprintln(w, "the stores do not agree")
	}
}

type shadowJSON struct {
	Control      storeJSON         `json:"control"`
	Candidate    storeJSON         `json:"candidate"`
	Policies     []string          `json:"policies"`
	Mode         string            `json:"mode"` // synthetic, live or peek
	KeyPrefix    string            `json:"key_prefix,omitempty"`
	Keys         int               `json:"keys"`
	DurationMS   int64             `json:"duration_ms,omitempty"`
	Rate         float64           `json:"rate"`
	Concurrency  int               `json:"concurrency,omitempty"`
	Planned      int               `json:"planned"`
	Made         int               `json:"made"`
	Ops          map[string]int    `json:"ops"`
	Interrupted  bool              `json:"interrupted"`
	Compared     uint64            `json:"compared"`
	Mismatched   uint64            `json:"mismatched"`
	MismatchRate float64           `json:"mismatch_rate"`
	Ignored      uint64            `json:"ignored"`
	ByKind       map[string]uint64 `json:"by_kind"`
	Mismatches   []mismatchJSON    `json:"mismatches"`
	Errors       []string          `json:"errors"`
	FlushError   string            `json:"flush_error,omitempty"`
	Exit         int               `json:"exit_status"`
}

type storeJSON struct {
	Store string   `json:"store"`
	Addrs []string `json:"addrs"`
}

type decisionJSON struct {
	Allowed      bool   `json:"allowed"`
	Used         int64  `json:"used"`
	Remaining    int64  `json:"remaining"`
	ResetAt      string `json:"reset_at"`
	RetryAfterMS int64  `json:"retry_after_ms"`
}

type mismatchJSON struct {
	Op        string       `json:"op"`
	Key       string       `json:"key"`
	Policy    string       `json:"policy"`
	At        string       `json:"at"`
	Kinds     []string     `json:"kinds"`
	Control   decisionJSON `json:"control"`
	Candidate decisionJSON `json:"candidate"`
}

func toDecisionJSON(d throttler.Decision) decisionJSON {
	return decisionJSON{Allowed: d.Allowed, Used: d.Used, Remaining: d.Remaining,
		ResetAt: d.ResetAt.UTC().Format(timeLayout), RetryAfterMS: d.RetryAfter.Milliseconds()}
}

func (r *shadowReport) toJSON(code int) shadowJSON {
	s := r.stats
	out := shadowJSON{
		Control:   storeJSON{r.control.name, r.control.addrs},
		Candidate: storeJSON{r.candidate.name, r.candidate.addrs},
		Mode:      "synthetic", KeyPrefix: r.keyPrefix, Keys: r.keys, DurationMS: r.duration.Milliseconds(),
		Rate: r.rate, Concurrency: r.concurrency, Planned: r.planned, Made: r.made, Ops: map[string]int{}, Interrupted: r.interrupted,
		Compared: s.Compared, Mismatched: s.Mismatched, MismatchRate: mismatchRate(s), Ignored: s.Ignored,
		ByKind: map[string]uint64{}, Mismatches: []mismatchJSON{}, Errors: r.errs, Exit: code,
	}
	switch {
	case r.peekOnly:
		out.Mode = "peek"
	case r.keyPrefix == "":
		out.Mode = "live"
	}
	if out.Errors == nil {
		out.Errors = []string{}
	}
	if r.flushErr != nil {
		out.FlushError = r.flushErr.Error()
	}
	for _, p := range r.policies {
		out.Policies = append(out.Policies, formatPolicy(p))
	}
	for op, n := range r.byOp {
		out.Ops[op.String()] = n
	}
	for _, k := range reportKinds {
		out.ByKind[k.String()] = s.ByKind[k]
	}
	if n := len(s.LastMismatches); n > 0 && r.show > 0 {
		for _, m := range s.LastMismatches[max(0, n-r.show):] {
			out.Mismatches = append(out.Mismatches, mismatchJSON{
				Op: m.Op.String(), Key: m.Key, Policy: formatPolicy(m.Policy), At: m.Now.UTC().Format(timeLayout),
				Kinds: kindList(m.Kinds), Control: toDecisionJSON(m.Control), Candidate: toDecisionJSON(m.Candidate),
			})
		}
	}
	return out
}
