package healthcheck

import (
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
)

// TestPortHolder: the process listening on a port is named by its PID and command; a port
// nobody listens on names nobody.
func TestPortHolder(t *testing.T) {
	if _, err := os.Stat("/proc/thread-self/net/tcp"); err != nil {
		t.Skipf("no /proc/thread-self/net/tcp: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	comm, _ := os.ReadFile("/proc/self/comm")
	want := fmt.Sprintf("process %d (%s)", os.Getpid(), strings.TrimSpace(string(comm)))
	if got := PortHolder(port); got != want {
		t.Errorf("PortHolder(%d) = %q, want %q", port, got, want)
	}
	ln.Close()
	if got := PortHolder(port); got != "" {
		t.Errorf("PortHolder(%d) after the listener closed = %q, want nobody", port, got)
	}
}
