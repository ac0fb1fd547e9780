package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// defaultModules are what sluice, its tests and the lab need that a distribution kernel may
// build as modules: the guest has no modprobe, so the kernel's own requests for them
// (request_module on a link type, a qdisc, an nftables chain type or expression) would fail.
// Those built in are left out; dependencies come from each module's own .modinfo.
var defaultModules = []string{
	"veth", "vxlan", "bridge", "8021q", "bonding", "tun", "dummy", // links
	"sch_ingress", "cls_bpf", // clsact and tc's BPF classifier (the tc attach mode)
	"nf_tables", "nf_conntrack", "nf_nat", "nft_chain_nat", "nft_nat", "nft_masq", "nft_ct", // sluice's inet sluice-nat table
	"ip_vs", "ip_vs_rr", // kube-proxy's IPVS mode, planted by the leftover tests (rr: its scheduler)
	// Not xfrm_user: sluiced must start on a host without it (issue #24), and the guests
	// prove it (its tests' netlink handles open the route family alone, as the agent's do).
}

// module is one kernel module to load in the guest, in order.
type module struct {
	name string
	path string // in the unpacked package, compressed or not
}

// normModule is the module's name as the kernel knows it: '-' and '_' are the same.
func normModule(name string) string { return strings.ReplaceAll(name, "-", "_") }

// moduleBase strips the directory and the .ko[.xz|.zst|.gz] suffix.
func moduleBase(p string) string {
	b := filepath.Base(p)
	for _, ext := range []string{".xz", ".zst", ".gz"} {
		b = strings.TrimSuffix(b, ext)
	}
	return normModule(strings.TrimSuffix(b, ".ko"))
}

// resolveModules returns the modules to load for want, dependencies first, leaving out those
// the kernel has built in (modules.builtin); it fails naming any that is neither.
func resolveModules(k *kernel, want []string) ([]module, []string, error) {
	dir := filepath.Join(k.root, "lib", "modules", k.release)
	builtin := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(dir, "modules.builtin")); err == nil {
		for _, line := range strings.Fields(string(b)) {
			builtin[moduleBase(line)] = true
		}
	}
	files := map[string]string{}
	err := filepath.WalkDir(filepath.Join(dir, "kernel"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.Contains(d.Name(), ".ko") {
			files[moduleBase(p)] = p
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("initramfs: reading %s's modules: %w", k.pkg, err)
	}
	var order []module
	var inKernel []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(name, from string) error
	visit = func(name, from string) error {
		name = normModule(name)
		switch state[name] {
		case 1:
			return fmt.Errorf("initramfs: modules depend on each other in a cycle through %s", name)
		case 2:
			return nil
		}
		state[name] = 1
		if builtin[name] {
			state[name] = 2
			if from == "" {
				inKernel = append(inKernel, name)
			}
			return nil
		}
		p, ok := files[name]
		if !ok {
			if from != "" {
				return fmt.Errorf("initramfs: %s needs module %s, which %s lacks", from, name, k.pkg)
			}
			return fmt.Errorf("initramfs: %s has module %s neither built in nor as a module (see %s)", k.pkg, name, filepath.Base(k.config))
		}
		data, err := readModule(p)
		if err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
		deps, err := moduleDepends(data)
		if err != nil {
			return fmt.Errorf("initramfs: %s: %w", p, err)
		}
		for _, d := range deps {
			if err := visit(d, name); err != nil {
				return err
			}
		}
		state[name] = 2
		order = append(order, module{name: name, path: p})
		return nil
	}
	for _, w := range want {
		if err := visit(w, ""); err != nil {
			return nil, nil, err
		}
	}
	return order, inKernel, nil
}

// readModule returns a module's ELF image, decompressed (xz and zstd by their tools, which a
// Debian host has; gzip here).
func readModule(p string) ([]byte, error) {
	switch {
	case strings.HasSuffix(p, ".xz"):
		return decompressWith(p, "xz", "-dc")
	case strings.HasSuffix(p, ".zst"):
		return decompressWith(p, "zstd", "-dcq")
	case strings.HasSuffix(p, ".gz"):
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		return io.ReadAll(zr)
	default:
		return os.ReadFile(p)
	}
}

func decompressWith(p, tool string, args ...string) ([]byte, error) {
	var stderr bytes.Buffer
	cmd := exec.Command(tool, append(args, p)...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("decompressing %s with %s: %v: %s", p, tool, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// moduleDepends reads the "depends=" entry of a module's .modinfo section (written by
// modpost: the modules whose symbols it uses). Debian's packages ship no modules.dep (depmod
// makes it when the package is installed), so this is the list.
func moduleDepends(ko []byte) ([]string, error) {
	f, err := elf.NewFile(bytes.NewReader(ko))
	if err != nil {
		return nil, fmt.Errorf("not an ELF module: %w", err)
	}
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("no .modinfo section")
	}
	info, err := sec.Data()
	if err != nil {
		return nil, err
	}
	for _, kv := range bytes.Split(info, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			var deps []string
			for _, d := range strings.Split(string(v), ",") {
				if d != "" {
					deps = append(deps, d)
				}
			}
			return deps, nil
		}
	}
	return nil, nil
}

// kernelConfig reads CONFIG_ lines of a kernel's config file into a map (y, m, or a value).
func kernelConfig(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok && strings.HasPrefix(k, "CONFIG_") {
			out[k] = strings.Trim(v, `"`)
		}
	}
	return out, sc.Err()
}
