package dataplane

import (
	"cmp"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/sluice-net/sluice/internal/tracker"
)

// The route table's nexthop layout (RouteTableConfig.Nexthops): every route with a gateway
// goes through a kernel nexthop object, one per remote node and gateway, shared by all of
// that node's blocks.
//
// Why: the kernel hashes IPv4 route infos without their gateway, so 20,000 routes with
// 20,000 gateways on one device walk one long chain on every insert (BenchmarkDataplane in
// cmd/sluiced times `ip -batch` of such routes both ways). And a node's new tunnel address
// moves all of its routes in one write: the object keeps its ID and changes its gateway.
//
// Ownership rule: a nexthop object is sluice's when its protocol is sluice's route protocol.
// sluice creates objects only with NLM_F_EXCL (an ID another program took fails, and sluice
// picks another), replaces and deletes only its own, and deletes one only after no route of
// its needs it (the kernel deletes a nexthop's routes with it).
//
// Equal-cost multipath (a prefix BGP learned over several equal paths): the route goes
// through a group object whose members are the single objects of its gateways, shared with
// every other route through any of them. Members are written before their groups and deleted
// after them.
//
// IDs: sluice's objects take IDs protocol<<24 | n (n from 1), away from the low IDs that
// other daemons count up from. An ID is kept across restarts by adoption: a desired object
// takes the ID of a sluice object already holding the same gateway, device and flags, so a
// restart writes nothing.

// nexthopKey identifies a desired nexthop object: the node it leads to ("" when the route
// names none: then the gateway alone), the device and the gateway; or, for a group, the
// device and its gateways.
type nexthopKey struct {
	node   string
	link   int
	gw     netip.Addr
	onlink bool
	// gws lists a group's gateways, comma-separated, sorted ("": a single gateway).
	gws string
}

// nexthopValue is what sluice decides of a nexthop object: a gateway on a device, or a group.
type nexthopValue struct {
	gw     netip.Addr
	link   int
	onlink bool
	// group lists a group's member IDs, "/"-separated, sorted, as `ip nexthop` prints them.
	group string
}

// nexthop is the object of ID id with value v.
func (v nexthopValue) nexthop(id uint32, protocol int) Nexthop {
	n := Nexthop{ID: id, Gw: v.gw, Link: v.link, OnLink: v.onlink, Protocol: protocol}
	if v.group != "" {
		n = Nexthop{ID: id, Protocol: protocol, Group: groupIDs(v.group)}
	}
	return n
}

// groupString and groupIDs turn a group's member IDs into a nexthopValue's group and back.
func groupString(ids []uint32) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = strconv.FormatUint(uint64(id), 10)
	}
	return strings.Join(parts, "/")
}

func groupIDs(s string) []uint32 {
	var out []uint32
	for part := range strings.SplitSeq(s, "/") {
		if id, err := strconv.ParseUint(part, 10, 32); err == nil {
			out = append(out, uint32(id))
		}
	}
	return out
}

// nexthopRec is one desired nexthop object and how many desired routes (and groups) go
// through it.
type nexthopRec struct {
	key  nexthopKey
	id   uint32 // 0 until assigned
	refs int
	// members are a group's objects, one per gateway.
	members []*nexthopRec
}

// value is what the object must be: a group's names its members' IDs (assigned first).
func (rec *nexthopRec) value() nexthopValue {
	if rec.members == nil {
		return nexthopValue{gw: rec.key.gw, link: rec.key.link, onlink: rec.key.onlink}
	}
	ids := make([]uint32, len(rec.members))
	for i, m := range rec.members {
		ids[i] = m.id
	}
	slices.Sort(ids)
	return nexthopValue{group: groupString(ids)}
}

// groupKey is the key of the group of gateways gws (two or more) on link.
func groupKey(link int, onlink bool, gws []netip.Addr) nexthopKey {
	parts := make([]string, len(gws))
	for i, gw := range gws {
		parts[i] = gw.String()
	}
	return nexthopKey{link: link, onlink: onlink, gws: strings.Join(parts, ",")}
}

// nexthops is the route table's nexthop state.
type nexthops struct {
	tracker *tracker.Tracker[uint32, nexthopValue]
	byKey   map[nexthopKey]*nexthopRec
	// groups holds the desired group objects: their values follow their members' IDs.
	groups map[*nexthopRec]bool
	// needID holds objects wanted but without an ID; freed those no route needs any more,
	// whose IDs are given to a new object of the same node (a moved gateway) or deleted at
	// the next assign.
	needID, freed map[*nexthopRec]bool
	// foreign holds the IDs of other programs' objects, with their protocol, as of the last
	// read: never taken.
	foreign map[uint32]int
	// unclaimed maps the value of each of sluice's objects found in the kernel that no
	// desired object holds yet to its ID: adopted by the first desired object of that value.
	unclaimed map[nexthopValue]uint32
	// twins holds the further unclaimed objects of a value: a node's object and a group's
	// member through the same gateway are two objects of one value. The one a group names
	// is unclaimed's, and group members are assigned before node objects, so each takes its
	// own back.
	twins map[nexthopValue][]uint32
	base  uint32 // protocol<<24
	next  uint32 // the next n to try
}

func newNexthops(protocol int) *nexthops {
	return &nexthops{tracker: tracker.New[uint32, nexthopValue](func(a, b nexthopValue) bool { return a == b }),
		byKey: map[nexthopKey]*nexthopRec{}, groups: map[*nexthopRec]bool{}, needID: map[*nexthopRec]bool{},
		freed: map[*nexthopRec]bool{}, foreign: map[uint32]int{}, unclaimed: map[nexthopValue]uint32{}, twins: map[nexthopValue][]uint32{},
		base: uint32(protocol) << 24, next: 1}
}

// use returns the object of key nk for a route that went through cur (nil: none), counting
// the route on it; the caller releases cur when the two differ.
func (n *nexthops) use(cur *nexthopRec, nk nexthopKey) *nexthopRec {
	if cur != nil && cur.key == nk {
		return cur
	}
	rec := n.byKey[nk]
	if rec == nil {
		rec = &nexthopRec{key: nk}
		if nk.gws != "" {
			for gw := range strings.SplitSeq(nk.gws, ",") {
				m := n.use(nil, nexthopKey{link: nk.link, gw: netip.MustParseAddr(gw), onlink: nk.onlink})
				rec.members = append(rec.members, m)
			}
			n.groups[rec] = true
		}
		n.byKey[nk] = rec
		n.needID[rec] = true
	}
	rec.refs++
	delete(n.freed, rec) // wanted again before its ID was given away
	return rec
}

// release counts a route off rec (nil: none).
func (n *nexthops) release(rec *nexthopRec) {
	if rec == nil {
		return
	}
	if rec.refs--; rec.refs == 0 {
		n.freed[rec] = true
	}
}

// assign gives every object that needs one an ID (adopted, passed on from a freed object of
// the same node and device, or new) and drops the freed objects nobody took: their desired
// state goes, so the next write deletes them (after the routes moved off them).
func (n *nexthops) assign() {
	if len(n.needID) == 0 && len(n.freed) == 0 {
		return
	}
	// A group nobody needs lets go of its members first.
	var gone []*nexthopRec
	for rec := range n.freed {
		if rec.members != nil {
			gone = append(gone, rec)
		}
	}
	for _, rec := range gone {
		for _, m := range rec.members {
			n.release(m)
		}
		rec.members = nil
		delete(n.groups, rec)
	}
	type nodeLink struct {
		node string
		link int
		v6   bool
	}
	passable := map[nodeLink][]*nexthopRec{}
	for rec := range n.freed {
		if rec.id != 0 && rec.key.node != "" {
			nl := nodeLink{rec.key.node, rec.key.link, rec.key.gw.Is6()}
			passable[nl] = append(passable[nl], rec)
		}
	}
	need := make([]*nexthopRec, 0, len(n.needID))
	for rec := range n.needID {
		if rec.refs > 0 && rec.id == 0 {
			need = append(need, rec)
		}
	}
	// In a stable order, so the same state gets the same IDs; groups after every single
	// object, their members having IDs by then.
	slices.SortFunc(need, func(a, b *nexthopRec) int {
		return cmp.Or(cmp.Compare(a.key.gws, b.key.gws), cmp.Compare(a.key.node, b.key.node), a.key.gw.Compare(b.key.gw), cmp.Compare(a.key.link, b.key.link))
	})
	for _, rec := range need {
		v := rec.value()
		if id, ok := n.unclaimed[v]; ok {
			rec.id = id
			if more := n.twins[v]; len(more) > 0 {
				n.unclaimed[v] = more[0]
				if n.twins[v] = more[1:]; len(more) == 1 {
					delete(n.twins, v)
				}
			} else {
				delete(n.unclaimed, v)
			}
		} else if from := passable[nodeLink{rec.key.node, rec.key.link, rec.key.gw.Is6()}]; len(from) > 0 && rec.key.node != "" {
			rec.id, from[0].id = from[0].id, 0
			passable[nodeLink{rec.key.node, rec.key.link, rec.key.gw.Is6()}] = from[1:]
		} else {
			rec.id = n.newID()
		}
		n.tracker.SetDesired(rec.id, v)
	}
	n.needID = emptied(n.needID)
	// A member that got another ID (another program's object took its own) changes its
	// groups.
	for rec := range n.groups {
		if rec.id != 0 && rec.refs > 0 {
			n.tracker.SetDesired(rec.id, rec.value())
		}
	}
	if len(n.unclaimed) == 0 {
		n.unclaimed = map[nexthopValue]uint32{} // a restart adopted them all: give back the room
	}
	for rec := range n.freed {
		if rec.id != 0 {
			n.tracker.DeleteDesired(rec.id)
		}
		delete(n.byKey, rec.key)
	}
	n.freed = emptied(n.freed)
}

// newID returns an ID no object holds or is wanted at.
func (n *nexthops) newID() uint32 {
	for {
		id := n.base | n.next
		n.next = n.next%(1<<24-1) + 1
		_, wanted := n.tracker.Desired(id)
		if _, other := n.foreign[id]; wanted || other {
			continue
		}
		if _, held := n.tracker.Actual(id); held {
			continue
		}
		return id
	}
}

// replaceActual records a fresh read of the kernel's objects: sluice's by ID (protocol),
// the others' IDs as foreign. It returns whether a desired object's ID turned out to be
// another program's (it then gets a new ID, and every route must be resolved again).
func (n *nexthops) replaceActual(all []Nexthop, protocol int, conflict func(id uint32, protocol int)) bool {
	actual := make(map[uint32]nexthopValue, len(n.byKey))
	clear(n.foreign)
	n.unclaimed = emptied(n.unclaimed)
	clear(n.twins)
	inGroup := map[uint32]bool{}
	for _, nh := range all {
		if ownedNexthop(nh.Protocol, protocol) {
			for _, m := range nh.Group {
				inGroup[m] = true
			}
		}
	}
	for _, nh := range all {
		switch {
		case !ownedNexthop(nh.Protocol, protocol):
			n.foreign[nh.ID] = nh.Protocol
		case nh.Other:
			// One of sluice's IDs holding a kind sluice never makes: replaced or deleted like
			// any of its objects that differs.
			actual[nh.ID] = nexthopValue{}
		case nh.Group != nil:
			actual[nh.ID] = nexthopValue{group: groupString(nh.Group)}
		default:
			actual[nh.ID] = nexthopValue{gw: nh.Gw, link: nh.Link, onlink: nh.OnLink}
		}
	}
	n.tracker.ReplaceActual(actual)
	collided := false
	held := make(map[uint32]bool, len(n.byKey))
	for _, rec := range n.byKey {
		if rec.id == 0 {
			continue
		}
		if protocol, other := n.foreign[rec.id]; other {
			conflict(rec.id, protocol)
			n.tracker.DeleteDesired(rec.id)
			rec.id = 0
			n.needID[rec] = true
			collided = true
			continue
		}
		held[rec.id] = true
	}
	for id, v := range actual {
		if held[id] || (v.link == 0 && v.group == "") {
			continue
		}
		first, twin := n.unclaimed[v]
		switch {
		case !twin:
			n.unclaimed[v] = id
		case inGroup[id] && !inGroup[first] || inGroup[id] == inGroup[first] && id < first:
			n.unclaimed[v] = id
			n.twins[v] = append(n.twins[v], first)
		default:
			n.twins[v] = append(n.twins[v], id)
		}
	}
	for v, ids := range n.twins {
		slices.Sort(ids) // the same order whatever the map's
		n.twins[v] = ids
	}
	return collided
}
