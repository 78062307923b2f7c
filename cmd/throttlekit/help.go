package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// manPage is a command's manual, laid out as man(1) lays out a page. Its
// OPTIONS section is written from the flags the command declares, so the
// two cannot drift apart.
type manPage struct {
	name        string // "throttlekit inspect - ..."
	synopsis    []string
	description string
	sections    []section // after OPTIONS: POLICIES, STORES, ...
	exits       []int     // the exit statuses the command can return
	examples    string
}

type section struct{ title, body string }

const (
	indent     = "       "        // a section's body
	optIndent  = "              " // an option's description
	pageWidth  = 79
	wrapAtBody = pageWidth - len(optIndent)
)

var exitText = map[int]string{
	exitOK:          "Success; for inspect and shadow, the stores agree.",
	exitDiffer:      "The stores' answers differ (inspect), or the comparison found a mismatch, a candidate or control error, or a dropped call (shadow).",
	exitUsage:       "Usage error: an unknown or malformed option, argument, policy or address. Nothing was read or written.",
	exitUnreachable: "A store did not answer: a connection refused or reset, a timeout, a server that is loading or read only (throttler.ErrUnavailable).",
	exitFailed:      "Another failure: the rollout file cannot be read, parsed or written, or a store answered a key with an error (a corrupt item).",
}

func (m *manPage) write(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "NAME\n%s%s\n\nSYNOPSIS\n", indent, m.name)
	for _, s := range m.synopsis {
		fmt.Fprintf(w, "%s%s\n", indent, s)
	}
	fmt.Fprintf(w, "\nDESCRIPTION\n%s\n", indentBlock(m.description, indent))
	fmt.Fprintf(w, "\nOPTIONS\n")
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		if name != "" {
			name = " " + name
		}
		fmt.Fprintf(w, "%s--%s%s\n", indent, f.Name, name)
		if f.DefValue != "" && f.DefValue != "false" && !strings.Contains(usage, "(default") {
			usage += " (default " + f.DefValue + ")"
		}
		fmt.Fprintf(w, "%s\n", wrap(usage, optIndent, wrapAtBody))
	})
	fmt.Fprintf(w, "%s-h, --help\n%sPrint this manual and exit.\n", indent, optIndent)
	for _, s := range m.sections {
		fmt.Fprintf(w, "\n%s\n%s\n", s.title, indentBlock(s.body, indent))
	}
	fmt.Fprintf(w, "\nEXIT STATUS\n")
	for _, code := range m.exits {
		fmt.Fprintf(w, "%s%d%s\n", indent, code, strings.TrimPrefix(wrap(exitText[code], optIndent, wrapAtBody), indent+" "))
	}
	fmt.Fprintf(w, "\nEXAMPLES\n%s\n", indentBlock(m.examples, indent))
}

// indentBlock indents text (written flush left in the source) by prefix.
// Paragraphs of prose are filled to the page's width; a paragraph with an
// indented line or aligned columns (two spaces in a row) is kept as it is.
func indentBlock(text, prefix string) string {
	paras := strings.Split(strings.Trim(text, "\n"), "\n\n")
	for i, para := range paras {
		if !strings.Contains(para, "  ") && !strings.Contains(para, "\n ") && !strings.HasPrefix(para, " ") {
			paras[i] = wrap(para, prefix, pageWidth-len(prefix))
			continue
		}
		lines := strings.Split(para, "\n")
		for j, l := range lines {
			if l != "" {
				lines[j] = prefix + l
			}
		}
		paras[i] = strings.Join(lines, "\n")
	}
	return strings.Join(paras, "\n\n")
}

// wrap fills text into lines of at most width characters after prefix.
func wrap(text, prefix string, width int) string {
	var b strings.Builder
	n := 0
	for _, word := range strings.Fields(text) {
		switch {
		case n == 0:
			b.WriteString(prefix)
		case n+1+len(word) > width:
			b.WriteString("\n" + prefix)
			n = 0
		default:
			b.WriteByte(' ')
			n++
		}
		b.WriteString(word)
		n += len(word)
	}
	return b.String()
}

const policiesSection = `A policy is written as comma-separated field=value pairs, as the
application builds its throttler.Policy:

    name=api,limit=5000,window=1h
    name=search,limit=10,window=1s,algorithm=token-bucket,burst=20

limit (required)  units per window, 1 to 2^48 (a sliding log: 10000)
window (required) a Go duration: 1500ms, 1s, 1m, 1h; whole milliseconds
name              the policy's Name; absent or empty: an unnamed policy
algorithm         fixed-window (default), token-bucket, sliding-log or
                  sliding-window
burst             a token bucket's capacity; 0 or absent means the limit

The name, limit, window and algorithm are part of the key the stores keep:
give them exactly as the application does, or the stores are asked about
another window than the one it counts in.`

const storesSection = `Each store option names one store, as the application configures it:

memcached       --memcached: the servers of one client, in its order
redis           --redis: one address (redis.New) or the primaries of the
                shards (redis.NewSharded), in the application's order
redis-replica   --redis-replica: one replica of each shard; a second
                --redis-replica is redis-replica-2, and so on

The prefixes (--redis-prefix, --memcached-prefix) must be the
application's. Nothing is written to a replica. A Redis Cluster or Ring
client is not supported.`

var rolloutGetPage = manPage{
	name: "throttlekit rollout get - print a file rollout's settings",
	synopsis: []string{
		"throttlekit rollout get --file path [--enforcement] [--json]",
		"throttlekit rollout get --file path [--enforcement] --group g --key k...",
	},
	description: `Reads the rollout file that the application's flags.NewFile watches, exactly
as it reads it: a regular file holding one JSON object with an integer
"percent" from 0 to 100 and an optional boolean "mirror"; an unknown or
repeated field, a field in another case, or anything after the object is an
error. It prints the settings the application has in force once it has read
the file.

With --enforcement, the file is a policy's enforcement, read by
flags.Enforcement(flags.File): it prints the share of keys the policy
refuses beyond its limit; the others are in dry run (counted, admitted, and
reported as would-be denials). A file with mirroring on is refused: only a
store migration's rollout file has it, so the path is probably the wrong
file.

With --key, it also says where each key stands: its bucket (1 to 100) in the
--group the application buckets in, and so whether the percentage puts it
in (on the new store, or enforced) or which percentage would. The group is
not in the file: give the application's FileOptions.GroupID.`,
	exits: []int{exitOK, exitUsage, exitFailed},
	examples: `Read the settings:

    $ throttlekit rollout get --file /etc/throttlekit/rollout.json
    file:    /etc/throttlekit/rollout.json
    percent: 25
    mirror:  on

As JSON, for a script:

    $ throttlekit rollout get --file rollout.json --json
    {"percent":25,"mirror":true}

A policy's enforcement:

    $ throttlekit rollout get --enforcement --file /etc/throttlekit/limit-api-v2.json
    file:     /etc/throttlekit/limit-api-v2.json
    enforced: 10% of keys; the others in dry run

Is a client refused by the new limit yet?

    $ throttlekit rollout get --enforcement --file limit-api-v2.json \
        --group limit-api-v2 --key user:42 --key user:1
    file:     limit-api-v2.json
    enforced: 10% of keys; the others in dry run
    key "user:42": bucket 83 of group "limit-api-v2": in dry run until the percentage reaches 83
    key "user:1": bucket 5 of group "limit-api-v2": enforced`,
}

var rolloutSetPage = manPage{
	name: "throttlekit rollout set - set a file rollout's percentage",
	synopsis: []string{
		"throttlekit rollout set --file path [--mirror on|off] [--json] percent",
		"throttlekit rollout set --enforcement --file path [--json] percent",
	},
	description: `Sets the percentage of keys a flags.File rollout sends to the new store, a
whole number from 0 to 100 (a trailing % is allowed), and keeps the file's
mirror setting unless --mirror is given. Raising the percentage only adds
keys to the new store; 0 sends every key back to the old one (a rollback).

The file is replaced atomically: the settings are written to a temporary
file in the same directory, synced to disk, and renamed over the file, so a
process checking it reads the old settings or the new ones, never a part.
A symbolic link is followed and kept; the file's permissions are kept. The
content is one line, such as {"percent":10,"mirror":true}, which the strict
reader is checked to read back; the file is read back once more after the
rename and printed.

Each host reads its own copy: a change takes effect on a host at its next
check (flags.FileOptions.Interval, default 1s) once the file has reached it.

With --enforcement, the file is a policy's enforcement, read by
flags.Enforcement(flags.File), and the percentage is the share of keys the
policy is enforced for; the others are in dry run. Raising it only adds
keys, so no enforced key is released; 0 puts every key in dry run again on
its next call (a rollback). The file is written with mirroring off: --mirror
is refused, and so is an existing file with mirroring on (a store
migration's rollout file). A missing file is created, and a file that cannot
be read is replaced (and said so on standard error), so that a rollback
needs nothing else.`,
	exits: []int{exitOK, exitUsage, exitFailed},
	examples: `Ramp to 10%, keeping mirroring on:

    $ throttlekit rollout set --file /etc/throttlekit/rollout.json 10
    file:    /etc/throttlekit/rollout.json
    percent: 1 -> 10
    mirror:  on

Roll back at once:

    $ throttlekit rollout set --file /etc/throttlekit/rollout.json 0

Start a migration's shadow stage with a new file:

    $ throttlekit rollout set --file rollout.json --mirror on 0

Finish: everyone on the new store, then stop mirroring a window later:

    $ throttlekit rollout set --file rollout.json 100
    $ throttlekit rollout set --file rollout.json --mirror off 100

Enforce a new limit for 1% of clients, then 10%, then all, after its dry
run:

    $ throttlekit rollout set --enforcement --file limit-api-v2.json 1
    file:     limit-api-v2.json
    enforced: 0% -> 1% of keys; the others in dry run
    $ throttlekit rollout set --enforcement --file limit-api-v2.json 10
    $ throttlekit rollout set --enforcement --file limit-api-v2.json 100

Roll the limit back to a dry run for every key:

    $ throttlekit rollout set --enforcement --file limit-api-v2.json 0
    file:     limit-api-v2.json
    enforced: 10% -> 0% of keys: every key in dry run`,
}

var inspectPage = manPage{
	name: "throttlekit inspect - read a key on each store, side by side",
	synopsis: []string{
		"throttlekit inspect --policy spec... --key key [--memcached addrs]",
		"                    [--redis addrs] [--redis-replica addrs...] [--json]",
	},
	description: `Peeks the key under each policy on every configured store, at one instant,
and prints the answers side by side: allowed (would one more unit be
admitted), used, remaining, reset at (to the millisecond, UTC) and retry
after. Peek writes nothing, so a replica may be read, and the key's clients
are not charged.

Every store is checked first, each within --timeout: every Memcached server
and Redis node must answer, or the command stops with exit status 3 and an
error naming the store and the address that failed, before any Peek.

The first store in the table (memcached, then redis, then the replicas) is
the reference: the VS column says how each other store's answer differs
from it, with the kinds and tolerances of package shadow: allowed, used
(used or remaining), reset_at and retry_after (more than 1ms apart), or
match. A replica that lags its primary shows here as used or reset_at.`,
	sections: []section{{"POLICIES", policiesSection}, {"STORES", storesSection}},
	exits:    []int{exitOK, exitDiffer, exitUsage, exitUnreachable, exitFailed},
	examples: `Compare a client's core limit on both stores and a replica during a
migration; the replica has not received the last take yet:

    $ throttlekit inspect --policy name=core,limit=10,window=1m --key user:42 \
        --memcached 10.0.0.5:11211 --redis 10.0.1.5:6379 --redis-replica 10.0.1.6:6379
    key: user:42
    at:  2026-03-01T12:00:00.000Z

    policy name=core,limit=10,window=1m
    STORE          ADDRESS         ALLOWED  USED  REMAINING  RESET AT                  RETRY AFTER  VS memcached
    memcached      10.0.0.5:11211  yes      3     7          2026-03-01T12:00:50.000Z  0s           -
    redis          10.0.1.5:6379   yes      3     7          2026-03-01T12:00:50.000Z  0s           match
    redis-replica  10.0.1.6:6379   yes      2     8          2026-03-01T12:00:50.000Z  0s           used

    redis-replica differs from memcached (used) under name=core,limit=10,window=1m

The same as JSON, for a script:

    $ throttlekit inspect --policy name=core,limit=5000,window=1h --key user:42 \
        --redis 10.0.1.5:6379 --json`,
}

var shadowPage = manPage{
	name: "throttlekit shadow - compare two stores with a short shadow run",
	synopsis: []string{
		"throttlekit shadow --control store --candidate store --policy spec...",
		"                   [--duration d] [--keys n] [--rate r] [--ops list]",
		"                   [--cost n] [store options] [--json]",
		"throttlekit shadow --control store --candidate store --policy spec...",
		"                   (--key key... | --keys-file file) [--live]",
		"                   [store options] [--json]",
	},
	description: `Runs what a migration's shadow stage runs (package shadow), for a short
while, and reports the mismatches by kind: every call is served by the
control store and mirrored to the candidate with the same key, policy, cost
and instant, and the two answers are compared.

With no --key, it sends synthetic traffic: --rate calls per second for
--duration, round the --keys keys, each key going through --ops in turn and
each cycle of them under the next --policy. The keys are throwaway ones,
named --key-prefix, the run's id (the start in base-36 milliseconds), a
colon and the key's number, so no client's count is touched; the stores
expire them a little after their windows end.

With --key or --keys-file, it compares those keys by Peek alone, once under
each policy, writing nothing: a check of live keys, for example after a
ramp. With --live as well, the synthetic traffic goes to those keys instead;
its takes spend those clients' budget, so only ask for it knowingly.

Every store is checked first (every Memcached server and Redis node must
answer within --timeout), and both stores are read once before the traffic
starts: a store that does not answer ends the run with exit status 3 and an
error naming the address that failed, before anything is written. An
interrupt (Ctrl-C) stops the traffic; what was sent is still compared and
reported. The stores must not be serving live traffic under the synthetic
keys' prefix, and a store that another process writes to under the same
keys makes the comparison meaningless.`,
	sections: []section{
		{"REPORT", `The report counts the compared pairs and the mismatched ones, then each kind
(a pair may carry several): allowed, used, reset_at, retry_after (the
decisions differ), candidate_error, control_error (a store failed the call)
and dropped (the candidate fell behind and the call was never mirrored).
docs/migration.md ("What to watch") says what each kind means during a
migration. The latest mismatches follow with both decisions.`},
		{"POLICIES", policiesSection},
		{"STORES", storesSection},
	},
	exits: []int{exitOK, exitDiffer, exitUsage, exitUnreachable, exitFailed},
	examples: `Ten seconds of synthetic traffic, Memcached serving, Redis compared:

    $ throttlekit shadow --control memcached --candidate redis \
        --memcached 10.0.0.5:11211 --redis 10.0.1.5:6379 \
        --policy name=core,limit=10,window=1m --duration 10s --keys 50 --rate 200

A token bucket and a sliding log together, a thousand calls each second:

    $ throttlekit shadow --control memcached --candidate redis ... \
        --policy name=search,limit=10,window=1s,algorithm=token-bucket,burst=20 \
        --policy name=hooks,limit=100,window=1m,algorithm=sliding-log --rate 1000

Compare live keys, read only, against a replica:

    $ throttlekit shadow --control redis --candidate redis-replica \
        --redis 10.0.1.5:6379 --redis-replica 10.0.1.6:6379 \
        --policy name=core,limit=5000,window=1h --keys-file hot-keys.txt`,
}

const mainDescription = `throttlekit operates a migration of throttlekit's rate limits from one store
to another (docs/migration.md): it sets the file rollout that routes keys,
reads a key on each store side by side, and compares two stores the way the
migration's shadow does. It only ever reads the stores, except for the
synthetic keys of throttlekit shadow (and live keys given with --live). With
--enforcement, rollout get and set read and set a policy's enforcement file
instead: the share of keys a new limit refuses, the others in dry run
(docs/operations.md).

Commands:

rollout get   print a file rollout's percentage and mirror setting, or
              with --enforcement a policy's enforced share of keys
rollout set   set a file rollout's percentage, atomically
inspect       read one key under a policy on each store, side by side
shadow        compare two stores with a short shadow run
help          print the manual of a command: throttlekit help inspect

Options may come before or after the arguments, with one dash or two
(--file f, -file=f); -- ends them.`

func (e *env) printMain(w io.Writer) {
	m := manPage{
		name: "throttlekit - operate a store migration or a limit's enforcement",
		synopsis: []string{
			"throttlekit rollout get --file path [--enforcement] [--json | --group g --key k]",
			"throttlekit rollout set --file path [--mirror on|off] [--json] percent",
			"throttlekit rollout set --enforcement --file path [--json] percent",
			"throttlekit inspect --policy spec --key key [store options] [--json]",
			"throttlekit shadow --control store --candidate store --policy spec [options]",
			"throttlekit help [command]",
		},
		description: mainDescription,
		sections:    []section{{"POLICIES", policiesSection}, {"STORES", storesSection}},
		exits:       []int{exitOK, exitDiffer, exitUsage, exitUnreachable, exitFailed},
		examples: `The stages of a Memcached-to-Redis migration from the command line:

    $ throttlekit rollout set --file rollout.json --mirror on 0      # shadow
    $ throttlekit shadow --control memcached --candidate redis \
        --memcached 10.0.0.5:11211 --redis 10.0.1.5:6379 \
        --policy name=core,limit=5000,window=1h                        # check
    $ throttlekit rollout set --file rollout.json 10                 # ramp
    $ throttlekit inspect --policy name=core,limit=5000,window=1h \
        --key user:42 --memcached 10.0.0.5:11211 --redis 10.0.1.5:6379
    $ throttlekit rollout set --file rollout.json 0                  # roll back

A new limit, after its dry run: enforced for 1%, 10%, then every client,
and rolled back to a dry run:

    $ throttlekit rollout set --enforcement --file limit-api-v2.json 1
    $ throttlekit rollout set --enforcement --file limit-api-v2.json 10
    $ throttlekit rollout set --enforcement --file limit-api-v2.json 100
    $ throttlekit rollout set --enforcement --file limit-api-v2.json 0`,
	}
	fs := flag.NewFlagSet("throttlekit", flag.ContinueOnError)
	m.write(w, fs)
}
