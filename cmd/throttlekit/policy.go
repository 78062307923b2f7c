package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// policyFields are the fields of a --policy, in the order they are written.
var policyFields = []string{"name", "limit", "window", "algorithm", "burst"}

// parsePolicy reads a policy written as comma-separated field=value pairs,
// "name=api,limit=5000,window=1h,algorithm=token-bucket,burst=100": limit
// and window are required; name, algorithm (fixed-window by default) and
// burst (token-bucket only) are not. The result is a policy that
// Policy.Validate accepts, so that the stores are asked with exactly what
// the application uses; every error says which field is wrong and why.
func parsePolicy(spec string) (throttler.Policy, error) {
	var p throttler.Policy
	if strings.TrimSpace(spec) == "" {
		return p, errors.New("empty; want for example name=api,limit=100,window=1m")
	}
	seen := map[string]bool{}
	for field := range strings.SplitSeq(spec, ",") {
		name, value, ok := strings.Cut(field, "=")
		name = strings.TrimSpace(name)
		value = strings.TrimSpace(value)
		switch {
		case field == "":
			return p, errors.New("an empty field (two commas, or one at an end)")
		case !ok:
			return p, fmt.Errorf("field %q has no value; want name=value", field)
		case seen[name]:
			return p, fmt.Errorf("field %q given twice", name)
		case value == "" && name != "name":
			return p, fmt.Errorf("field %q has an empty value", name)
		}
		seen[name] = true
		var err error
		switch name {
		case "name":
			p.Name = value
		case "limit":
			p.Limit, err = parseCount(value)
		case "window":
			p.Window, err = parseWindow(value)
		case "algorithm":
			p.Algorithm, err = parseAlgorithm(value)
		case "burst":
			p.Burst, err = parseCount(value)
		default:
			return p, fmt.Errorf("unknown field %q; the fields are %s", name, strings.Join(policyFields, ", "))
		}
		if err != nil {
			return p, fmt.Errorf("%s: %w", name, err)
		}
	}
	for _, f := range []string{"limit", "window"} {
		if !seen[f] {
			return p, fmt.Errorf("field %q is required", f)
		}
	}
	if err := p.Validate(); err != nil {
		// Validate's words without its package prefix: this is the
		// command line's error, not the library's.
		return p, errors.New(strings.TrimPrefix(err.Error(), throttler.ErrInvalidPolicy.Error()+": "))
	}
	return p, nil
}

func parseCount(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && ne.Err == strconv.ErrRange {
			return 0, fmt.Errorf("%q is out of range", s)
		}
		return 0, fmt.Errorf("%q is not a whole number", s)
	}
	return n, nil
}

func parseWindow(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration (for example 1s, 1m, 1h, 1500ms)", s)
	}
	return d, nil
}

// parseAlgorithm takes an algorithm's String ("token-bucket").
func parseAlgorithm(s string) (throttler.Algorithm, error) {
	var names []string
	for a := throttler.Algorithm(0); !strings.HasPrefix(a.String(), "Algorithm("); a++ {
		if a.String() == s {
			return a, nil
		}
		names = append(names, a.String())
	}
	return 0, fmt.Errorf("unknown algorithm %q; want one of %s", s, strings.Join(names, ", "))
}

// formatPolicy writes p as parsePolicy reads it, fields at their zero
// value left out.
func formatPolicy(p throttler.Policy) string {
	var b strings.Builder
	if p.Name != "" {
		b.WriteString("name=" + p.Name + ",")
	}
	fmt.Fprintf(&b, "limit=%d,window=%s", p.Limit, formatDuration(p.Window))
	if p.Algorithm != throttler.FixedWindow {
		b.WriteString(",algorithm=" + p.Algorithm.String())
	}
	if p.Burst != 0 {
		fmt.Fprintf(&b, ",burst=%d", p.Burst)
	}
	return b.String()
}

// formatDuration writes whole hours, minutes or seconds shortly ("1h",
// "90s"), and anything else as time.Duration does.
func formatDuration(d time.Duration) string {
	switch {
	case d == 0:
		return "0s"
	case d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	case d%time.Minute == 0:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	case d%time.Second == 0:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return d.String()
}

// policyList is a repeatable --policy.
type policyList []throttler.Policy

func (l *policyList) String() string {
	if l == nil {
		return ""
	}
	parts := make([]string, len(*l))
	for i, p := range *l {
		parts[i] = formatPolicy(p)
	}
	return strings.Join(parts, " ")
}

func (l *policyList) Set(s string) error {
	p, err := parsePolicy(s)
	if err != nil {
		return err
	}
	*l = append(*l, p)
	return nil
}

// validateKey reports why a key given on the command line cannot be used,
// as an error matching throttler.ErrInvalidKey: it validates a Peek under a
// valid policy, so that only the key can be wrong.
func validateKey(key string) error {
	return throttler.ValidateCall(throttler.OpPeek, key, throttler.PerSecond(1), 0, time.Time{})
}
