package healthcheck

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// PortHolder names the process listening on TCP port in the calling thread's network
// namespace: "process 1234 (kube-proxy)", or "" when it cannot be told (no /proc, a socket of
// a process in another PID namespace). A leftover kube-proxy holding the proxy health port
// (10256) or a health-check node port is the usual case.
func PortHolder(port uint16) string {
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"} {
		for _, ino := range listeningInodes(f, port) {
			inodes[ino] = true
		}
	}
	if len(inodes) == 0 {
		return ""
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		fds, err := os.ReadDir(filepath.Join(p, "fd"))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			target, err := os.Readlink(filepath.Join(p, "fd", fd.Name()))
			if err != nil || !strings.HasPrefix(target, "socket:[") {
				continue
			}
			if inodes[strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]")] {
				comm, _ := os.ReadFile(filepath.Join(p, "comm"))
				return fmt.Sprintf("process %s (%s)", filepath.Base(p), strings.TrimSpace(string(comm)))
			}
		}
	}
	return ""
}

// listeningInodes returns the socket inodes of the listening sockets on port in one of
// /proc/net/tcp's files ("sl local_address rem_address st ... inode": addresses in hex with
// the port after the colon, state 0A for LISTEN).
func listeningInodes(file string, port uint16) []string {
	f, err := os.Open(file)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] != "0A" {
			continue
		}
		i := strings.LastIndexByte(fields[1], ':')
		p, err := strconv.ParseUint(fields[1][i+1:], 16, 16)
		if err == nil && uint16(p) == port {
			out = append(out, fields[9])
		}
	}
	return out
}
