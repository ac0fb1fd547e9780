package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestCompareDebVersions(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"6.12.118-1~deb12u1", "6.12.117-1~deb12u1", 1},
		{"6.12.9-1", "6.12.10-1", -1},
		{"6.1.192-3", "6.1.192-2", 1},
		{"6.12.118-1~deb12u1", "6.12.118-1", -1}, // '~' sorts before the end
		{"1:1.0", "2.0", 1},                      // the epoch first
		{"1.0a", "1.0", 1},
		{"1.0+b1", "1.0a", 1}, // non-letters after letters
		{"1.0-1", "1.0-1", 0},
		{"1.00", "1.0", 0},
	} {
		got := compareDebVersions(c.a, c.b)
		if (got > 0) != (c.want > 0) || (got < 0) != (c.want < 0) {
			t.Errorf("compareDebVersions(%q, %q) = %d, want the sign of %d", c.a, c.b, got, c.want)
		}
		if back := compareDebVersions(c.b, c.a); (back > 0) != (c.want < 0) || (back < 0) != (c.want > 0) {
			t.Errorf("compareDebVersions(%q, %q) = %d, not the opposite", c.b, c.a, back)
		}
	}
}

func TestKernelPackageRE(t *testing.T) {
	for name, want := range map[string]bool{
		"linux-image-6.1.0-57-cloud-amd64":                true,
		"linux-image-6.12.118+deb12-cloud-amd64":          true,
		"linux-image-6.12.12+bpo-cloud-amd64":             true,
		"linux-image-6.1.0-57-cloud-amd64-unsigned":       false,
		"linux-image-6.1.0-57-cloud-amd64-dbg":            false,
		"linux-image-6.12.118+deb12-amd64":                false,
		"linux-image-6.12-cloud-amd64":                    false, // the meta-package
		"linux-image-6.10.1-1-cloud-amd64":                false, // another series
		"linux-image-6.12.118+deb12-cloud-amd64-unsigned": false,
	} {
		series := "6.1"
		if strings.HasPrefix(name, "linux-image-6.12") || name == "linux-image-6.12-cloud-amd64" {
			series = "6.12"
		}
		if got := kernelPackageRE(series, "cloud-amd64").MatchString(name); got != want {
			t.Errorf("%s in series %s: %v, want %v", name, series, got, want)
		}
	}
}

func TestParsePolicyCandidates(t *testing.T) {
	out := `linux-image-6.12.117+deb12-cloud-amd64:
  Installed: (none)
  Candidate: 6.12.117-1~deb12u1
  Version table:
     6.12.117-1~deb12u1 500
        500 http://mirror/debian-security bookworm-security/main amd64 Packages
linux-image-6.12.118+deb12-cloud-amd64:
  Installed: (none)
  Candidate: 6.12.118-1~deb12u1
linux-image-6.12.1+deb12-cloud-amd64:
  Installed: (none)
  Candidate: (none)
`
	got := parsePolicyCandidates(out)
	want := map[string]string{"linux-image-6.12.117+deb12-cloud-amd64": "6.12.117-1~deb12u1", "linux-image-6.12.118+deb12-cloud-amd64": "6.12.118-1~deb12u1"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestAptSourceURIs(t *testing.T) {
	deb822 := "Types: deb\nURIs: http://a.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n" +
		"Types: deb\nURIs: http://a.example/debian-security\nSuites: bookworm-security\nComponents: main\n"
	if got := deb822URIs(deb822, "bookworm"); !slices.Equal(got, []string{"http://a.example/debian"}) {
		t.Errorf("deb822: %v", got)
	}
	oneLine := "deb http://b.example/debian bookworm main\n# deb http://c.example/debian bookworm main\n" +
		"deb [arch=amd64 signed-by=/k.gpg] http://d.example/debian bookworm main contrib\ndeb http://b.example/debian-security bookworm-security main\n"
	if got := oneLineURIs(oneLine, "bookworm"); !slices.Equal(got, []string{"http://b.example/debian", "http://d.example/debian"}) {
		t.Errorf("one-line: %v", got)
	}
}

// readCPIO is a minimal newc reader: each entry's name, mode, device and data.
type cpioEntry struct {
	name        string
	mode        uint32
	major, minr uint32
	data        []byte
}

func readCPIO(t *testing.T, b []byte) []cpioEntry {
	t.Helper()
	var out []cpioEntry
	align := func(n int) int { return (n + 3) &^ 3 }
	for off := 0; ; {
		h := string(b[off : off+110])
		if h[:6] != "070701" {
			t.Fatalf("bad magic at %d: %q", off, h[:6])
		}
		field := func(i int) uint32 {
			v, err := strconv.ParseUint(h[6+8*i:14+8*i], 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			return uint32(v)
		}
		mode, size, major, minr, namesize := field(1), int(field(6)), field(9), field(10), int(field(11))
		name := string(b[off+110 : off+110+namesize-1])
		data := align(off + 110 + namesize)
		if name == "TRAILER!!!" {
			return out
		}
		out = append(out, cpioEntry{name, mode, major, minr, b[data : data+size]})
		off = align(data + size)
	}
}

func TestCPIOWriter(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "tool")
	if err := os.WriteFile(src, []byte("#!ELF\x00odd"), 0o755); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	c := newCPIOWriter(&buf)
	steps := []error{
		c.Dir("dev"),
		c.CharDev("/dev/console", 0o600, 5, 1),
		c.File("/usr/sbin/tool", src),
		c.Bytes("sluice/plan.json", []byte("{}"), 0o644),
		c.Symlink("bin", "usr/sbin"),
		c.Close(),
	}
	for i, err := range steps {
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	if err := c.Bytes("sluice/plan.json", nil, 0o644); err == nil {
		t.Error("a path added twice was accepted")
	}
	var got []string
	for _, e := range readCPIO(t, buf.Bytes()) {
		got = append(got, fmt.Sprintf("%s %o %d:%d %q", e.name, e.mode, e.major, e.minr, e.data))
	}
	want := []string{
		`dev 40755 0:0 ""`,
		`dev/console 20600 5:1 ""`,
		`usr 40755 0:0 ""`,
		`usr/sbin 40755 0:0 ""`,
		`usr/sbin/tool 100755 0:0 "#!ELF\x00odd"`,
		`sluice 40755 0:0 ""`,
		`sluice/plan.json 100644 0:0 "{}"`,
		`bin 120777 0:0 "usr/sbin"`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("archive:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestParseGoTest(t *testing.T) {
	out := strings.Split(`=== RUN   TestA
--- PASS: TestA (0.01s)
=== RUN   TestB
    b_test.go:10: the verifier said no
=== RUN   TestB/sub
    --- FAIL: TestB/sub (0.00s)
--- FAIL: TestB (0.02s)
=== RUN   TestC
    c_test.go:5: needs Linux 6.6
--- SKIP: TestC (0.00s)
=== RUN   TestD
=== PAUSE TestD
=== CONT  TestD
    d_test.go:7: still here
panic: test timed out after 6m30s`, "\n")
	r := parseGoTest(out, true, 2, "exit status 2")
	var got []string
	for _, tt := range r.tests {
		got = append(got, tt.name+" "+tt.result)
	}
	if want := []string{"TestA pass", "TestB fail", "TestC skip", "TestD fail"}; !slices.Equal(got, want) {
		t.Errorf("tests %v, want %v", got, want)
	}
	if r.count("pass") != 1 || r.count("fail") != 2 || r.count("skip") != 1 {
		t.Errorf("counts %d/%d/%d", r.count("pass"), r.count("fail"), r.count("skip"))
	}
	if !strings.Contains(r.died, "TestD") {
		t.Errorf("died: %q, want it to name TestD", r.died)
	}
	if k := keyLines(r.tests[1].output, 8); len(k) == 0 || !strings.Contains(k[0], "the verifier said no") {
		t.Errorf("TestB's key lines: %q", k)
	}
	if s := skipReasons(r); !strings.Contains(s, "needs Linux 6.6") || !strings.Contains(s, "TestC") {
		t.Errorf("skip reasons: %q", s)
	}
	// A binary that ran to its end with a failing test did not die.
	clean := parseGoTest(out[:10], true, 1, "exit status 1")
	if clean.died != "" || clean.count("fail") != 1 {
		t.Errorf("clean run: died %q, %d failed", clean.died, clean.count("fail"))
	}
	// Cut short by the guest: every test begun without a verdict failed.
	cut := parseGoTest(out[:4], false, 0, "")
	if cut.count("fail") != 1 || !strings.Contains(cut.died, "guest ended") {
		t.Errorf("cut short: died %q, %d failed", cut.died, cut.count("fail"))
	}
}

func TestParseSmoke(t *testing.T) {
	lines := strings.Split(`==> starting one sluiced per node, inside its namespace
  [sluiced node-a] 01:48:06.195 ERR exiting error="the service stage needs Linux 6.6" node=node-a
  [sluiced node-b] 01:48:06.201 ERR exiting error="the service stage needs Linux 6.6" node=node-b
PASS: sluicectl apply -f testdata/sample
FAIL: sluiced on node-a is in sync and has programmed its kernel
FAIL: sluiced on node-b is in sync and has programmed its kernel

28 checks, 2 failed (21.2s)
sluice-lab smoke: the lab is not up (2 of 28 setup checks failed): the traffic checks were not run`, "\n")
	r := parseSmoke(lines, true, 1, "exit status 1")
	if r.passed != 1 || r.failed != 2 || len(r.failures) != 2 {
		t.Errorf("passed %d, failed %d: %q", r.passed, r.failed, r.failures)
	}
	if !strings.Contains(r.died, "not up") {
		t.Errorf("died %q, want why it stopped", r.died)
	}
	if len(r.agentErrors) != 1 || !strings.HasPrefix(r.agentErrors[0], "sluiced node-a: ERR exiting") {
		t.Errorf("agent errors %q, want node-a's once", r.agentErrors)
	}
	// Ran to its end with a failure: nothing more to say than the FAIL line.
	done := parseSmoke([]string{"PASS: a", "FAIL: b", "sluice-lab smoke: 1 of 2 checks failed"}, true, 1, "exit status 1")
	if done.died != "" {
		t.Errorf("died %q for a run that finished", done.died)
	}
	if cut := parseSmoke([]string{"PASS: a"}, false, 0, ""); cut.died == "" {
		t.Error("a run the guest cut short is not reported")
	}
}

func TestTranscript(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "t.jsonl")
	body := `{"t":"boot","uptime":2.5,"release":"6.12.1"}
{"t":"begin","step":"bpf","text":"bpf.test -test.v"}
{"t":"line","step":"bpf","text":"--- PASS: TestA (0.01s)"}
{"t":"end","step":"bpf","rc":1,"secs":3.5,"err":"exit status 1"}
garbage from a port that was reset
{"t":"begin","step":"smoke"}
`
	if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	ev := readTranscript(file, nil)
	if len(ev) != 5 {
		t.Fatalf("%d events, want 5", len(ev))
	}
	steps := stepsOf(ev)
	if b := steps["bpf"]; !b.ended || b.rc != 1 || len(b.lines) != 1 {
		t.Errorf("bpf step %+v", b)
	}
	if s := steps["smoke"]; !s.begun || s.ended {
		t.Errorf("smoke step %+v", s)
	}
	if got := lastStep(ev); got != "in step smoke" {
		t.Errorf("lastStep %q", got)
	}
	// No transcript file: the events the guest put on the console.
	console := []string{"noise", marker + ` event {"t":"boot","uptime":1}`, marker + " init: Linux"}
	if ev := readTranscript(filepath.Join(dir, "none"), console); len(ev) != 1 || ev[0].T != "boot" {
		t.Errorf("console fallback: %+v", ev)
	}
}

func TestModuleNames(t *testing.T) {
	for in, want := range map[string]string{
		"kernel/net/ipv6/ip6_udp_tunnel.ko.xz": "ip6_udp_tunnel",
		"kernel/net/8021q/8021q.ko":            "8021q",
		"/x/nf-conntrack.ko.zst":               "nf_conntrack",
	} {
		if got := moduleBase(in); got != want {
			t.Errorf("moduleBase(%q) = %q, want %q", in, got, want)
		}
	}
}

// fakeModule is the smallest ELF64 relocatable file with a .modinfo section holding info.
func fakeModule(info string) []byte {
	modinfo := []byte(info)
	shstrtab := []byte("\x00.modinfo\x00.shstrtab\x00")
	const ehsize, shentsize = 64, 64
	modOff := ehsize
	strOff := modOff + len(modinfo)
	shOff := (strOff + len(shstrtab) + 7) &^ 7
	var b bytes.Buffer
	le := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }
	b.Write([]byte{0x7f, 'E', 'L', 'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	le(uint16(1))  // ET_REL
	le(uint16(62)) // EM_X86_64
	le(uint32(1))
	le(uint64(0))      // entry
	le(uint64(0))      // phoff
	le(uint64(shOff))  // shoff
	le(uint32(0))      // flags
	le(uint16(ehsize)) // ehsize
	le(uint16(0))      // phentsize
	le(uint16(0))      // phnum
	le(uint16(shentsize))
	le(uint16(3)) // shnum
	le(uint16(2)) // shstrndx
	b.Write(modinfo)
	b.Write(shstrtab)
	b.Write(make([]byte, shOff-b.Len()))
	section := func(name, typ uint32, off, size int) {
		le(name)
		le(typ)
		le(uint64(0)) // flags
		le(uint64(0)) // addr
		le(uint64(off))
		le(uint64(size))
		le(uint32(0)) // link
		le(uint32(0)) // info
		le(uint64(1)) // addralign
		le(uint64(0)) // entsize
	}
	section(0, 0, 0, 0)
	section(1, 1, modOff, len(modinfo))   // .modinfo, PROGBITS
	section(10, 3, strOff, len(shstrtab)) // .shstrtab, STRTAB
	return b.Bytes()
}

func TestResolveModules(t *testing.T) {
	root := t.TempDir()
	k := &kernel{pkg: "linux-image-test", root: root, release: "6.99.0-test", config: "config-6.99.0-test"}
	dir := filepath.Join(root, "lib", "modules", k.release)
	mods := map[string]string{
		"kernel/drivers/net/vxlan/vxlan.ko":     "license=GPL\x00depends=udp_tunnel,ip6_udp_tunnel\x00",
		"kernel/net/ipv4/udp_tunnel.ko":         "depends=\x00",
		"kernel/net/ipv6/ip6_udp_tunnel.ko":     "depends=\x00",
		"kernel/drivers/net/veth.ko":            "license=GPL\x00",
		"kernel/net/netfilter/nft_masq.ko":      "depends=nf_tables,nf_nat\x00",
		"kernel/net/netfilter/nf_tables.ko":     "depends=nfnetlink\x00",
		"kernel/net/netfilter/nf_nat.ko":        "depends=nf_conntrack\x00",
		"kernel/net/netfilter/nf_conntrack.ko":  "depends=\x00",
		"kernel/net/netfilter/nfnetlink.ko":     "depends=\x00",
		"kernel/net/netfilter/nft_lonely.ko":    "depends=nf_missing\x00",
		"kernel/net/sched/sch_ingress.ko":       "depends=\x00",
		"kernel/net/sched/cls_bpf.ko":           "depends=\x00",
		"kernel/drivers/net/unrelated/other.ko": "depends=\x00",
	}
	for p, info := range mods {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, fakeModule(info), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "modules.builtin"), []byte("kernel/net/bridge/bridge.ko\nkernel/drivers/net/dummy.ko\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	order, builtin, err := resolveModules(k, []string{"vxlan", "veth", "nft_masq", "bridge", "nf-tables"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range order {
		names = append(names, m.name)
	}
	want := []string{"udp_tunnel", "ip6_udp_tunnel", "vxlan", "veth", "nfnetlink", "nf_tables", "nf_conntrack", "nf_nat", "nft_masq"}
	if !slices.Equal(names, want) {
		t.Errorf("load order %v, want %v", names, want)
	}
	if !slices.Equal(builtin, []string{"bridge"}) {
		t.Errorf("built in %v, want [bridge]", builtin)
	}
	if _, _, err := resolveModules(k, []string{"nft_lonely"}); err == nil || !strings.Contains(err.Error(), "nf_missing") {
		t.Errorf("a missing dependency: %v", err)
	}
	if _, _, err := resolveModules(k, []string{"wireguard"}); err == nil || !strings.Contains(err.Error(), "neither built in nor as a module") {
		t.Errorf("a missing module: %v", err)
	}
}

// fakeGuest is what the fake qemu does when it is not failing KVM: a guest that reaches init,
// runs the smoke step (its transcript on the second serial port), passes and powers off.
const fakeGuest = `printf '\033c` + marker + ` init: Linux 6.99.0-test, userspace after 0.4 s of guest time\n'
cat > "$transcript" <<'EOT'
{"t":"boot","uptime":0.4,"release":"6.99.0-test"}
{"t":"begin","step":"smoke","text":"sluice-lab smoke"}
{"t":"line","step":"smoke","text":"PASS: ping web-a to web-b"}
{"t":"line","step":"smoke","text":"sluice-lab smoke: 1 checks, 0 failed"}
{"t":"end","step":"smoke","secs":1.5}
EOT
printf '` + marker + ` done after 2.0 s of guest time\n'
`

// fakeQEMU puts a qemu-system-x86_64 first on PATH that runs underKVM (shell) when asked for
// KVM and otherwise acts as a guest that passes (fakeGuest); it returns the path the harness
// finds and a file listing the accelerator of each start.
func fakeQEMU(t *testing.T, underKVM string) (qemu, starts string) {
	t.Helper()
	dir := t.TempDir()
	starts = filepath.Join(dir, "starts")
	script := `#!/bin/sh
ulimit -c 0 # an abort leaves no core behind
accel=tcg
transcript=/dev/null
for a in "$@"; do
	case $a in
	-enable-kvm|kvm|kvm,*|*accel=kvm*) accel=kvm ;;
	file:*) transcript=${a#file:} ;;
	esac
done
echo $accel >> '` + starts + `'
if [ $accel = kvm ]; then
` + underKVM + `
fi
` + fakeGuest
	if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "qemu-system-x86_64"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", filepath.Join(dir, "bin")+string(os.PathListSeparator)+os.Getenv("PATH"))
	qemu, err := ensureQEMU(func(f string, a ...any) { t.Errorf("ensureQEMU: "+f, a...) })
	if err != nil || filepath.Dir(qemu) != filepath.Join(dir, "bin") {
		t.Fatalf("the harness found %q, %v: not the fake qemu", qemu, err)
	}
	return qemu, starts
}

// fakeKernelGuest is a guest ready to boot with the fake qemu: no kernel, an empty initramfs.
func fakeKernelGuest(t *testing.T, label string) *guest {
	t.Helper()
	dir := t.TempDir()
	initrd := filepath.Join(dir, "initrd.cpio")
	if err := os.WriteFile(initrd, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	k := &kernel{series: label, release: label + ".0-test", vmlinuz: filepath.Join(dir, "vmlinuz")}
	return &guest{r: &kernelResult{series: label, label: label, kernel: k}, k: k,
		p: plan{Release: k.release, Steps: []step{{Name: "smoke"}}}, dir: dir, initrd: initrd}
}

func readStarts(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(strings.Fields(string(b)), " ")
}

// TestKVMFallback: a KVM guest that does not reach init (qemu aborts, as nested KVM does on
// "failed to set MSR"; qemu exits because /dev/kvm, there, cannot run guests; the guest hangs)
// is booted again under TCG, and so is every guest after it, without trying KVM again; the
// report says why. Forced KVM does not fall back and says why it failed.
func TestKVMFallback(t *testing.T) {
	for _, c := range []struct {
		name, underKVM, why string
	}{
		{"abort", `echo 'qemu-system-x86_64: error: failed to set MSR 0x10a to 0x69' >&2
echo "qemu-system-x86_64: ../../target/i386/kvm/kvm.c:3183: kvm_buf_set_msrs: Assertion \` + "`" + `ret == cpu->kvm_msr_buf->nmsrs' failed." >&2
kill -ABRT $$`, "KVM guest did not reach init: qemu killed by signal aborted (qemu said: qemu-system-x86_64: error: failed to set MSR 0x10a to 0x69 | qemu-system-x86_64: ../../target/i386/kvm/kvm.c:3183: kvm_buf_set_msrs: Assertion"},
		{"exit", `echo 'qemu-system-x86_64: failed to initialize kvm: Operation not permitted' >&2
exit 1`, "KVM guest did not reach init: qemu exited with status 1 (qemu said: qemu-system-x86_64: failed to initialize kvm: Operation not permitted)"},
		{"early-poweroff", `printf 'SeaBIOS (version 1.16.2)\n'
exit 0`, "KVM guest did not reach init: qemu exited with status 0 (last console line: SeaBIOS (version 1.16.2))"},
		{"hang", `exec sleep 60`, "KVM guest did not reach init: no init on the console within the guest's limit of 2s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			qemu, starts := fakeQEMU(t, c.underKVM)
			logs := t.TempDir()
			o := options{accel: "auto", memoryMB: 64, cpus: 1, timeout: 2 * time.Second, smoke: true}
			ac := &accelChoice{v: "kvm"}
			first, second := fakeKernelGuest(t, "6.98"), fakeKernelGuest(t, "6.99")
			bootKernel(context.Background(), o, first, qemu, logs, ac)
			bootKernel(context.Background(), o, second, qemu, logs, ac)
			if got := readStarts(t, starts); got != "kvm tcg tcg" {
				t.Errorf("qemu started under %q, want KVM once, then TCG for both guests", got)
			}
			for _, r := range []*kernelResult{first.r, second.r} {
				if r.failed() || r.accel != "tcg" || r.smoke == nil || r.smoke.passed != 1 {
					t.Errorf("%s: accel %q, err %q, smoke %+v: want a pass under TCG", r.label, r.accel, r.err, r.smoke)
				}
			}
			var report bytes.Buffer
			summarize(&report, []*kernelResult{first.r, second.r}, time.Second)
			t.Logf("report:\n%s", report.String())
			wantFirst := "6.98.0-test:\n  note: TCG: " + c.why
			if !strings.Contains(report.String(), wantFirst) {
				t.Errorf("the report does not say why the first guest fell back: want %q", wantFirst)
			}
			wantSecond := "6.99.0-test:\n  note: TCG: KVM failed Linux 6.98's guest: " + c.why
			if !strings.Contains(report.String(), wantSecond) {
				t.Errorf("the report does not say why the second guest ran under TCG: want %q", wantSecond)
			}
			console, err := os.ReadFile(filepath.Join(logs, first.k.release+".console.log"))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(console), "--- "+c.why) || !strings.Contains(string(console), "falling back to TCG ---") {
				t.Errorf("the console log does not say why it fell back:\n%s", console)
			}

			// --accel kvm: no fallback; the failure says why.
			qemu, starts = fakeQEMU(t, c.underKVM)
			o.accel = "kvm"
			forced := fakeKernelGuest(t, "6.97")
			bootKernel(context.Background(), o, forced, qemu, logs, &accelChoice{v: "kvm"})
			if got := readStarts(t, starts); got != "kvm" {
				t.Errorf("--accel kvm: qemu started under %q, want KVM alone", got)
			}
			if want := "boot: " + c.why; !forced.r.failed() || !strings.HasPrefix(forced.r.err, want) {
				t.Errorf("--accel kvm: err %q, want it to start %q", forced.r.err, want)
			}
		})
	}
}

// TestKVMInterrupted: a KVM guest stopped by the user (Ctrl-C) before init is not booted
// again under TCG.
func TestKVMInterrupted(t *testing.T) {
	qemu, starts := fakeQEMU(t, `exec sleep 60`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(300*time.Millisecond, cancel)
	g := fakeKernelGuest(t, "6.99")
	ac := &accelChoice{v: "kvm"}
	bootKernel(ctx, options{accel: "auto", memoryMB: 64, cpus: 1, timeout: time.Minute, smoke: true}, g, qemu, t.TempDir(), ac)
	if got := readStarts(t, starts); got != "kvm" {
		t.Errorf("qemu started under %q, want KVM alone", got)
	}
	if g.r.err != "interrupted" || ac.v != "kvm" {
		t.Errorf("err %q, next accel %q: want interrupted, KVM kept", g.r.err, ac.v)
	}
}
