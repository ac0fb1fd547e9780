package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// kernel is one Debian kernel package, unpacked in the cache.
type kernel struct {
	series  string // as asked: "6.1", "6.12"
	pkg     string // linux-image-6.12.118+deb12-cloud-amd64
	version string // the package's version: 6.12.118-1~deb12u1
	root    string // where the package is unpacked
	release string // the kernel's release (uname -r): 6.12.118+deb12-cloud-amd64
	vmlinuz string
	config  string
}

// kernelPackageRE matches the image packages of a series and flavour, signed ones only:
// linux-image-6.1.0-57-cloud-amd64 (Debian 12), linux-image-6.12.118+deb12-cloud-amd64 (its
// 6.12 updates), linux-image-6.12.12+bpo-cloud-amd64 (backports).
func kernelPackageRE(series, flavour string) *regexp.Regexp {
	return regexp.MustCompile(`^linux-image-` + regexp.QuoteMeta(series) + `\.[0-9]+(-[0-9]+|\+[a-z0-9]+)-` + regexp.QuoteMeta(flavour) + `$`)
}

// apt runs an apt command and returns its output, the command and its output in the error.
func apt(args ...string) (string, error) { return aptWith(nil, args...) }

// aptWith runs an apt command with env added (a private APT_CONFIG, say).
func aptWith(env []string, args ...string) (string, error) {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C"), env...)
	var out strings.Builder
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, lastLines(out.String(), 5))
	}
	return out.String(), nil
}

// newestKernel returns the newest package of the series that apt offers, with its version.
func newestKernel(env []string, series, flavour string) (pkg, version string, err error) {
	out, err := aptWith(env, "apt-cache", "pkgnames", "linux-image-"+series+".")
	if err != nil {
		return "", "", err
	}
	re := kernelPackageRE(series, flavour)
	var names []string
	for _, n := range strings.Fields(out) {
		if re.MatchString(n) {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return "", "", nil
	}
	sort.Strings(names)
	out, err = aptWith(env, append([]string{"apt-cache", "policy"}, names...)...)
	if err != nil {
		return "", "", err
	}
	for name, cand := range parsePolicyCandidates(out) {
		if pkg == "" || compareDebVersions(cand, version) > 0 {
			pkg, version = name, cand
		}
	}
	return pkg, version, nil
}

// parsePolicyCandidates reads `apt-cache policy A B ...`: each package's candidate version,
// packages without one left out.
func parsePolicyCandidates(out string) map[string]string {
	cands := map[string]string{}
	name := ""
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, " ") && strings.HasSuffix(line, ":") {
			name = strings.TrimSuffix(line, ":")
			continue
		}
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Candidate: "); ok && name != "" && v != "(none)" {
			cands[name] = v
		}
	}
	return cands
}

// backportsSource is the deb822 sources file the harness adds when apt offers no kernel of a
// series (Debian 12 has 6.12 in bookworm-backports; some mirrors also carry it as an update).
const backportsSource = "/etc/apt/sources.list.d/sluice-vmtest-backports.sources"

// addBackports writes a sources file for CODENAME-backports with the URIs of the system's
// existing Debian sources, and runs apt-get update. It says what it did.
func addBackports(say func(string, ...any)) error {
	codename := osReleaseField("VERSION_CODENAME")
	if codename == "" {
		return errors.New("cannot tell the Debian release (no VERSION_CODENAME in /etc/os-release)")
	}
	uris := debianURIs(codename)
	if len(uris) == 0 {
		return fmt.Errorf("no apt source for %s found to model %s-backports on", codename, codename)
	}
	body := fmt.Sprintf("# Added by sluice-vmtest (make test-kernels) for newer kernels.\nTypes: deb\nURIs: %s\nSuites: %s-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
		strings.Join(uris, " "), codename)
	if err := os.WriteFile(backportsSource, []byte(body), 0o644); err != nil {
		return fmt.Errorf("adding %s-backports to apt's sources: %w", codename, err)
	}
	say("added %s (%s-backports); running apt-get update", backportsSource, codename)
	_, err := apt("apt-get", "update")
	return err
}

func osReleaseField(key string) string {
	b, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+"="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// debianURIs returns the URIs of the apt sources that serve CODENAME itself (not -security),
// from deb822 files and one-line sources alike.
func debianURIs(codename string) []string {
	var uris []string
	seen := map[string]bool{}
	add := func(u string) {
		if !seen[u] {
			seen[u] = true
			uris = append(uris, u)
		}
	}
	files, _ := filepath.Glob("/etc/apt/sources.list.d/*.sources")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, u := range deb822URIs(string(b), codename) {
			add(u)
		}
	}
	lists, _ := filepath.Glob("/etc/apt/sources.list.d/*.list")
	for _, f := range append([]string{"/etc/apt/sources.list"}, lists...) {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, u := range oneLineURIs(string(b), codename) {
			add(u)
		}
	}
	return uris
}

// deb822URIs returns the URIs of the stanzas whose Suites include codename.
func deb822URIs(text, codename string) []string {
	var out []string
	for _, stanza := range strings.Split(text, "\n\n") {
		var uris, suites []string
		for _, line := range strings.Split(stanza, "\n") {
			if v, ok := strings.CutPrefix(line, "URIs:"); ok {
				uris = strings.Fields(v)
			}
			if v, ok := strings.CutPrefix(line, "Suites:"); ok {
				suites = strings.Fields(v)
			}
		}
		for _, s := range suites {
			if s == codename {
				out = append(out, uris...)
				break
			}
		}
	}
	return out
}

// oneLineURIs returns the URIs of "deb [opts] URI codename ..." lines.
func oneLineURIs(text, codename string) []string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") {
			for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
				f = f[1:]
			}
			if len(f) > 0 {
				f = f[1:]
			}
		}
		if len(f) >= 2 && f[1] == codename {
			out = append(out, f[0])
		}
	}
	return out
}

// suiteApt returns the environment that points apt at a private state under cache holding
// the Debian suite alone (bullseye, for Debian 11's 5.10), from the URIs of the system's own
// Debian sources: the system's sources and lists are not touched. It refreshes the suite's
// lists once a day.
func suiteApt(cache, suite string, say func(string, ...any)) ([]string, error) {
	uris := debianURIs(osReleaseField("VERSION_CODENAME"))
	if len(uris) == 0 {
		return nil, fmt.Errorf("no Debian apt source found to fetch %s from", suite)
	}
	dir := filepath.Join(cache, "apt", suite)
	for _, d := range []string{"lists/partial", "cache/archives/partial"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	var list strings.Builder
	for _, u := range uris {
		fmt.Fprintf(&list, "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s %s main\n", u, suite)
	}
	conf := fmt.Sprintf("Dir::Etc::SourceList %q;\nDir::Etc::SourceParts \"/dev/null\";\nDir::State::Lists %q;\nDir::Cache %q;\n",
		filepath.Join(dir, "sources.list"), filepath.Join(dir, "lists"), filepath.Join(dir, "cache"))
	if err := os.WriteFile(filepath.Join(dir, "sources.list"), []byte(list.String()), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "apt.conf"), []byte(conf), 0o644); err != nil {
		return nil, err
	}
	env := []string{"APT_CONFIG=" + filepath.Join(dir, "apt.conf")}
	stamp := filepath.Join(dir, "updated")
	if st, err := os.Stat(stamp); err != nil || time.Since(st.ModTime()) > 24*time.Hour {
		say("reading the %s suite's package lists (private to %s)", suite, dir)
		args := []string{"apt-get", "update"}
		if os.Geteuid() == 0 {
			args = append(args, "-o", "APT::Sandbox::User=root")
		}
		if _, err := aptWith(env, args...); err != nil {
			return nil, err
		}
		if err := os.WriteFile(stamp, nil, 0o644); err != nil {
			return nil, err
		}
	}
	return env, nil
}

// fetchKernel finds the newest kernel of the series, downloads it with apt-get download and
// unpacks it with dpkg-deb -x under cache (never installing it), unless it is there already.
//
// A series that names a package itself (linux-image-6.1.0-47-cloud-amd64) takes that one; one
// written SUITE/SERIES (bullseye/5.10) is looked for in that Debian suite alone (suiteApt).
func fetchKernel(cache, series, flavour string, say func(string, ...any)) (*kernel, error) {
	var env []string
	if suite, s, ok := strings.Cut(series, "/"); ok {
		var err error
		if env, err = suiteApt(cache, suite, say); err != nil {
			return nil, fmt.Errorf("download: %w", err)
		}
		series = s
	}
	pkg, version, err := newestKernel(env, series, flavour)
	if strings.HasPrefix(series, "linux-image-") {
		pkg, version, err = series, "", nil
		out, perr := aptWith(env, "apt-cache", "policy", pkg)
		if perr != nil {
			return nil, fmt.Errorf("download: looking up %s: %w", pkg, perr)
		}
		if version = parsePolicyCandidates(out)[pkg]; version == "" {
			return nil, fmt.Errorf("download: apt offers no package %s", pkg)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("download: looking up Linux %s: %w", series, err)
	}
	if pkg == "" && env != nil {
		return nil, fmt.Errorf("download: apt offers no linux-image-%s.*-%s package in that suite", series, flavour)
	}
	if pkg == "" {
		if _, statErr := os.Stat(backportsSource); statErr == nil {
			return nil, fmt.Errorf("download: apt offers no linux-image-%s.*-%s package, even with %s", series, flavour, backportsSource)
		}
		say("apt offers no Linux %s (%s) package; adding the backports suite", series, flavour)
		if err := addBackports(say); err != nil {
			return nil, fmt.Errorf("download: %w", err)
		}
		if pkg, version, err = newestKernel(env, series, flavour); err != nil {
			return nil, fmt.Errorf("download: looking up Linux %s: %w", series, err)
		}
		if pkg == "" {
			return nil, fmt.Errorf("download: apt offers no linux-image-%s.*-%s package, even with backports", series, flavour)
		}
	}
	k := &kernel{series: series, pkg: pkg, version: version,
		root: filepath.Join(cache, "kernels", pkg+"_"+strings.ReplaceAll(version, ":", "%3a"))}
	stamp := filepath.Join(k.root, ".unpacked")
	if _, err := os.Stat(stamp); err != nil {
		if err := os.RemoveAll(k.root); err != nil {
			return nil, fmt.Errorf("extract: %w", err)
		}
		debs := filepath.Join(cache, "debs")
		if err := os.MkdirAll(debs, 0o755); err != nil {
			return nil, fmt.Errorf("download: %w", err)
		}
		say("downloading %s %s", pkg, version)
		t0 := time.Now()
		args := []string{"apt-get", "download"}
		if os.Geteuid() == 0 {
			// apt drops to its _apt user for downloads, who cannot write to root's cache.
			args = append(args, "-o", "APT::Sandbox::User=root")
		}
		cmd := exec.Command(args[0], append(args[1:], pkg+"="+version)...)
		cmd.Dir = debs
		cmd.Env = append(append(os.Environ(), "LC_ALL=C"), env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("download: apt-get download %s=%s: %v: %s", pkg, version, err, lastLines(string(out), 5))
		}
		deb, err := findDeb(debs, pkg)
		if err != nil {
			return nil, fmt.Errorf("download: %w", err)
		}
		say("unpacking %s", filepath.Base(deb))
		if err := os.MkdirAll(k.root, 0o755); err != nil {
			return nil, fmt.Errorf("extract: %w", err)
		}
		if out, err := exec.Command("dpkg-deb", "-x", deb, k.root).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("extract: dpkg-deb -x %s: %v: %s", deb, err, lastLines(string(out), 5))
		}
		_ = os.Remove(deb) // the unpacked tree is what is kept
		say("downloaded and unpacked %s in %.1fs", pkg, time.Since(t0).Seconds())
		if err := os.WriteFile(stamp, []byte(pkg+" "+version+"\n"), 0o644); err != nil {
			return nil, fmt.Errorf("extract: %w", err)
		}
	}
	vmlinuz, _ := filepath.Glob(filepath.Join(k.root, "boot", "vmlinuz-*"))
	configs, _ := filepath.Glob(filepath.Join(k.root, "boot", "config-*"))
	if len(vmlinuz) != 1 || len(configs) != 1 {
		return nil, fmt.Errorf("extract: %s holds %d kernels and %d configs under boot/, want one each", pkg, len(vmlinuz), len(configs))
	}
	k.vmlinuz, k.config = vmlinuz[0], configs[0]
	k.release = strings.TrimPrefix(filepath.Base(k.vmlinuz), "vmlinuz-")
	if _, err := os.Stat(filepath.Join(k.root, "lib", "modules", k.release)); err != nil {
		return nil, fmt.Errorf("extract: %s has no modules for %s: %w", pkg, k.release, err)
	}
	return k, nil
}

// findDeb returns the downloaded .deb of pkg in dir.
func findDeb(dir, pkg string) (string, error) {
	debs, _ := filepath.Glob(filepath.Join(dir, pkg+"_*.deb"))
	if len(debs) == 0 {
		return "", fmt.Errorf("apt-get download left no %s_*.deb in %s", pkg, dir)
	}
	sort.Strings(debs)
	return debs[len(debs)-1], nil
}

// lastLines returns the last n non-empty lines of s on one line.
func lastLines(s string, n int) string {
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
