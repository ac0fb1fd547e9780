package bpf

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cloudflare/ipvs"
	"github.com/sluice-net/sluice/internal/nlutil"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The kinds of other software's programs found on a hook sluice holds (Conflict.Kind).
const (
	// KindXDP is an XDP program on an interface sluice hooks: it sees every arriving packet
	// before tc (Calico's and Cilium's node-port acceleration, DDoS filters).
	KindXDP = "xdp"
	// KindTCX is a TCX program on a hook sluice holds: breaking when it runs before sluice's
	// (or sluice is on the classic path, which runs after every TCX program), dormant after.
	KindTCX = "tcx"
	// KindTCFilter is a classic tc bpf filter on a hook sluice holds: dormant while sluice's
	// TCX program runs (its verdict ends the hook before the classic filters); on the classic
	// path, breaking when it precedes sluice's filter.
	KindTCFilter = "tc-filter"
)

// Owners recognised by their programs' names (Conflict.Owner).
const (
	OwnerCalico = "calico"
	OwnerCilium = "cilium"
)

// programOwner recognises another product by a program's name (the kernel keeps 15
// characters) or a classic filter's ("object.o:[section]"): Calico's programs are cali_* and
// calico_*, Cilium's cil_*, and its classic filters name its objects (bpf_lxc.o, bpf_host.o,
// bpf_netdev.o, bpf_overlay.o, bpf_xdp.o). "" when the name says nothing.
func programOwner(name string) string {
	n := strings.ToLower(name)
	switch {
	case strings.HasPrefix(n, "cali"):
		return OwnerCalico
	case strings.HasPrefix(n, "cil_"), strings.HasPrefix(n, "cilium"):
		return OwnerCilium
	}
	for _, obj := range []string{"bpf_lxc.o", "bpf_host.o", "bpf_netdev.o", "bpf_overlay.o", "bpf_xdp.o", "bpf_sock.o"} {
		if strings.HasPrefix(n, obj) {
			return OwnerCilium
		}
	}
	return ""
}

// hookBreaks says which of sluice's paths a program taking h's packets first breaks.
func hookBreaks(h Hook, wep bool) string {
	switch {
	case wep && h.Egress:
		return fmt.Sprintf("traffic to the workload on %s: replies of its service flows", h.Iface)
	case wep:
		return fmt.Sprintf("services (cluster IPs, node ports) reached from the workload on %s", h.Iface)
	case h.Egress:
		return fmt.Sprintf("replies leaving by %s: node-port flows answered through this node", h.Iface)
	default:
		return fmt.Sprintf("node ports, external and load-balancer addresses arriving on %s, and forwarded node-port flows", h.Iface)
	}
}

// dormantWhy is what a dormant program on h waits for.
func dormantWhy(h Hook) string {
	return fmt.Sprintf("dormant: acts only if sluice's program on %s goes (sluice's returns a verdict before it runs)", h)
}

// hookView is what classifying one hook's other programs needs: the hook, whether it is a
// workload's, how sluice holds it, the programs on it in the order they run, and the XDP
// program of its interface (ingress only).
type hookView struct {
	hook Hook
	wep  bool
	mode AttachMode // how sluice's program is attached here: tcx or tc
	tcx  []tcxProg  // in run order
	tc   []tcFilter // in run order
	xdp  *netlink.LinkXdp
	// ours tells sluice's programs: the agent by the IDs it loaded (no name read per program
	// and sync), sluicectl by their sl_* names.
	ours  func(id ebpf.ProgramID) bool
	owner func(id ebpf.ProgramID) string // a program's name, for its owner
}

type tcxProg struct {
	id     ebpf.ProgramID
	linkID link.ID // 0: attached without a link
}

// classify lists the other programs on v's hook, each breaking or dormant.
func (v hookView) classify() []Conflict {
	var out []Conflict
	h := v.hook
	breaks := hookBreaks(h, v.wep)
	if x := v.xdp; x != nil && x.Attached && !h.Egress {
		c := Conflict{Hook: h, Kind: KindXDP, Breaking: true, Breaks: breaks, xdpMode: x.AttachMode, progID: ebpf.ProgramID(x.ProgId)}
		name := v.owner(ebpf.ProgramID(x.ProgId))
		c.What = fmt.Sprintf("xdp program %d %s", x.ProgId, name)
		c.Owner = programOwner(name)
		c.Fix = fmt.Sprintf("ip link set dev %s %s off", h.Iface, xdpModeName(x.AttachMode))
		out = append(out, c)
	}
	// TCX: in run order; sluice's first program found splits before from after.
	oursAt := -1
	for i, p := range v.tcx {
		if v.ours(p.id) {
			oursAt = i
			break
		}
	}
	for i, p := range v.tcx {
		if v.ours(p.id) {
			continue
		}
		name := v.owner(p.id)
		c := Conflict{Hook: h, Kind: KindTCX, What: fmt.Sprintf("tcx program %d %s", p.id, name), Owner: programOwner(name), tcxLink: p.linkID}
		if v.mode == AttachTC || oursAt < 0 || i < oursAt {
			c.Breaking, c.Breaks = true, breaks
		} else {
			c.Breaks = dormantWhy(h)
		}
		if p.linkID != 0 {
			c.Fix = fmt.Sprintf("bpftool link detach id %d", p.linkID)
		} else {
			c.Fix = fmt.Sprintf("remove program %d with the software that attached it (it holds no link)", p.id)
		}
		out = append(out, c)
	}
	tcOursAt := -1
	for i, f := range v.tc {
		if f.ours() {
			tcOursAt = i
			break
		}
	}
	for i, f := range v.tc {
		if f.ours() {
			continue
		}
		c := Conflict{Hook: h, Kind: KindTCFilter, What: fmt.Sprintf("tc filter pref %d handle %#x bpf %s", f.Priority, f.Handle, f.Name),
			Owner: programOwner(f.Name), filter: f}
		if f.Name == "" || programOwner(f.Name) == "" {
			c.Owner = programOwner(v.owner(f.ProgID))
		}
		// On the TCX path sluice's verdict ends the hook before any classic filter; on the
		// classic path, filters before sluice's run first.
		if (v.mode == AttachTCX && oursAt >= 0) || (v.mode == AttachTC && tcOursAt >= 0 && i > tcOursAt) {
			c.Breaks = dormantWhy(h)
		} else {
			c.Breaking, c.Breaks = true, breaks
		}
		dir := "ingress"
		if h.Egress {
			dir = "egress"
		}
		c.Fix = fmt.Sprintf("tc filter del dev %s %s pref %d handle %#x bpf", h.Iface, dir, f.Priority, f.Handle)
		out = append(out, c)
	}
	return out
}

func xdpModeName(mode uint32) string {
	switch mode {
	case xdpAttachedSKB:
		return "xdpgeneric"
	case xdpAttachedHW:
		return "xdpoffload"
	case xdpAttachedDrv:
		return "xdpdrv"
	}
	return "xdp"
}

// The kernel's XDP attachment modes (IFLA_XDP_ATTACHED) and the flags that detach each.
const (
	xdpAttachedDrv = 1
	xdpAttachedSKB = 2
	xdpAttachedHW  = 3
)

func xdpFlags(mode uint32) int {
	switch mode {
	case xdpAttachedSKB:
		return unix.XDP_FLAGS_SKB_MODE
	case xdpAttachedDrv:
		return unix.XDP_FLAGS_DRV_MODE
	case xdpAttachedHW:
		return unix.XDP_FLAGS_HW_MODE
	}
	return 0
}

// Removable says whether --clean-conflicts removes c: only what breaks sluice's path and is
// recognisably another product's. Dormant programs and programs of unknown owners stay, with
// their fix reported.
func (c Conflict) Removable() bool { return c.Breaking && c.Owner != "" }

// remove takes c off its hook.
func (c *Conflict) remove() error {
	switch c.Kind {
	case KindXDP:
		l := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: c.Hook.Ifindex}}
		err := netlink.LinkSetXdpFdWithFlags(l, -1, xdpFlags(c.xdpMode))
		if err == nil {
			return nil
		}
		// Attached through a bpf link (newer Cilium): netlink may not detach it; the link may.
		if lerr := detachXDPLink(c.Hook.Ifindex, c.progID); lerr != nil {
			return fmt.Errorf("detaching the xdp program: %w; through its link: %w", err, lerr)
		}
		return nil
	case KindTCX:
		if c.tcxLink == 0 {
			return errors.New("attached without a link; remove it with the software that made it")
		}
		l, err := link.NewFromID(c.tcxLink)
		if err != nil {
			return err
		}
		defer l.Close()
		return l.Detach()
	case KindCgroup:
		cg, err := os.Open(c.Cgroup)
		if err != nil {
			return err
		}
		defer cg.Close()
		p, err := ebpf.NewProgramFromID(c.progID)
		if err != nil {
			return fmt.Errorf("opening program %d: %w", c.progID, err)
		}
		defer p.Close()
		if err := link.RawDetachProgram(link.RawDetachProgramOptions{Target: int(cg.Fd()), Program: p, Attach: c.cgroupAttach}); err != nil {
			return fmt.Errorf("detaching program %d: %w (attached through a link its owner holds?)", c.progID, err)
		}
		return nil
	case KindIPVS:
		if c.ipvsService != nil {
			client, err := ipvs.New()
			if err != nil {
				return fmt.Errorf("IPVS: %w", err)
			}
			defer closeIPVS(client)
			return client.RemoveService(*c.ipvsService)
		}
		l := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: c.Hook.Ifindex}}
		for _, a := range c.ipvsAddrs {
			if err := netlink.AddrDel(l, &a); err != nil {
				return fmt.Errorf("removing %s from kube-ipvs0: %w", a.IP, err)
			}
		}
		if rest, err := netlink.AddrList(l, netlink.FAMILY_ALL); err == nil && len(rest) == 0 {
			return netlink.LinkDel(l)
		}
		return nil
	case KindTCFilter:
		f := c.filter
		return netlink.FilterDel(&netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: c.Hook.Ifindex,
			Parent: tcParent(c.Hook.Egress), Handle: f.Handle, Priority: f.Priority, Protocol: unix.ETH_P_ALL}})
	}
	return fmt.Errorf("no way to remove a %s", c.Kind)
}

// sluiceByName tells sluice's programs by their sl_* names, as a reader without the agent's
// program IDs does (sluicectl).
func sluiceByName(name func(ebpf.ProgramID) string) func(ebpf.ProgramID) bool {
	return func(id ebpf.ProgramID) bool { return strings.HasPrefix(name(id), ProgramPrefix) }
}

// programNames returns programName remembering what it read: a node's hooks name the same
// programs many times.
func programNames() func(ebpf.ProgramID) string {
	names := map[ebpf.ProgramID]string{}
	return func(id ebpf.ProgramID) string {
		n, ok := names[id]
		if !ok {
			n = programName(id)
			names[id] = n
		}
		return n
	}
}

// programName returns the name of the program with id, "" when it cannot be read.
func programName(id ebpf.ProgramID) string {
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return ""
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		return ""
	}
	return info.Name
}

// tcxPrograms lists the TCX programs on h in run order (nil where the kernel has no TCX).
func tcxPrograms(h Hook) []tcxProg {
	attach := ebpf.AttachTCXIngress
	if h.Egress {
		attach = ebpf.AttachTCXEgress
	}
	res, err := link.QueryPrograms(link.QueryOptions{Target: h.Ifindex, Attach: attach})
	if err != nil {
		return nil
	}
	out := make([]tcxProg, 0, len(res.Programs))
	for _, p := range res.Programs {
		tp := tcxProg{id: p.ID}
		if id, ok := p.LinkID(); ok {
			tp.linkID = id
		}
		out = append(out, tp)
	}
	return out
}

// HookConflicts reads, in this network namespace, every hook that holds one of sluice's
// programs (named sl_*, through a TCX link or a classic filter) and classifies the other
// programs on it, as the agent does: what `sluicectl leftovers` shows on a node, without the
// agent. Nothing is removed.
func HookConflicts() ([]Conflict, error) {
	links, err := nlutil.DumpAgain(netlink.LinkList)
	if err != nil {
		return nil, fmt.Errorf("listing interfaces: %w", err)
	}
	filters, ferr := linkFilters(links)
	nameOf := programNames()
	ours := sluiceByName(nameOf)
	var out []Conflict
	for _, l := range links {
		for _, egress := range []bool{false, true} {
			h := Hook{Iface: l.Attrs().Name, Ifindex: l.Attrs().Index, Egress: egress}
			v := hookView{hook: h, tcx: tcxPrograms(h), tc: filters[h], xdp: l.Attrs().Xdp, ours: ours, owner: nameOf}
			sluices := ""
			for _, p := range v.tcx {
				if ours(p.id) {
					v.mode, sluices = AttachTCX, nameOf(p.id)
					break
				}
			}
			if v.mode == "" {
				for _, f := range v.tc {
					if f.ours() {
						v.mode, sluices = AttachTC, f.Name
						break
					}
				}
			}
			if v.mode == "" {
				continue // not a hook of sluice's
			}
			v.wep = strings.Contains(sluices, "wep")
			out = append(out, v.classify()...)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key() < out[j].Key() })
	return out, ferr
}

// KindCgroup is another program on a cgroup socket hook sluice uses (connect, sendmsg,
// recvmsg, getpeername): Calico's connect-time load balancer, Cilium's socket LB.
const KindCgroup = "cgroup"

// cgroupQuery is what BPF_PROG_QUERY says of one cgroup hook: the flags it was attached with
// (0: exclusive, BPF_F_ALLOW_OVERRIDE, BPF_F_ALLOW_MULTI) and its programs in run order.
// cilium/ebpf's QueryPrograms leaves the flags out, and they tell why sluice's attach fails.
func cgroupQuery(cgroupFD int, attach ebpf.AttachType) (flags uint32, ids []ebpf.ProgramID, err error) {
	buf := make([]uint32, 64)
	attr := struct {
		targetFD    uint32
		attachType  uint32
		queryFlags  uint32
		attachFlags uint32
		progIDs     uint64
		progCnt     uint32
		_           uint32
	}{targetFD: uint32(cgroupFD), attachType: uint32(attach), progIDs: uint64(uintptr(unsafe.Pointer(&buf[0]))), progCnt: uint32(len(buf))}
	_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_QUERY, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(buf)
	if errno != 0 {
		return 0, nil, errno
	}
	for _, id := range buf[:min(int(attr.progCnt), len(buf))] {
		ids = append(ids, ebpf.ProgramID(id))
	}
	return attr.attachFlags, ids, nil
}

// cgroupConflicts classifies the other programs on one cgroup hook: before sluice's (they
// run first, and a socket load balancer rewrites a service address before sluice's sees it)
// or holding the hook exclusively (sluice's cannot attach) they break the node's own
// connections to services; after sluice's they are dormant for services (they see backends).
func cgroupConflicts(cgroup, hook string, attach ebpf.AttachType, flags uint32, ids []ebpf.ProgramID, ours func(ebpf.ProgramID) bool, name func(ebpf.ProgramID) string) []Conflict {
	oursAt := slices.IndexFunc(ids, ours)
	var out []Conflict
	for i, id := range ids {
		if ours(id) {
			continue
		}
		n := name(id)
		if strings.HasPrefix(n, ProgramPrefix) {
			// Another sluice agent's (agents of several namespaces can share a cgroup: their
			// programs act on their own namespace's sockets only).
			continue
		}
		c := Conflict{Cgroup: cgroup, CgroupHook: hook, Kind: KindCgroup, What: fmt.Sprintf("%s program %d %s", hook, id, n), Owner: programOwner(n),
			progID: id, cgroupAttach: attach, Fix: fmt.Sprintf("bpftool cgroup detach %s %s id %d", cgroup, hook, id)}
		breaks := fmt.Sprintf("the node's own connections to services (cluster IPs, node ports) from processes under %s", cgroup)
		switch {
		case flags&unix.BPF_F_ALLOW_MULTI == 0:
			c.Breaking, c.Breaks = true, breaks+": it holds the hook alone (attached without BPF_F_ALLOW_MULTI), so sluice's program cannot attach"
		case oursAt < 0 || i < oursAt:
			c.Breaking, c.Breaks = true, breaks+": it runs before sluice's program, and may rewrite a service's address first"
		default:
			c.Breaks = fmt.Sprintf("dormant for services: it runs after sluice's program on %s and sees backends, not service addresses", hook)
		}
		out = append(out, c)
	}
	return out
}

// CgroupConflicts reads the socket hooks of the cgroup v2 directory path ("" for the
// hierarchy's root, as the agent defaults to) and classifies the programs on them other
// than sluice's (named sl_*), as the agent does; nothing is removed. A hook without a
// program of sluice's on it is read too: another program holding it alone is the reason.
func CgroupConflicts(path string) ([]Conflict, error) {
	if path == "" {
		root, err := CgroupV2Root()
		if err != nil {
			return nil, err
		}
		path = root
	}
	cg, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening the cgroup: %w", err)
	}
	defer cg.Close()
	nameOf := programNames()
	var out []Conflict
	var errs []error
	for _, hk := range socketHookTypes {
		flags, ids, err := cgroupQuery(int(cg.Fd()), hk.attach)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s on %s: %w", hk.name, path, err))
			continue
		}
		out = append(out, cgroupConflicts(path, hk.name, hk.attach, flags, ids, sluiceByName(nameOf), nameOf)...)
	}
	return out, errors.Join(errs...)
}

// KindPin is another product's pin directory on the bpffs sluice pins under: Calico's and
// Cilium's, and iproute2's tc/globals where both pinned maps. It acts on nothing by itself,
// but keeps their maps (and the programs holding them) alive after their agents stopped.
const KindPin = "pin"

// ForeignPins lists the pin directories of other products under the bpffs root (the
// directory holding sluice's pin directory): dormant, reported with the count of what they
// hold, never removed.
func ForeignPins(root string) []Conflict {
	var out []Conflict
	for _, d := range []struct{ dir, owner string }{{"calico", OwnerCalico}, {"cilium", OwnerCilium}, {"tc/globals", ""}} {
		path := filepath.Join(root, d.dir)
		entries, err := os.ReadDir(path)
		if err != nil || len(entries) == 0 {
			continue
		}
		owner := d.owner
		if owner == "" { // tc/globals: whose maps, their names tell (cali_*, cilium_*)
			for _, e := range entries {
				if o := programOwner(e.Name()); o != "" {
					owner = o
					break
				}
			}
		}
		out = append(out, Conflict{Kind: KindPin, Path: path, Owner: owner,
			What:   fmt.Sprintf("%d pinned objects (%s)", len(entries), pinSample(entries)),
			Breaks: "dormant: pinned maps and programs act on nothing by themselves; they keep another agent's state alive after it stopped",
			Fix:    fmt.Sprintf("rm -r %s (once nothing of that product runs)", path)})
	}
	return out
}

func pinSample(entries []os.DirEntry) string {
	var names []string
	for _, e := range entries[:min(3, len(entries))] {
		names = append(names, e.Name())
	}
	if len(entries) > 3 {
		names = append(names, "...")
	}
	return strings.Join(names, ", ")
}

// KindIPVS is kube-proxy's IPVS mode's state: its dummy device kube-ipvs0 holding service
// addresses as the node's own, and IPVS virtual services.
const KindIPVS = "ipvs"

// KubeIPVS reads kube-proxy's IPVS leftovers in this network namespace against sluice's
// frontend addresses: kube-ipvs0 holding some of them makes them the node's own addresses
// (the local stack, and IPVS, take the packets sluice's programs leave, and node ports answer
// on them); IPVS virtual services on them (netlink's IPVS family) take such packets to the endpoints
// kube-proxy last knew. Both breaking when they hold a frontend of sluice's; dormant otherwise.
//
// frontends is called only when there is something to judge (most nodes have neither): a
// cluster's frontend addresses are tens of thousands.
func KubeIPVS(frontendsOf func() map[netip.Addr]bool) []Conflict {
	var out []Conflict
	var frontends map[netip.Addr]bool
	l, err := netlink.LinkByName("kube-ipvs0")
	vss := ipvsServices()
	if err == nil || len(vss) > 0 {
		frontends = frontendsOf()
	}
	if err == nil {
		addrs, _ := netlink.AddrList(l, netlink.FAMILY_ALL)
		var ours []string
		var held []netlink.Addr
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP)
			if !ok {
				continue
			}
			ip = ip.Unmap()
			if frontends[ip] {
				ours = append(ours, ip.String())
				held = append(held, a)
			}
		}
		c := Conflict{Kind: KindIPVS, Hook: Hook{Iface: "kube-ipvs0", Ifindex: l.Attrs().Index}, Owner: "kube-proxy",
			What: fmt.Sprintf("device kube-ipvs0 holding %d addresses as the node's own (%d of them sluice's frontends: %s)", len(addrs), len(ours), abbreviateAddrs(ours)),
			Fix:  "ip addr del ADDRESS dev kube-ipvs0 for each of sluice's frontends listed; ip link del kube-ipvs0 when it holds none", ipvsAddrs: held}
		if len(ours) > 0 {
			c.Breaking = true
			c.Breaks = "services at " + abbreviateAddrs(ours) + ": the node takes them as its own addresses (the local stack and IPVS answer what sluice's programs leave; node ports answer on them)"
		} else {
			c.Breaks = "dormant: it holds none of sluice's frontends"
		}
		out = append(out, c)
	}
	for _, vs := range vss {
		addr := netip.AddrPortFrom(vs.Address.Unmap(), vs.Port)
		c := Conflict{Kind: KindIPVS, Hook: Hook{Iface: "ip_vs"}, Owner: "kube-proxy", What: "IPVS virtual service " + ipvsServiceName(vs),
			Fix: fmt.Sprintf("ipvsadm -D %s %s", ipvsadmFlag(vs.Protocol), addr), ipvsService: &vs}
		if frontends[addr.Addr()] {
			c.Breaking, c.Breaks = true, "the service at "+addr.String()+": IPVS takes what sluice's programs leave to the endpoints kube-proxy last knew"
		} else {
			c.Breaks = "dormant: not one of sluice's frontends"
		}
		out = append(out, c)
	}
	return out
}

func abbreviateAddrs(a []string) string {
	if len(a) == 0 {
		return "none"
	}
	if len(a) > 4 {
		return strings.Join(a[:4], ", ") + fmt.Sprintf(" and %d more", len(a)-4)
	}
	return strings.Join(a, ", ")
}

// ipvsServices lists the IPVS virtual services of this network namespace (netlink's IPVS
// family, as ipvsadm reads them); none when ip_vs is not loaded. Firewall-mark services (kube-proxy makes none) name no address and are left out.
func ipvsServices() []ipvs.Service {
	// Asked for while ip_vs is not loaded, the kernel would load it (generic netlink
	// requests a module for an unknown family): a node that never ran IPVS must not get it
	// from sluice's scan. ip_vs makes this file in every namespace once loaded.
	if _, err := os.Stat("/proc/thread-self/net/ip_vs"); err != nil {
		return nil
	}
	c, err := ipvs.New()
	if err != nil {
		return nil // no IPVS family: the module is not loaded, so nothing is there
	}
	defer closeIPVS(c)
	list, err := c.Services()
	if err != nil {
		return nil
	}
	out := make([]ipvs.Service, 0, len(list))
	for _, s := range list {
		if s.FWMark == 0 && s.Address.IsValid() {
			out = append(out, s.Service)
		}
	}
	return out
}

func closeIPVS(c ipvs.Client) {
	if cl, ok := c.(io.Closer); ok {
		cl.Close()
	}
}

// ipvsServiceName is how ipvsadm names a virtual service: "TCP 10.96.0.10:53".
func ipvsServiceName(s ipvs.Service) string {
	return s.Protocol.String() + " " + netip.AddrPortFrom(s.Address.Unmap(), s.Port).String()
}

// ipvsadmFlag is ipvsadm's flag for a service's protocol.
func ipvsadmFlag(p ipvs.Protocol) string {
	switch p {
	case ipvs.UDP:
		return "-u"
	case ipvs.SCTP:
		return "--sctp-service"
	}
	return "-t"
}

// PinnedFrontendAddrs returns the frontend addresses in the service maps pinned at t (what
// sluicectl reads on a node, without the agent).
func PinnedFrontendAddrs(t Tables) (map[netip.Addr]bool, error) {
	out := map[netip.Addr]bool{}
	fe, err := t.Frontends.Dump()
	if err != nil {
		return nil, err
	}
	for k := range fe {
		a, _, _ := v4{}.feView(k)
		out[a] = true
	}
	if t.V6.Frontends != nil {
		fe6, err := t.V6.Frontends.Dump()
		if err != nil {
			return nil, err
		}
		for k := range fe6 {
			a, _, _ := v6{}.feView(k)
			out[a] = true
		}
	}
	return out, nil
}

// detachXDPLink detaches the bpf link that holds program prog as XDP on ifindex.
func detachXDPLink(ifindex int, prog ebpf.ProgramID) error {
	var it link.Iterator
	defer it.Close()
	for it.Next() {
		info, err := it.Link.Info()
		if err != nil || info.Type != link.XDPType || info.Program != prog {
			continue
		}
		if x := info.XDP(); x == nil || int(x.Ifindex) != ifindex {
			continue
		}
		return it.Link.Detach()
	}
	if err := it.Err(); err != nil {
		return err
	}
	return errors.New("no bpf link holds it")
}
