// Package integration runs throttlekit against real Redis, Memcached and
// Unleash servers started in containers by testcontainers-go. It is its own
// module so that testcontainers never enters users' go.sum.
package integration

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestMain keeps every test on loopback: without TESTCONTAINERS_HOST_OVERRIDE
// testcontainers dials the machine's default gateway to reach a local
// Docker's published ports.
func TestMain(m *testing.M) {
	if os.Getenv("TESTCONTAINERS_HOST_OVERRIDE") == "" && localDocker() {
		os.Setenv("TESTCONTAINERS_HOST_OVERRIDE", "127.0.0.1")
	}
	if os.Getenv("TESTCONTAINERS_RYUK_DISABLED") == "" {
		// Ryuk's image cannot be pulled here; every test terminates its own containers.
		os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	}
	fmt.Fprintf(os.Stderr, "integration: TESTCONTAINERS_HOST_OVERRIDE=%s\n", os.Getenv("TESTCONTAINERS_HOST_OVERRIDE"))
	os.Exit(m.Run())
}

// localDocker reports whether the Docker engine is reached through a local
// socket rather than over TCP to another host.
func localDocker() bool {
	h := os.Getenv("DOCKER_HOST")
	return h == "" || strings.HasPrefix(h, "unix://") || strings.HasPrefix(h, "npipe://")
}
