package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/throttlekit/throttlekit/shadow"
	"github.com/throttlekit/throttlekit/throttler"
)

// timeLayout prints instants as the stores keep them: to the millisecond.
const timeLayout = "2006-01-02T15:04:05.000Z07:00"

func inspectCommand() *command {
	return &command{name: "inspect", page: inspectPage, flags: func(e *env, fs *flag.FlagSet) func(context.Context, []string) int {
		var policies policyList
		fs.Var(&policies, "policy", "The policy to read the key under, `name=N,limit=L,window=W[,algorithm=A][,burst=B]` (see POLICIES); required. Repeat it for several policies.")
		key := fs.String("key", "", "The `key` to inspect (required), as the application passes it to the Throttler.")
		asJSON := fs.Bool("json", false, "Print the answers as JSON.")
		var cfg storeConfig
		addStoreFlags(fs, &cfg)
		return func(ctx context.Context, args []string) int {
			const cmd = "inspect"
			switch {
			case len(args) > 0:
				return e.usage(cmd, "unexpected argument %q", args[0])
			case len(policies) == 0:
				return e.usage(cmd, "--policy is required")
			case *key == "":
				return e.usage(cmd, "--key is required")
			}
			if err := validateKey(*key); err != nil {
				return e.usage(cmd, "--key: %v", err)
			}
			if err := cfg.check(); err != nil {
				return e.usage(cmd, "%v", err)
			}
			if len(cfg.names()) == 0 {
				return e.usage(cmd, "no store: give --redis, --redis-replica or --memcached")
			}
			st, err := e.open(cfg)
			if err != nil {
				return e.openError(cmd, err)
			}
			defer st.Close()
			if err := checkStores(ctx, st.list, cfg.timeout); err != nil {
				return e.fail(cmd, exitFor(err), err)
			}
			rep := inspectReport{Key: *key, At: e.now()}
			for _, p := range policies {
				rep.Policies = append(rep.Policies, peekAll(ctx, st.list, *key, p, rep.At, cfg.timeout))
			}
			code := rep.exitCode()
			if *asJSON {
				if err := writeJSON(e.stdout, rep.toJSON()); err != nil {
					return e.fail(cmd, exitFailed, err)
				}
			} else {
				rep.writeText(e.stdout)
			}
			return code
		}
	}}
}

// peekRow is one store's answer to a Peek.
type peekRow struct {
	store *store
	d     throttler.Decision
	err   error
	// kinds is how d differs from the first store's answer, as a shadow
	// would count it (both answered), for every store but the first.
	kinds shadow.Kind
}

type policyRows struct {
	p    throttler.Policy
	rows []peekRow
}

type inspectReport struct {
	Key      string
	At       time.Time
	Policies []policyRows
}

// peekAll peeks key under p on every store at the same now. The first
// store is the reference: every other store is compared with it through a
// shadow.Backend, so that "differs" means what it means in a migration's
// shadow (same kinds, same tolerances). Peek writes nothing, so replicas may
// answer.
func peekAll(ctx context.Context, list []store, key string, p throttler.Policy, now time.Time, timeout time.Duration) policyRows {
	out := policyRows{p: p, rows: make([]peekRow, len(list))}
	for i := range list {
		out.rows[i].store = &list[i]
	}
	if len(list) == 1 {
		c, cancel := context.WithTimeout(ctx, timeout)
		out.rows[0].d, out.rows[0].err = list[0].b.Peek(c, key, p, now)
		cancel()
		return out
	}
	for i := 1; i < len(list); i++ {
		r, err := compareOne(ctx, list[0].b, list[i].b, key, p, now, timeout)
		if err != nil {
			// The comparison itself did not finish (cancelled): say so
			// for this store rather than guess.
			out.rows[i].err = err
			if i == 1 {
				out.rows[0].err = err
			}
			continue
		}
		if i == 1 {
			out.rows[0].d, out.rows[0].err = r.Control, r.ControlErr
		}
		cerr := r.CandidateErr
		if u := errors.Unwrap(cerr); u != nil && !errors.Is(cerr, context.DeadlineExceeded) {
			cerr = u // the store's error without the shadow's "candidate peek <key>"; a timeout keeps its words
		}
		out.rows[i].d, out.rows[i].err = r.Candidate, cerr
		if r.ControlErr == nil && cerr == nil {
			out.rows[i].kinds = r.Kinds // both answered: only the ways the decisions differ
		}
	}
	return out
}

// compareOne peeks key on control and, through a shadow, on candidate, and
// returns the shadow's comparison.
func compareOne(ctx context.Context, control, candidate throttler.Backend, key string, p throttler.Policy, now time.Time, timeout time.Duration) (shadow.Result, error) {
	results := make(chan shadow.Result, 1)
	sh, err := shadow.New(control, candidate, &shadow.Options{
		Workers: 1, QueueSize: 1, Timeout: timeout,
		Publish: func(r shadow.Result) { results <- r },
	})
	if err != nil {
		return shadow.Result{}, err
	}
	defer sh.Close()
	c, cancel := context.WithTimeout(ctx, timeout)
	d, cerr := sh.Peek(c, key, p, now)
	cancel()
	if err := sh.Flush(ctx); err != nil {
		return shadow.Result{}, err
	}
	select {
	case r := <-results:
		return r, nil
	default:
		// Not mirrored: the control refused the call as bad input, which
		// the candidate would refuse too.
		return shadow.Result{Control: d, ControlErr: cerr, CandidateErr: cerr}, nil
	}
}

// exitCode: unreachable before failed before differ.
func (r *inspectReport) exitCode() int {
	code := exitOK
	for _, pr := range r.Policies {
		for _, row := range pr.rows {
			switch {
			case row.err != nil && exitFor(row.err) == exitUnreachable:
				return exitUnreachable
			case row.err != nil:
				code = exitFailed
			case row.kinds != 0 && code == exitOK:
				code = exitDiffer
			}
		}
	}
	return code
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func (r *inspectReport) writeText(w io.Writer) {
	fmt.Fprintf(w, "key: %s\nat:  %s\n", r.Key, r.At.UTC().Format(timeLayout))
	var verdicts []string
	for _, pr := range r.Policies {
		fmt.Fprintf(w, "\npolicy %s\n", formatPolicy(pr.p))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		ref := pr.rows[0].store.name
		fmt.Fprintf(tw, "STORE\tADDRESS\tALLOWED\tUSED\tREMAINING\tRESET AT\tRETRY AFTER\tVS %s\n", ref)
		var errs []string
		for i, row := range pr.rows {
			vs := "-"
			switch {
			case row.err != nil:
				vs = "error"
				errs = append(errs, fmt.Sprintf("%s: %v", row.store.name, row.err))
			case i > 0:
				vs = row.kinds.String()
				if row.kinds != 0 {
					verdicts = append(verdicts, fmt.Sprintf("%s differs from %s (%s) under %s", row.store.name, ref, row.kinds, formatPolicy(pr.p)))
				}
			}
			if row.err != nil {
				fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t-\t%s\n", row.store.name, strings.Join(row.store.addrs, ","), vs)
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%v\t%s\n", row.store.name, strings.Join(row.store.addrs, ","),
				yesNo(row.d.Allowed), row.d.Used, row.d.Remaining, row.d.ResetAt.UTC().Format(timeLayout), row.d.RetryAfter, vs)
		}
		tw.Flush()
		for _, e := range errs {
			fmt.Fprintf(w, "error: %s\n", e)
		}
	}
	fmt.Fprintln(w)
	switch code := r.exitCode(); {
	case code == exitUnreachable:
		fmt.Fprintln(w, "a store is unreachable")
	case code == exitFailed:
		fmt.Fprintln(w, "a store failed")
	case len(verdicts) > 0:
		fmt.Fprintln(w, strings.Join(verdicts, "\n"))
	case len(r.Policies[0].rows) == 1:
		fmt.Fprintln(w, "one store: nothing to compare")
	default:
		fmt.Fprintln(w, "stores agree")
	}
}

type inspectJSON struct {
	Key      string           `json:"key"`
	At       string           `json:"at"`
	Policies []policyRowsJSON `json:"policies"`
	Exit     int              `json:"exit_status"`
}

type policyRowsJSON struct {
	Policy    string        `json:"policy"`
	Reference string        `json:"reference"`
	Stores    []peekRowJSON `json:"stores"`
}

type peekRowJSON struct {
	Store        string   `json:"store"`
	Addrs        []string `json:"addrs"`
	Allowed      bool     `json:"allowed"`
	Used         int64    `json:"used"`
	Remaining    int64    `json:"remaining"`
	Limit        int64    `json:"limit"`
	ResetAt      string   `json:"reset_at,omitempty"`
	RetryAfterMS int64    `json:"retry_after_ms"`
	// Differs lists the kinds of difference from the reference store;
	// absent for the reference itself and for a store that failed.
	Differs []string `json:"differs,omitempty"`
	Error   string   `json:"error,omitempty"`
}

// kindList lists k's single kinds by name, [] for a match.
func kindList(k shadow.Kind) []string {
	if k == 0 {
		return []string{}
	}
	return strings.Split(k.String(), "|")
}

func (r *inspectReport) toJSON() inspectJSON {
	out := inspectJSON{Key: r.Key, At: r.At.UTC().Format(timeLayout), Exit: r.exitCode()}
	for _, pr := range r.Policies {
		pj := policyRowsJSON{Policy: formatPolicy(pr.p), Reference: pr.rows[0].store.name}
		for i, row := range pr.rows {
			rj := peekRowJSON{Store: row.store.name, Addrs: row.store.addrs}
			if row.err != nil {
				rj.Error = row.err.Error()
			} else {
				rj.Allowed, rj.Used, rj.Remaining, rj.Limit = row.d.Allowed, row.d.Used, row.d.Remaining, row.d.Limit
				rj.ResetAt = row.d.ResetAt.UTC().Format(timeLayout)
				rj.RetryAfterMS = row.d.RetryAfter.Milliseconds()
				if i > 0 {
					rj.Differs = kindList(row.kinds)
				}
			}
			pj.Stores = append(pj.Stores, rj)
		}
		out.Policies = append(out.Policies, pj)
	}
	return out
}
