package benchmarks

import (
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// serve starts the server binary name on a free loopback port, with the
// flags that args gives for that port, and returns its address once ping
// answers there (within 5s); the server is killed when the benchmark ends.
// It skips the benchmark when name is not installed.
func serve(b *testing.B, name string, args func(port string) []string, ping func(addr string) error) string {
	b.Helper()
	bin, err := exec.LookPath(name)
	if err != nil {
		b.Skip(name + " not installed")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	_ = l.Close()
	cmd := exec.Command(bin, args(port)...)
	if err := cmd.Start(); err != nil {
		b.Fatalf("start %s: %v", name, err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := net.JoinHostPort("127.0.0.1", port)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if ping(addr) == nil {
			return addr
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s on %s not answering", name, addr)
		}
	}
}
