// Package manifest turns the YAML or JSON documents an operator writes into the exact keys and
// values Calico's tools and sluice store in etcd, writes them with compare-and-swap
// transactions, and renders stored objects back as documents and tables. It is what
// `sluicectl apply`, `get` and `delete` stand on.
package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"

	"github.com/sluice-net/sluice/store"
	yaml "go.yaml.in/yaml/v3"
)

// Document is one object ready to write: its key and the value to store there.
type Document struct {
	Kind  store.Kind
	ID    string
	Key   string
	Value []byte
	// Source says where the document came from: "file.yaml, document 2 (line 14)".
	Source string
}

// Error is a problem with one document: where it is, and what is wrong.
type Error struct {
	Source string
	Field  string
	Reason string
	// path is the document path of an unknown field ("spec.ports[0].nme"), and Line the
	// line it is on in its file (0: not known).
	path string
	Line int
}

func (e *Error) Error() string {
	at := ""
	if e.Line > 0 {
		at = fmt.Sprintf(" (line %d)", e.Line)
	}
	if e.Field != "" {
		return fmt.Sprintf("%s: field %s%s: %s", e.Source, e.Field, at, e.Reason)
	}
	return fmt.Sprintf("%s: %s%s", e.Source, e.Reason, at)
}

// unknownField is a key of a document that is no field of its kind, spelled exactly.
type unknownField struct {
	path, msg string
}

func (e *unknownField) Error() string { return e.msg }

// asError is a decoding error as an Error, keeping an unknown field's path.
func asError(err error) *Error {
	e := &Error{Reason: err.Error()}
	var uf *unknownField
	if errors.As(err, &uf) {
		e.path = uf.path
	}
	return e
}

// lineOf finds the line of the key at path ("spec.ports[0].name") in a YAML document, or 0.
func lineOf(doc *yaml.Node, path string) int {
	n := doc
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	line := 0
	for _, seg := range strings.Split(path, ".") {
		name, idx, _ := strings.Cut(seg, "[")
		if n.Kind != yaml.MappingNode {
			return line
		}
		found := false
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == name {
				line, n, found = n.Content[i].Line, n.Content[i+1], true
				break
			}
		}
		if !found {
			return line
		}
		for idx != "" { // "0]" or "0][1]"
			var k int
			var rest string
			if _, err := fmt.Sscanf(idx, "%d]", &k); err != nil || n.Kind != yaml.SequenceNode || k >= len(n.Content) {
				return line
			}
			n, line = n.Content[k], n.Content[k].Line
			_, rest, _ = strings.Cut(idx, "]")
			idx = strings.TrimPrefix(rest, "[")
		}
	}
	return line
}

// Parse reads every document of a YAML or JSON stream (YAML "---" separators, a JSON object,
// or a "kind: List" with items) and validates each exactly as the intake would. name is used
// in errors. All documents are checked; the errors are joined.
func Parse(name string, r io.Reader) ([]Document, error) {
	dec := yaml.NewDecoder(r)
	var docs []Document
	var errs []error
	for n := 1; ; n++ {
		var node yaml.Node
		err := dec.Decode(&node)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			errs = append(errs, &Error{Source: fmt.Sprintf("%s, document %d", name, n), Reason: "not valid YAML or JSON: " + err.Error()})
			break // the decoder cannot resynchronise after a syntax error
		}
		src := fmt.Sprintf("%s, document %d (line %d)", name, n, node.Line)
		var generic any
		if err := node.Decode(&generic); err != nil {
			errs = append(errs, &Error{Source: src, Reason: err.Error()})
			continue
		}
		if generic == nil {
			continue // an empty document
		}
		m, ok := generic.(map[string]any)
		if !ok {
			errs = append(errs, &Error{Source: src, Reason: fmt.Sprintf("want a mapping with a kind, got %T", generic)})
			continue
		}
		if k, _ := m["kind"].(string); k == "List" {
			items, _ := m["items"].([]any)
			for i, it := range items {
				d, err := fromMap(fmt.Sprintf("%s item %d", src, i), it)
				if err != nil {
					errs = append(errs, err)
				} else {
					docs = append(docs, d)
				}
			}
			continue
		}
		d, err := fromMap(src, m)
		if err != nil {
			if e, ok := err.(*Error); ok && e.path != "" {
				e.Line = lineOf(&node, e.path) // point at the field, not only at the document
			}
			errs = append(errs, err)
			continue
		}
		docs = append(docs, d)
	}
	return docs, errors.Join(errs...)
}

// ParsePaths parses every file named: a directory means its .yaml, .yml and .json files in
// name order, "-" means stdin. Every file is parsed and checked; the errors are joined, so a
// caller can refuse to write anything unless all of it is valid.
func ParsePaths(paths []string, stdin io.Reader) ([]Document, error) {
	var files []string
	for _, p := range paths {
		if p == "-" {
			files = append(files, p)
			continue
		}
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			return nil, err
		}
		var inDir []string
		for _, e := range entries {
			switch strings.ToLower(filepath.Ext(e.Name())) {
			case ".yaml", ".yml", ".json":
				if !e.IsDir() {
					inDir = append(inDir, filepath.Join(p, e.Name()))
				}
			}
		}
		if len(inDir) == 0 {
			return nil, fmt.Errorf("directory %s has no .yaml, .yml or .json file", p)
		}
		sort.Strings(inDir)
		files = append(files, inDir...)
	}
	var docs []Document
	var errs []error
	for _, f := range files {
		var d []Document
		var err error
		if f == "-" {
			d, err = Parse("<stdin>", stdin)
		} else {
			var fh *os.File
			fh, err = os.Open(f)
			if err == nil {
				d, err = Parse(f, fh)
				fh.Close()
			}
		}
		docs = append(docs, d...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return docs, errors.Join(errs...)
}

// strictUnmarshal decodes JSON into v, refusing fields v does not have.
//
// Hazard: encoding/json matches names regardless of case, so DisallowUnknownFields alone
// lets "vxlanmode" through as vxlanMode; exactNames refuses it.
func strictUnmarshal(b []byte, v any) error {
	// Unknown fields are exactNames' to find, with their path (encoding/json's own check
	// names the key alone).
	d := json.NewDecoder(bytes.NewReader(b))
	if err := d.Decode(v); err != nil {
		return err
	}
	var generic any
	if err := json.Unmarshal(b, &generic); err != nil {
		return err
	}
	return exactNames(generic, reflect.TypeOf(v), "")
}

var jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()

// exactNames returns an error for the first key of doc (in key order) that is no field of t
// spelled exactly, naming its path.
func exactNames(doc any, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(jsonUnmarshaler) {
		return nil
	}
	join := func(k string) string {
		if path == "" {
			return k
		}
		return path + "." + k
	}
	switch doc := doc.(type) {
	case map[string]any:
		keys := make([]string, 0, len(doc))
		for k := range doc {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		switch t.Kind() {
		case reflect.Struct:
			fields := map[string]reflect.Type{}
			jsonFields(t, fields)
			for _, k := range keys {
				ft, ok := fields[k]
				if !ok {
					if name := nearest(k, fields); name != "" {
						return &unknownField{join(k), fmt.Sprintf("unknown field %q (did you mean %q?)", join(k), name)}
					}
					return &unknownField{join(k), fmt.Sprintf("unknown field %q", join(k))}
				}
				if err := exactNames(doc[k], ft, join(k)); err != nil {
					return err
				}
			}
		case reflect.Map:
			for _, k := range keys {
				if err := exactNames(doc[k], t.Elem(), join(k)); err != nil {
					return err
				}
			}
		}
	case []any:
		if t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
			for i, e := range doc {
				if err := exactNames(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// nearest is the field name k was most likely meant to be, or "" when none is close: the
// same name in another case ("vxlanmode"), else the one fewest edits away ("ipFamilyPolicyy",
// "prot"), at most one edit for names of up to five letters and two for longer ones. Ties go
// to the first name in order, so the hint is the same on every run.
func nearest(k string, fields map[string]reflect.Type) string {
	limit := 1
	if len(k) > 5 {
		limit = 2
	}
	best, bestDist := "", limit+1
	for name := range fields {
		d := editDistance(strings.ToLower(k), strings.ToLower(name))
		if d < bestDist || (d == bestDist && name < best) {
			best, bestDist = name, d
		}
	}
	return best
}

// editDistance counts the insertions, deletions, substitutions and swaps of neighbouring
// letters that turn a into b (optimal string alignment distance).
func editDistance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// jsonFields adds the JSON names of t's fields, with those of embedded structs, to fields.
func jsonFields(t reflect.Type, fields map[string]reflect.Type) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if tag == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				jsonFields(ft, fields)
				continue
			}
		}
		if name == "" {
			name = f.Name
		}
		fields[name] = f.Type
	}
}

func fromMap(src string, generic any) (Document, error) {
	m, ok := generic.(map[string]any)
	if !ok {
		return Document{}, &Error{Source: src, Reason: fmt.Sprintf("want a mapping with a kind, got %T", generic)}
	}
	kindName, _ := m["kind"].(string)
	if kindName == "" {
		return Document{}, &Error{Source: src, Field: "kind", Reason: "missing"}
	}
	kind, err := store.KindNamed(kindName)
	if err != nil {
		return Document{}, &Error{Source: src, Field: "kind", Reason: err.Error()}
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return Document{}, &Error{Source: src, Reason: "cannot be expressed as JSON: " + err.Error()}
	}
	key, value, err := build(kind, raw)
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			e.Source = src
			return Document{}, e
		}
		var uf *unknownField
		if errors.As(err, &uf) {
			return Document{}, &Error{Source: src, Reason: err.Error(), path: uf.path}
		}
		return Document{}, &Error{Source: src, Reason: err.Error()}
	}
	if _, err := store.Decode(key, value); err != nil {
		var bv *store.BadValueError
		if errors.As(err, &bv) {
			return Document{}, &Error{Source: src, Field: bv.Field, Reason: bv.Reason}
		}
		return Document{}, &Error{Source: src, Reason: err.Error()}
	}
	_, id, _ := store.ParseKey(key)
	return Document{Kind: kind, ID: id, Key: key, Value: value, Source: src}, nil
}

// blockDoc is the document form of an IPAM block: calico-ipam's value plus a kind.
type blockDoc struct {
	store.TypeMeta
	store.AllocationBlock
}

// affinityDoc is the document form of a block affinity: the key's parts plus the value.
type affinityDoc struct {
	store.TypeMeta
	Node string `json:"node"`
	CIDR string `json:"cidr"`
	store.BlockAffinityValue
}

func need(field, v string) error {
	if v == "" {
		return &Error{Field: field, Reason: "missing"}
	}
	return nil
}

func nameCheck(field, v string) error {
	if err := need(field, v); err != nil {
		return err
	}
	if strings.ContainsAny(v, "/ \t\n") {
		return &Error{Field: field, Reason: fmt.Sprintf("%q may not contain '/' or spaces", v)}
	}
	return nil
}

// resource builds the key and value of a Kubernetes-shaped resource: it decodes strictly,
// checks the name (and the namespace, "default" when absent, for namespaced kinds), and stamps
// the kind and apiVersion as calicoctl and kubectl store them.
func resource[T any](raw []byte, r *T, meta func(*T) (*store.TypeMeta, *store.ObjectMeta), kind, apiVersion string, namespaced bool, prefix string) (string, []byte, error) {
	if err := strictUnmarshal(raw, r); err != nil {
		return "", nil, asError(err)
	}
	tm, m := meta(r)
	if err := nameCheck("metadata.name", m.Name); err != nil {
		return "", nil, err
	}
	id := m.Name
	if namespaced {
		if m.Namespace == "" {
			m.Namespace = "default"
		}
		if err := nameCheck("metadata.namespace", m.Namespace); err != nil {
			return "", nil, err
		}
		id = m.Namespace + "/" + m.Name
	} else {
		m.Namespace = ""
	}
	*tm = store.TypeMeta{Kind: kind, APIVersion: apiVersion}
	dropBookkeeping(m)
	v, err := json.Marshal(r)
	return prefix + id, v, err
}

// dropBookkeeping clears the metadata an apiserver keeps about its own copy of an object,
// which a `kubectl get -o yaml` or `calicoctl get -o yaml` prints: its revision, generation,
// field managers, self link and pending deletion. They describe another store's copy (the
// apiserver does not store resourceVersion either: it is etcd's revision), and their
// timestamps would turn every re-applied dump into an update. uid and creationTimestamp are
// replaced when written (Apply).
func dropBookkeeping(m *store.ObjectMeta) {
	m.ResourceVersion, m.Generation, m.ManagedFields, m.SelfLink = "", 0, nil, ""
	m.DeletionTimestamp, m.DeletionGracePeriodSeconds = "", nil
}

// build turns a document's JSON into the key and value to store.
func build(kind store.Kind, raw []byte) (string, []byte, error) {
	switch kind {
	case store.KindIPPool:
		return resource(raw, &store.IPPoolResource{}, func(r *store.IPPoolResource) (*store.TypeMeta, *store.ObjectMeta) { return &r.TypeMeta, &r.Metadata },
			"IPPool", store.CalicoAPIVersion, false, store.IPPoolPrefix)
	case store.KindNode:
		return resource(raw, &store.NodeResource{}, func(r *store.NodeResource) (*store.TypeMeta, *store.ObjectMeta) { return &r.TypeMeta, &r.Metadata },
			"Node", store.CalicoAPIVersion, false, store.NodePrefix)
	case store.KindWorkloadEndpoint:
		return resource(raw, &store.WorkloadEndpointResource{}, func(r *store.WorkloadEndpointResource) (*store.TypeMeta, *store.ObjectMeta) {
			return &r.TypeMeta, &r.Metadata
		},
			"WorkloadEndpoint", store.CalicoAPIVersion, true, store.WorkloadEndpointPrefix)
	case store.KindService:
		return resource(raw, &store.ServiceResource{}, func(r *store.ServiceResource) (*store.TypeMeta, *store.ObjectMeta) { return &r.TypeMeta, &r.Metadata },
			"Service", store.ServiceAPIVersion, true, store.ServicePrefix)
	case store.KindEndpointSlice:
		return resource(raw, &store.EndpointSliceResource{}, func(r *store.EndpointSliceResource) (*store.TypeMeta, *store.ObjectMeta) {
			return &r.TypeMeta, &r.Metadata
		},
			"EndpointSlice", store.EndpointSliceAPIVersion, true, store.EndpointSlicePrefix)
	case store.KindBGPConfiguration:
		return resource(raw, &store.BGPConfigurationResource{}, func(r *store.BGPConfigurationResource) (*store.TypeMeta, *store.ObjectMeta) {
			return &r.TypeMeta, &r.Metadata
		},
			"BGPConfiguration", store.CalicoAPIVersion, false, store.BGPConfigPrefix)
	case store.KindBGPPeer:
		return resource(raw, &store.BGPPeerResource{}, func(r *store.BGPPeerResource) (*store.TypeMeta, *store.ObjectMeta) { return &r.TypeMeta, &r.Metadata },
			"BGPPeer", store.CalicoAPIVersion, false, store.BGPPeerPrefix)
	case store.KindBlock:
		var d blockDoc
		if err := strictUnmarshal(raw, &d); err != nil {
			return "", nil, asError(err)
		}
		b := d.AllocationBlock
		cidr, err := netip.ParsePrefix(b.CIDR)
		if err != nil || cidr.Masked() != cidr {
			return "", nil, &Error{Field: "cidr", Reason: fmt.Sprintf("%q is not a network CIDR", b.CIDR)}
		}
		if hb := cidr.Addr().BitLen() - cidr.Bits(); hb > 12 {
			return "", nil, &Error{Field: "cidr", Reason: fmt.Sprintf("/%d is larger than any IPAM block (at most 4096 addresses)", cidr.Bits())}
		}
		fillBlock(&b, cidr)
		v, err := json.Marshal(b)
		return store.BlockKey(cidr), v, err
	case store.KindBlockAffinity:
		var d affinityDoc
		if err := strictUnmarshal(raw, &d); err != nil {
			return "", nil, asError(err)
		}
		if err := nameCheck("node", d.Node); err != nil {
			return "", nil, err
		}
		cidr, err := netip.ParsePrefix(d.CIDR)
		if err != nil || cidr.Masked() != cidr {
			return "", nil, &Error{Field: "cidr", Reason: fmt.Sprintf("%q is not a network CIDR", d.CIDR)}
		}
		if d.State == "" {
			d.State = string(store.AffinityConfirmed)
		}
		v, err := json.Marshal(d.BlockAffinityValue)
		return store.AffinityKey(d.Node, cidr), v, err
	}
	return "", nil, fmt.Errorf("kind %v cannot be applied", kind)
}

// fillBlock completes a block written by hand: with no allocations given, every slot is free,
// laid out as calico-ipam lays out a new block.
func fillBlock(b *store.AllocationBlock, cidr netip.Prefix) {
	if b.Allocations == nil {
		n := store.BlockSlots(cidr)
		b.Allocations = make([]*int, n)
		b.Unallocated = make([]int, n)
		for i := range b.Unallocated {
			b.Unallocated[i] = i
		}
	}
	if b.Attributes == nil {
		b.Attributes = []store.AllocationAttribute{}
	}
	if b.Unallocated == nil {
		b.Unallocated = []int{}
		for i, a := range b.Allocations {
			if a == nil {
				b.Unallocated = append(b.Unallocated, i)
			}
		}
	}
	if b.SequenceNumberForAllocation == nil {
		b.SequenceNumberForAllocation = map[string]uint64{}
	}
}
