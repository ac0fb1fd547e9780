package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ensureQEMU returns qemu-system-x86_64, installing Debian's qemu-system-x86 when missing.
func ensureQEMU(say func(string, ...any)) (string, error) {
	if p, err := exec.LookPath("qemu-system-x86_64"); err == nil {
		return p, nil
	}
	if os.Geteuid() != 0 {
		return "", errors.New("qemu: qemu-system-x86_64 is missing; install qemu-system-x86 (as root: apt-get install qemu-system-x86)")
	}
	say("installing qemu-system-x86 (apt-get install)")
	install := []string{"apt-get", "install", "-y", "--no-install-recommends", "qemu-system-x86"}
	if _, err := apt(install...); err != nil {
		// Stale package lists are the usual reason: update once and try again.
		if _, uerr := apt("apt-get", "update"); uerr != nil {
			return "", fmt.Errorf("qemu: %w (and apt-get update: %v)", err, uerr)
		}
		if _, err := apt(install...); err != nil {
			return "", fmt.Errorf("qemu: %w", err)
		}
	}
	return exec.LookPath("qemu-system-x86_64")
}

// kvmUsable says whether /dev/kvm can be opened and answers KVM_GET_API_VERSION; if not, why.
// That it answers does not mean guests run: nested KVM can abort qemu before the kernel runs
// ("failed to set MSR 0x10a", an assertion, SIGABRT) or fail on the first instruction it must
// emulate. runGuest reports any KVM guest that does not reach init so the caller falls back to
// TCG.
func kvmUsable() (bool, string) {
	fd, err := unix.Open("/dev/kvm", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, err.Error()
	}
	defer unix.Close(fd)
	const kvmGetAPIVersion = 0xAE00
	v, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), kvmGetAPIVersion, 0)
	if errno != 0 {
		return false, "KVM_GET_API_VERSION: " + errno.Error()
	}
	if v != 12 {
		return false, fmt.Sprintf("KVM API version %d", v)
	}
	return true, ""
}

// guestBoot is one boot of one kernel.
type guestBoot struct {
	accel    string
	boot     time.Duration // from qemu's start to init's first line on the console
	guestUp  float64       // the guest's own uptime then
	total    time.Duration
	events   []guestEvent
	timedOut bool
	done     bool // the guest said it finished
	// poweroffHung: the guest finished but did not power off within poweroffLimit; qemu was
	// stopped (not a failure: the work was done).
	poweroffHung bool
	// kvmError says why KVM could not run the guest (it did not reach init, or qemu reported
	// a KVM failure): fall back to TCG.
	kvmError string
	err      string // how the boot failed, if it did
}

// bootOptions are the machine's settings.
type bootOptions struct {
	qemu     string
	memoryMB int
	cpus     int
	timeout  time.Duration // the whole guest, hard
	verbose  bool
	log      io.Writer // the raw console
	show     func(string)
}

// poweroffLimit is how long a guest that said it is done may take to power off.
const poweroffLimit = 20 * time.Second

// kvmBootLimit is how long a KVM guest may take to reach init before KVM is judged unusable.
const kvmBootLimit = 60 * time.Second

// runGuest boots the kernel with the initramfs and waits until it powers off, the timeout
// passes or parent ends; the console goes to opts.log, the transcript is read back from a
// file in dir. Under KVM, a guest that ends in any way (qemu aborted or exited, the boot limit
// or the timeout passed) before init's first line on the console, or of which qemu reports a
// KVM failure, has kvmError set, unless parent ended first (the user stopped the run).
func runGuest(parent context.Context, opts bootOptions, k *kernel, initrd, dir, accel string) *guestBoot {
	res := &guestBoot{accel: accel}
	resultsFile := filepath.Join(dir, "transcript-"+accel+".jsonl")
	_ = os.Remove(resultsFile)
	args := []string{
		"-nodefaults", "-nographic", "-no-reboot", "-monitor", "none",
		"-m", fmt.Sprint(opts.memoryMB), "-smp", fmt.Sprint(opts.cpus),
		"-kernel", k.vmlinuz, "-initrd", initrd,
		"-append", "console=ttyS0 rdinit=/init panic=-1 quiet",
		"-serial", "stdio", "-serial", "file:" + resultsFile,
	}
	if accel == "kvm" {
		args = append(args, "-accel", "kvm", "-cpu", "host")
	} else {
		// cx16=off: this qemu's TCG mishandles CMPXCHG16B, and 6.12's allocator panics on it.
		args = append(args, "-accel", "tcg,thread=multi", "-cpu", "max,cx16=off")
	}
	ctx, cancel := context.WithTimeout(parent, opts.timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, opts.qemu, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	// Pipes of our own, closed once Wait has copied everything qemu wrote.
	stdout, stdoutW := io.Pipe()
	cmd.Stdout = stdoutW
	var stderr bytes.Buffer
	stderrR, stderrW := io.Pipe()
	cmd.Stderr = stderrW
	fmt.Fprintf(opts.log, "$ %s %s\n", opts.qemu, strings.Join(args, " "))
	start := time.Now()
	if err := cmd.Start(); err != nil {
		stdoutW.Close()
		stderrW.Close()
		res.err = fmt.Sprintf("boot: starting %s: %v", opts.qemu, err)
		return res
	}
	var mu sync.Mutex
	// stopped says why the host killed qemu, when it did; kvmFault that it was for qemu's
	// report of a KVM failure.
	var stopped string
	var kvmFault bool
	kill := func(why string, kvm bool) {
		mu.Lock()
		defer mu.Unlock()
		if stopped == "" {
			stopped, kvmFault = why, kvm
		}
		_ = cmd.Process.Kill()
	}
	sawInit := make(chan struct{})
	exited := make(chan struct{})
	var doneOnce sync.Once
	var initOnce sync.Once
	var consoleLines []string
	readers := sync.WaitGroup{}
	readers.Add(2)
	go func() {
		defer readers.Done()
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			line := strings.TrimRight(sc.Text(), "\r")
			fmt.Fprintln(opts.log, line)
			if i := strings.Index(line, marker); i > 0 {
				line = line[i:] // the firmware's terminal escapes precede init's first line
			}
			mu.Lock()
			consoleLines = append(consoleLines, line)
			mu.Unlock()
			if strings.HasPrefix(line, marker+" init:") {
				initOnce.Do(func() {
					mu.Lock()
					res.boot = time.Since(start)
					mu.Unlock()
					close(sawInit)
				})
			}
			if strings.HasPrefix(line, marker+" done") {
				mu.Lock()
				res.done = true
				mu.Unlock()
				// The guest powers off next; one that cannot is stopped, its work being done.
				doneOnce.Do(func() {
					go func() {
						select {
						case <-exited:
						case <-time.After(poweroffLimit):
							mu.Lock()
							res.poweroffHung = true
							mu.Unlock()
							kill("the guest did not power off", false)
						}
					}()
				})
			}
			if opts.verbose || strings.HasPrefix(line, marker) || consoleWorthy(line) || panicLine(line) {
				opts.show(line)
			}
		}
	}()
	go func() {
		defer readers.Done()
		sc := bufio.NewScanner(stderrR)
		for sc.Scan() {
			line := sc.Text()
			mu.Lock()
			stderr.WriteString(line + "\n")
			mu.Unlock()
			fmt.Fprintln(opts.log, "qemu: "+line)
			if accel == "kvm" && (strings.Contains(line, "KVM internal error") || strings.Contains(line, "emulation failure")) {
				kill("qemu said: "+line, true)
			}
		}
	}()
	if accel == "kvm" {
		go func() {
			select {
			case <-sawInit:
			case <-time.After(kvmBootLimit):
				kill(fmt.Sprintf("no init on the console within %v", kvmBootLimit), false)
			case <-exited:
			case <-ctx.Done():
			}
		}()
	}
	werr := cmd.Wait()
	close(exited)
	stdoutW.Close()
	stderrW.Close()
	readers.Wait()
	res.total = time.Since(start)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		res.timedOut = true
	}
	res.events = readTranscript(resultsFile, consoleLines)
	for _, e := range res.events {
		if e.T == "boot" {
			res.guestUp = e.Uptime
		}
	}
	mu.Lock()
	why, fault := stopped, kvmFault
	mu.Unlock()
	if accel == "kvm" && parent.Err() == nil && (res.boot == 0 || fault) {
		switch {
		case why != "":
		case res.timedOut:
			why = fmt.Sprintf("no init on the console within the guest's limit of %v", opts.timeout)
		default:
			why = fmt.Sprintf("%s (%s)", qemuEnd(werr), bootClue(consoleLines, stderr.String()))
		}
		if res.boot == 0 {
			res.kvmError = "KVM guest did not reach init: " + why
		} else {
			res.kvmError = "KVM failed the guest after init: " + why
		}
	}
	switch {
	case res.kvmError != "":
		res.err = "boot: " + res.kvmError
	case res.timedOut:
		res.err = fmt.Sprintf("timeout: the guest did not finish within %v (%s)", opts.timeout, lastStep(res.events))
	case ctx.Err() != nil:
		res.err = "interrupted"
	case res.boot == 0:
		res.err = fmt.Sprintf("boot: the kernel never ran init (qemu: %v; %s)", werr, bootClue(consoleLines, stderr.String()))
	case !res.done:
		res.err = fmt.Sprintf("boot: the guest stopped before it finished (qemu: %v; %s)", werr, bootClue(consoleLines, stderr.String()))
	case werr != nil && !res.poweroffHung:
		res.err = fmt.Sprintf("qemu: %v: %s", werr, lastLines(stderr.String(), 3))
	}
	return res
}

// qemuEnd says how qemu ended, from what Wait returned.
func qemuEnd(err error) string {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return "qemu exited with status 0"
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "qemu killed by signal " + ws.Signal().String()
		}
		return fmt.Sprintf("qemu exited with status %d", ee.ExitCode())
	default:
		return "qemu: " + err.Error()
	}
}

// panicLine says whether a console line is the kernel dying, shown even when not verbose.
func panicLine(line string) bool {
	return strings.Contains(line, "Kernel panic") || strings.Contains(line, "BUG:") || strings.Contains(line, "Oops")
}

// bootClue is the most telling of what the console and qemu said before a failed boot.
func bootClue(console []string, stderr string) string {
	for _, l := range console {
		if panicLine(l) {
			return "console: " + strings.TrimSpace(l)
		}
	}
	if s := lastLines(stderr, 2); s != "" {
		return "qemu said: " + s
	}
	if len(console) > 0 {
		return "last console line: " + strings.TrimSpace(console[len(console)-1])
	}
	return "nothing on the console"
}

// lastStep says where the guest was: the step begun last and not ended, or the last event.
func lastStep(events []guestEvent) string {
	open := ""
	for _, e := range events {
		switch e.T {
		case "begin":
			open = e.Step
		case "end":
			open = ""
		}
	}
	if open != "" {
		return "in step " + open
	}
	if len(events) == 0 {
		return "before init started"
	}
	return "after " + events[len(events)-1].T
}

// readTranscript parses the transcript file; where it holds nothing (the second serial port
// failed), the events the guest put on the console instead.
func readTranscript(path string, console []string) []guestEvent {
	var events []guestEvent
	if b, err := os.ReadFile(path); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			var e guestEvent
			if json.Unmarshal([]byte(strings.TrimSpace(line)), &e) == nil && e.T != "" {
				events = append(events, e)
			}
		}
	}
	if len(events) > 0 {
		return events
	}
	for _, line := range console {
		if rest, ok := strings.CutPrefix(line, marker+" event "); ok {
			var e guestEvent
			if json.Unmarshal([]byte(rest), &e) == nil {
				events = append(events, e)
			}
		}
	}
	return events
}
