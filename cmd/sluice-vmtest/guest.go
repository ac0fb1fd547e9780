package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The guest side: this binary is the initramfs's /init. As PID 1 it mounts the pseudo file
// systems, starts itself again as "guest-run" (which does the work) and reaps every process
// until that one ends, then powers the machine off. PID 1 cannot die (the kernel panics), so
// the work is in a child that can fail as it likes.

// marker starts every line of the console the host looks for.
const marker = "@@sluice-vmtest"

// guestEvent is one line of the transcript the guest writes to its second serial port: the
// host reads it after the guest powers off (or is killed), so whatever happened before a hang
// is kept.
type guestEvent struct {
	T       string  `json:"t"` // boot, module, begin, line, end, done
	Step    string  `json:"step,omitempty"`
	Text    string  `json:"text,omitempty"`
	Module  string  `json:"module,omitempty"`
	RC      int     `json:"rc,omitempty"`
	Secs    float64 `json:"secs,omitempty"`
	Err     string  `json:"err,omitempty"`
	Uptime  float64 `json:"uptime,omitempty"`
	Release string  `json:"release,omitempty"`
}

func guestInit() {
	mounts := []struct {
		fstype, target, data string
		flags                uintptr
	}{
		{"proc", "/proc", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
		{"sysfs", "/sys", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
		{"devtmpfs", "/dev", "mode=0755", unix.MS_NOSUID},
		{"tmpfs", "/run", "mode=0755", unix.MS_NOSUID | unix.MS_NODEV},
		{"tmpfs", "/tmp", "mode=1777", unix.MS_NOSUID | unix.MS_NODEV},
	}
	// bpffs and cgroup2 are left out on purpose: sluiced and the tests mount what they need.
	for _, m := range mounts {
		_ = os.MkdirAll(m.target, 0o755)
		if err := unix.Mount(m.fstype, m.target, m.fstype, m.flags, m.data); err != nil {
			fmt.Printf("%s mount: %s on %s: %v\n", marker, m.fstype, m.target, err)
		}
	}
	status := "exit 0"
	child, err := os.StartProcess("/init", []string{"/init", "guest-run"}, &os.ProcAttr{
		Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, Files: []*os.File{os.Stdin, os.Stdout, os.Stderr}})
	if err != nil {
		status = err.Error()
	} else {
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, 0, nil)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				status = "wait: " + err.Error()
				break
			}
			if pid == child.Pid {
				switch {
				case ws.Exited():
					status = fmt.Sprintf("exit %d", ws.ExitStatus())
				case ws.Signaled():
					status = "killed by " + ws.Signal().String()
				}
				break
			}
		}
	}
	fmt.Printf("%s poweroff (guest-run: %s)\n", marker, status)
	_ = unix.Kill(-1, unix.SIGKILL)
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	select {} // PID 1 must not return
}

// transcript writes guest events, one JSON line each, to the second serial port (or, if it
// cannot be opened, to the console with the marker, where the host looks too).
type transcript struct {
	mu  sync.Mutex
	w   io.Writer
	enc *json.Encoder
}

func openTranscript() *transcript {
	f, err := os.OpenFile(guestResults, os.O_WRONLY|unix.O_NOCTTY, 0)
	if err == nil {
		// Raw: no "\n" to "\r\n", nothing else touched.
		if t, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS); err == nil {
			t.Oflag &^= unix.OPOST
			t.Lflag &^= unix.ECHO | unix.ICANON | unix.ISIG | unix.IEXTEN
			t.Cflag &^= unix.CRTSCTS
			_ = unix.IoctlSetTermios(int(f.Fd()), unix.TCSETS, t)
		}
		return &transcript{w: f, enc: json.NewEncoder(f)}
	}
	fmt.Printf("%s transcript: %s: %v (events go to the console)\n", marker, guestResults, err)
	return &transcript{}
}

func (t *transcript) emit(e guestEvent) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.enc != nil {
		_ = t.enc.Encode(e)
		return
	}
	b, _ := json.Marshal(e)
	fmt.Printf("%s event %s\n", marker, b)
}

func uptime() float64 {
	b, _ := os.ReadFile("/proc/uptime")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// guestRun does the guest's work: modules, lo, then each step of the plan.
func guestRun() error {
	tr := openTranscript()
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	release := unix.ByteSliceToString(uts.Release[:])
	up := uptime()
	fmt.Printf("%s init: Linux %s, userspace after %.1f s of guest time\n", marker, release, up)
	tr.emit(guestEvent{T: "boot", Uptime: up, Release: release})
	b, err := os.ReadFile(guestPlan)
	if err != nil {
		tr.emit(guestEvent{T: "done", Err: err.Error()})
		return err
	}
	var p plan
	if err := json.Unmarshal(b, &p); err != nil {
		tr.emit(guestEvent{T: "done", Err: err.Error()})
		return err
	}
	failed := 0
	for _, m := range p.Modules {
		err := loadModule(m)
		ev := guestEvent{T: "module", Module: strings.TrimSuffix(m[strings.LastIndexByte(m, '/')+1:], ".ko")}
		if err != nil {
			ev.Err = err.Error()
			failed++
			fmt.Printf("%s module %s: %v\n", marker, ev.Module, err)
		}
		tr.emit(ev)
	}
	fmt.Printf("%s modules: %d loaded, %d failed\n", marker, len(p.Modules)-failed, failed)
	if err := linkUp("lo"); err != nil {
		fmt.Printf("%s lo: %v\n", marker, err)
	}
	for _, d := range []string{"/run/netns", "/root"} {
		_ = os.MkdirAll(d, 0o755)
	}
	if p.Cgroup2 {
		if err := unix.Mount("cgroup2", "/sys/fs/cgroup", "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			fmt.Printf("%s cgroup2 on /sys/fs/cgroup: %v\n", marker, err)
		}
	}
	env := append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin:" + guestBin, "HOME=/root", "TMPDIR=/tmp", "TERM=dumb"}, p.Env...)
	for _, s := range p.Steps {
		runGuestStep(tr, s, env, p.Verbose)
	}
	tr.emit(guestEvent{T: "done", Uptime: uptime()})
	fmt.Printf("%s done after %.1f s of guest time\n", marker, uptime())
	return nil
}

func loadModule(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("finit_module: %w", err)
	}
	return nil
}

// linkUp sets an interface up (SIOCSIFFLAGS), as `ip link set NAME up` does.
func linkUp(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// consoleWorthy says whether a step's output line goes to the console when not verbose: the
// results (top-level go test verdicts, the lab's PASS/FAIL lines, the closing lines).
func consoleWorthy(line string) bool {
	for _, p := range []string{"--- ", "PASS: ", "FAIL: ", "FAIL", "ok ", "panic:", "==> ", "sluice-lab smoke:"} {
		if strings.HasPrefix(line, p) {
			return true
		}
	}
	return strings.Contains(line, " checks, ")
}

// runGuestStep runs one step in a process group of its own, its output scanned line by line
// into the transcript; at its timeout the whole group is killed.
func runGuestStep(tr *transcript, s step, env []string, verbose bool) {
	timeout, err := time.ParseDuration(s.Timeout)
	if err != nil || timeout <= 0 {
		timeout = 10 * time.Minute
	}
	if wait := s.NotBefore - uptime(); wait > 0 {
		fmt.Printf("%s %s waits %.0f s: it starts once the guest has run %.0f s\n", marker, s.Name, wait, s.NotBefore)
		time.Sleep(time.Duration(wait * float64(time.Second)))
	}
	fmt.Printf("%s begin %s: %s\n", marker, s.Name, strings.Join(s.Args, " "))
	tr.emit(guestEvent{T: "begin", Step: s.Name, Text: strings.Join(s.Args, " ")})
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.Args[0], s.Args[1:]...)
	cmd.Dir = s.Dir
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return unix.Kill(-cmd.Process.Pid, unix.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second // what the group started may hold the pipe
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			line := sc.Text()
			tr.emit(guestEvent{T: "line", Step: s.Name, Text: line})
			if verbose || consoleWorthy(line) {
				fmt.Println(line)
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	err = cmd.Run()
	pw.Close()
	<-scanned
	ev := guestEvent{T: "end", Step: s.Name, Secs: time.Since(start).Seconds()}
	if err != nil {
		ev.RC = -1
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() >= 0 {
			ev.RC = ee.ExitCode()
		}
		ev.Err = err.Error()
		if ctx.Err() != nil {
			ev.Err = fmt.Sprintf("timed out after %v in the guest (killed)", timeout)
		}
	}
	// Whatever the step left running (a lab that was killed) goes with its group.
	if cmd.Process != nil {
		_ = unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
	}
	tr.emit(ev)
	fmt.Printf("%s end %s: rc=%d after %.1f s %s\n", marker, s.Name, ev.RC, ev.Secs, ev.Err)
}
