package throttlekit_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/throttlekit/throttlekit"

// wantDeps is, for each package a program may import and each internal
// package the stores and wrappers compile in, every third-party module (not
// the standard library, not this module) whose code it compiles in: exactly
// these, no more and no fewer. Modules rather than packages, because the
// packages inside a module move with its versions; a module is what reaches
// a user's go.sum and build.
//
// Only the HTTP edge (httplimit, and shed, which runs it) has httpsnoop
// (the rate middleware's writer). Only flags/unleash has the Unleash
// client, and with it what that client imports even outside its tests
// (testify's mock, yaml, objx).
var wantDeps = map[string][]string{
	"throttler":         nil,
	"backend":           nil,
	"backend/memory":    nil,
	"backend/memcached": {"github.com/bradfitz/gomemcache"},
	"backend/redis": {
		"github.com/cespare/xxhash/v2", "github.com/redis/go-redis/v9", "go.uber.org/atomic", "golang.org/x/sys",
	},
	"flags": nil,
	"flags/unleash": {
		"github.com/Masterminds/semver/v3", "github.com/Unleash/unleash-client-go/v4",
		"github.com/stretchr/objx", "github.com/stretchr/testify", "github.com/twmb/murmur3", "go.yaml.in/yaml/v3",
	},
	"shadow":    nil,
	"migration": nil,
	"outbound":  nil,
	"httplimit": {"github.com/felixge/httpsnoop"},
	"shed":      {"github.com/felixge/httpsnoop"},
	// The metrics adapters are the only packages with a metrics library,
	// each with its own and what that library compiles in.
	"metrics/prometheus": {
		"github.com/beorn7/perks", "github.com/cespare/xxhash/v2", "github.com/munnerz/goautoneg", "github.com/prometheus/client_golang", "github.com/prometheus/client_model",
		"github.com/prometheus/common", "github.com/prometheus/procfs", "golang.org/x/sys", "google.golang.org/protobuf",
	},
	"metrics/otel": {
		"github.com/cespare/xxhash/v2", "go.opentelemetry.io/otel", "go.opentelemetry.io/otel/metric",
	},
	// The arithmetic and names the stores share, and the wrappers' lease
	// forwarding: standard library only.
	"internal/algo":     nil,
	"internal/identity": nil,
	"internal/leaseset": nil,
	"internal/leaseop":  nil,
}

// listed is what `go list -json` says of one package.
type listed struct {
	ImportPath string
	Standard   bool
	Module     *struct{ Path string }
	Deps       []string
	Imports    []string
}

// TestThirdPartyDeps asks `go list -deps` which modules each public
// package compiles in (its tests' imports are not counted) and compares
// them with wantDeps.
func TestThirdPartyDeps(t *testing.T) {
	var targets []string
	for p := range wantDeps {
		targets = append(targets, module+"/"+p)
	}
	slices.Sort(targets)
	pkgs := map[string]listed{}
	for _, p := range goList(t, append([]string{"-deps", "-json=ImportPath,Standard,Module,Deps"}, targets...)...) {
		pkgs[p.ImportPath] = p
	}
	for _, target := range targets {
		p, ok := pkgs[target]
		if !ok {
			t.Errorf("go list did not list %s", target)
			continue
		}
		var got []string
		for _, d := range p.Deps {
			dep, ok := pkgs[d]
			if !ok {
				t.Errorf("%s: dependency %s not listed", target, d)
				continue
			}
			if dep.Standard || dep.Module == nil || dep.Module.Path == module {
				continue
			}
			if !slices.Contains(got, dep.Module.Path) {
				got = append(got, dep.Module.Path)
			}
		}
		slices.Sort(got)
		name := strings.TrimPrefix(target, module+"/")
		want := wantDeps[name]
		for _, m := range got {
			if !slices.Contains(want, m) {
				t.Errorf("%s compiles in %s, which is not allowed (allowed: %v); if that is intended, add it to wantDeps", name, m, want)
			}
		}
		for _, m := range want {
			if !slices.Contains(got, m) {
				t.Errorf("%s no longer compiles in %s: remove it from wantDeps", name, m)
			}
		}
	}
}

// TestCoreCompilesInNoHTTP: the core (throttler, backend), the internal
// packages the stores share, and every store under backend/ compile in no
// HTTP code, not even the standard library's: HTTP lives in package
// httplimit, which a program imports only when it serves HTTP.
// backend/backendtest is left out: the conformance suite runs in tests, and
// testify's assert, which it uses, has HTTP helpers.
func TestCoreCompilesInNoHTTP(t *testing.T) {
	checked := 0
	for _, p := range goList(t, "-json=ImportPath,Deps", module+"/throttler", module+"/backend/...",
		module+"/internal/algo", module+"/internal/identity", module+"/internal/leaseset", module+"/internal/leaseop") {
		if p.ImportPath == module+"/backend/backendtest" {
			continue
		}
		checked++
		for _, d := range p.Deps {
			if d == "net/http" || strings.HasPrefix(d, "net/http/") {
				t.Errorf("%s compiles in %s: HTTP code belongs in httplimit", strings.TrimPrefix(p.ImportPath, module+"/"), d)
				break
			}
		}
	}
	if checked < 9 { // throttler, backend, its three stores and the four shared at least
		t.Errorf("checked %d packages; go list did not list the core and the stores", checked)
	}
}

// TestTestifyOnlyInTests: no package's non-test code imports testify, so
// no program compiles it in through this module, except
// backend/backendtest, the conformance suite a backend author runs from
// their own tests.
func TestTestifyOnlyInTests(t *testing.T) {
	pkgs := goList(t, "-json=ImportPath,Imports", "./...")
	if len(pkgs) < 10 {
		t.Fatalf("go list listed %d packages; want the whole module", len(pkgs))
	}
	for _, p := range pkgs {
		if p.ImportPath == module+"/backend/backendtest" {
			continue
		}
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, "github.com/stretchr/testify") {
				t.Errorf("%s imports %s outside its _test files", strings.TrimPrefix(p.ImportPath, module+"/"), imp)
			}
		}
	}
}

// TestTestingOnlyInTests: no package's non-test code imports package
// testing, so test support ships as test code, except backend/backendtest,
// the conformance suite a backend author runs from their own tests. A
// helper that stops a test takes the methods it calls (Helper, Fatalf), not
// testing.TB.
func TestTestingOnlyInTests(t *testing.T) {
	pkgs := goList(t, "-json=ImportPath,Imports", "./...")
	if len(pkgs) < 10 {
		t.Fatalf("go list listed %d packages; want the whole module", len(pkgs))
	}
	for _, p := range pkgs {
		if p.ImportPath == module+"/backend/backendtest" {
			continue
		}
		if slices.Contains(p.Imports, "testing") {
			t.Errorf("%s imports testing outside its _test files", strings.TrimPrefix(p.ImportPath, module+"/"))
		}
	}
}

// goList runs `go list` with args and returns the packages it describes.
func goList(t *testing.T, args ...string) []listed {
	t.Helper()
	args = append([]string{"list"}, args...)
	cmd := exec.Command("go", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	var pkgs []listed
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return pkgs
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
}
