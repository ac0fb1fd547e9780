package main

import (
	"debug/elf"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// Where things are inside the guest.
const (
	guestBin      = "/sluice/bin"
	guestTestdata = "/sluice/testdata"
	guestPlan     = "/sluice/plan.json"
	guestModules  = "/sluice/modules"
	guestSrc      = "/sluice/src" // package directories: what tests read relative to their own (bpf/c/sluice.h)
	guestResults  = "/dev/ttyS1"  // the second serial port: the transcript the host reads
)

// plan is what the guest's init runs, written into the initramfs as JSON.
type plan struct {
	Release string   `json:"release"`
	Modules []string `json:"modules"` // paths in the guest, in load order
	Env     []string `json:"env"`     // added to every step's environment
	Steps   []step   `json:"steps"`
	Verbose bool     `json:"verbose"` // every step's output on the console too
	// Cgroup2 mounts the cgroup v2 hierarchy at /sys/fs/cgroup before the steps, as on a
	// node. Off by default: sluiced and the tests must cope without one.
	Cgroup2 bool `json:"cgroup2"`
}

// step is one command run in the guest; its output is its result (go test -v, or PASS/FAIL
// lines).
type step struct {
	Name    string   `json:"name"` // "bpf" or "smoke"
	Args    []string `json:"args"`
	Dir     string   `json:"dir"`
	Timeout string   `json:"timeout"` // a time.Duration
	// NotBefore holds the step until the guest's monotonic clock has run this many seconds:
	// tests that age an entry by subtracting its timeout from bpf_ktime_get_ns skip on a
	// machine younger than the timeout (TestProgSessionAffinity: 10 s).
	NotBefore float64 `json:"notBefore,omitempty"`
}

// payload is what goes into every guest, whatever its kernel.
type payload struct {
	self     string            // this binary: the guest's /init
	binaries map[string]string // name in guestBin -> host path (static Go binaries)
	testdata string            // the sample cluster's manifests
	bpfSrc   string            // the bpf package's directory: its files other than Go go in too
	commands []string          // host commands (dynamically linked) the lab runs: ip, sysctl
}

// requiredConfig are options the guest cannot do without: an initramfs, the console on the
// first serial port, devtmpfs, network namespaces and eBPF.
var requiredConfig = []string{"CONFIG_BLK_DEV_INITRD", "CONFIG_SERIAL_8250_CONSOLE", "CONFIG_DEVTMPFS",
	"CONFIG_NET_NS", "CONFIG_BPF_SYSCALL", "CONFIG_CGROUP_BPF"}

// checkStatic fails unless the file is a statically linked ELF executable.
func checkStatic(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked; build it with CGO_ENABLED=0 (make build does)", p)
		}
	}
	return nil
}

// sharedLibraries returns what ldd lists for a host executable (the dynamic loader too).
func sharedLibraries(exe string) ([]string, error) {
	out, err := exec.Command("ldd", exe).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "not a dynamic executable") {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %v: %s", exe, err, strings.TrimSpace(string(out)))
	}
	var libs []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			libs = append(libs, f[2])
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			libs = append(libs, f[0]) // the loader: /lib64/ld-linux-x86-64.so.2 (0x...)
		case len(f) >= 3 && f[1] == "=>" && f[2] == "not":
			return nil, fmt.Errorf("ldd %s: %s is not found", exe, f[0])
		}
	}
	return libs, nil
}

// buildInitramfs writes the guest's initramfs to dst: this binary as /init, sluice's
// binaries, the sample cluster, the host's ip and sysctl with their libraries, the kernel's
// modules (decompressed) and the plan.
func buildInitramfs(dst string, k *kernel, mods []module, pay payload, p plan) error {
	f, err := os.Create(dst)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	defer f.Close()
	c := newCPIOWriter(f)
	for _, d := range []string{"dev", "proc", "sys", "run", "tmp", "root", "etc", "usr/sbin"} {
		if err := c.Dir(d); err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
	}
	// The kernel opens /dev/console for init before anything is mounted.
	if err := c.CharDev("dev/console", 0o600, 5, 1); err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	etc := map[string]string{
		"etc/hosts":  "127.0.0.1 localhost\n::1 localhost\n",
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\n",
		"etc/group":  "root:x:0:\n",
	}
	for name, body := range etc {
		if err := c.Bytes(name, []byte(body), 0o644); err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
	}
	if err := c.File("init", pay.self); err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	for name, src := range pay.binaries {
		if err := c.File(path.Join(guestBin, name), src); err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
	}
	if pay.testdata != "" {
		entries, err := os.ReadDir(pay.testdata)
		if err != nil {
			return fmt.Errorf("initramfs: the sample cluster: %w", err)
		}
		for _, e := range entries {
			if e.Type().IsRegular() {
				if err := c.File(path.Join(guestTestdata, filepath.Base(pay.testdata), e.Name()), filepath.Join(pay.testdata, e.Name())); err != nil {
					return fmt.Errorf("initramfs: %w", err)
				}
			}
		}
	}
	if pay.bpfSrc != "" {
		if err := addPackageFiles(c, pay.bpfSrc, path.Join(guestSrc, "bpf")); err != nil {
			return fmt.Errorf("initramfs: the bpf package's files: %w", err)
		}
	}
	for _, name := range pay.commands {
		exe, err := exec.LookPath(name)
		if err != nil {
			return fmt.Errorf("initramfs: the lab needs %s on the host (iproute2, procps): %w", name, err)
		}
		libs, err := sharedLibraries(exe)
		if err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
		if err := c.File(path.Join("usr/sbin", name), exe); err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
		for _, lib := range libs {
			if c.Has(lib) {
				continue
			}
			if err := c.File(lib, lib); err != nil {
				return fmt.Errorf("initramfs: %w", err)
			}
		}
	}
	for _, m := range mods {
		data, err := readModule(m.path)
		if err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
		if err := c.Bytes(path.Join(guestModules, m.name+".ko"), data, 0o644); err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
		p.Modules = append(p.Modules, path.Join(guestModules, m.name+".ko"))
	}
	planJSON, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	if err := c.Bytes(guestPlan, planJSON, 0o644); err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	if err := c.Close(); err != nil {
		return fmt.Errorf("initramfs: writing %s: %w", dst, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("initramfs: writing %s: %w", dst, err)
	}
	return nil
}

// addPackageFiles adds the files of a package directory that are not Go source (C sources
// and headers, testdata), below it too, at dst.
func addPackageFiles(c *cpioWriter, src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() || strings.HasSuffix(p, ".go") {
			return nil
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		return c.File(path.Join(dst, filepath.ToSlash(rel)), p)
	})
}
