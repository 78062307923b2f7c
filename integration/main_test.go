// Package integration runs throttlekit against real Redis, Memcached and
// Unleash servers started in containers by testcontainers-go. It is its own
// module so that testcontainers never enters users' go.sum.
package integration

import (
	"bytes"
	"fmt"
	stdlog "log"
	"os"
	"strings"
	"testing"

	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
)

// TestMain keeps every test on loopback: without TESTCONTAINERS_HOST_OVERRIDE
// testcontainers dials the machine's default gateway to reach a local
// Docker's published ports. testcontainers' own lines (a container's
// lifecycle, Docker's description) are shown only when a test fails: a
// container's go to its test's log (containerLogger), the rest to a buffer
// printed at the end of a failed run.
func TestMain(m *testing.M) {
	if os.Getenv("TESTCONTAINERS_HOST_OVERRIDE") == "" && localDocker() {
		os.Setenv("TESTCONTAINERS_HOST_OVERRIDE", "127.0.0.1")
	}
	if os.Getenv("TESTCONTAINERS_RYUK_DISABLED") == "" {
		// Ryuk's image cannot be pulled here; every test terminates its own containers.
		os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	}
	fmt.Fprintf(os.Stderr, "integration: TESTCONTAINERS_HOST_OVERRIDE=%s\n", os.Getenv("TESTCONTAINERS_HOST_OVERRIDE"))
	var unattributed bytes.Buffer
	tclog.SetDefault(stdlog.New(&unattributed, "testcontainers: ", stdlog.LstdFlags))
	code := m.Run()
	if code != 0 {
		os.Stderr.Write(unattributed.Bytes())
	}
	os.Exit(code)
}

// containerLogger sends a container's testcontainers lines to t's log,
// which the test output shows only when t fails (or under -v). It goes
// first among a Run's options, before any option that logs.
func containerLogger(t testing.TB) testcontainers.LoggerOption {
	return testcontainers.WithLogger(tclog.TestLogger(t))
}

// localDocker reports whether the Docker engine is reached through a local
// socket rather than over TCP to another host.
func localDocker() bool {
	h := os.Getenv("DOCKER_HOST")
	return h == "" || strings.HasPrefix(h, "unix://") || strings.HasPrefix(h, "npipe://")
}
