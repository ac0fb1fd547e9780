package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/sluice-net/sluice/store"
	"github.com/sluice-net/sluice/store/manifest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func runApply(ctx context.Context, a *app, args []string) error {
	fs := a.flagSet("apply")
	var files stringList
	fs.Var(&files, "f", "file, directory or - for standard input (repeatable)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q (files go after -f)", pos[0])
	}
	if len(files) == 0 {
		return usagef("need -f FILE|DIR|-")
	}
	docs, err := manifest.ParsePaths(files, a.stdin)
	if err != nil {
		return fmt.Errorf("nothing was written:\n%w", err)
	}
	if len(docs) == 0 {
		return errors.New("no documents found")
	}
	cli, ctx, done, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	if err := checkPools(ctx, cli, docs); err != nil {
		return err
	}
	now := time.Now()
	for _, d := range docs {
		act, err := manifest.Apply(ctx, cli, d, now)
		if err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "%s/%s %s\n", d.Kind.Plural(), d.ID, act)
	}
	return nil
}

// objectID forms the ID of an object of kind k from the command line's NAME and -n.
func objectID(k store.Kind, name, namespace string) string {
	if k.Namespaced() && !strings.Contains(name, "/") {
		if namespace == "" {
			namespace = "default"
		}
		return namespace + "/" + name
	}
	return name
}

func runGet(ctx context.Context, a *app, args []string) error {
	fs := a.flagSet("get")
	output := outputFlag(fs, "table, yaml or json")
	namespace := fs.String("n", "", "namespace (namespaced kinds; default: every namespace)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) < 1 || len(pos) > 2 {
		return usagef("want KIND [NAME]")
	}
	kind, err := store.ParseKind(pos[0])
	if err != nil {
		return usagef("%v", err)
	}
	if *output != "table" && *output != "yaml" && *output != "json" {
		return usagef("-o %q: want table, yaml or json", *output)
	}
	cli, ctx, done, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer done()

	var resp *clientv3.GetResponse
	if len(pos) == 2 {
		key, err := store.KeyFor(kind, objectID(kind, pos[1], *namespace))
		if err != nil {
			return usagef("%v", err)
		}
		resp, err = cli.Get(ctx, key)
		if err != nil {
			return fmt.Errorf("reading %s: %w", key, err)
		}
		if len(resp.Kvs) == 0 {
			return fmt.Errorf("%s %q: %w", kind.Plural(), pos[1], manifest.ErrNotFound)
		}
	} else {
		prefix := store.KindPrefix(kind)
		if kind.Namespaced() && *namespace != "" {
			prefix += *namespace + "/"
		}
		resp, err = cli.Get(ctx, prefix, clientv3.WithPrefix())
		if err != nil {
			return fmt.Errorf("reading %s: %w", prefix, err)
		}
	}
	// Blocks and affinities in address order, not their keys' text order (10.65.0.64/26
	// before 10.65.0.128/26).
	order := make(map[*mvccpb.KeyValue]string, len(resp.Kvs)) // each key's sort key, once
	for _, kv := range resp.Kvs {
		order[kv] = sortKey(string(kv.Key))
	}
	slices.SortStableFunc(resp.Kvs, func(a, b *mvccpb.KeyValue) int { return cmp.Compare(order[a], order[b]) })
	var objs []store.Object
	var docs []map[string]any
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		obj, err := store.Decode(key, kv.Value)
		if err != nil {
			fmt.Fprintf(a.stderr, "warning: skipped: %v\n", err)
			continue
		}
		if obj.Kind() != kind {
			continue
		}
		objs = append(objs, obj)
		doc, err := manifest.ToDocument(key, kv.Value)
		if err != nil {
			fmt.Fprintf(a.stderr, "warning: skipped: %v\n", err)
			continue
		}
		docs = append(docs, doc)
	}
	if *output == "table" {
		return manifest.WriteTable(a.stdout, kind, objs)
	}
	return manifest.WriteDocuments(a.stdout, *output, docs)
}

func runDelete(ctx context.Context, a *app, args []string) error {
	fs := a.flagSet("delete")
	namespace := fs.String("n", "", "namespace (namespaced kinds; default \"default\")")
	force := fs.Bool("force", false, "delete an IP pool or a node that still holds blocks, affinities or workload endpoints (they are left orphaned)")
	var files stringList
	fs.Var(&files, "f", "delete the objects the documents of a file, directory or - name (repeatable), as kubectl delete -f")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	type target struct {
		kind     store.Kind
		id, key  string
		fromFile string
	}
	var targets []target
	switch {
	case len(files) > 0 && len(pos) > 0:
		return usagef("want KIND NAME or -f FILE, not both")
	case len(files) > 0:
		docs, err := manifest.ParsePaths(files, a.stdin)
		if err != nil {
			return fmt.Errorf("nothing was deleted:\n%w", err)
		}
		for _, d := range docs {
			targets = append(targets, target{d.Kind, d.ID, d.Key, d.Source})
		}
	case len(pos) == 2:
		kind, err := store.ParseKind(pos[0])
		if err != nil {
			return usagef("%v", err)
		}
		id := objectID(kind, pos[1], *namespace)
		key, err := store.KeyFor(kind, id)
		if err != nil {
			return usagef("%v", err)
		}
		targets = append(targets, target{kind: kind, id: id, key: key})
	default:
		return usagef("want KIND NAME or -f FILE")
	}
	cli, ctx, done, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	// What would be orphaned is checked for every object before any is deleted.
	if !*force {
		for _, t := range targets {
			what, err := orphans(ctx, cli, t.kind, t.id)
			if err != nil {
				return err
			}
			if len(what) > 0 {
				return fmt.Errorf("nothing was deleted: %w", orphanError(t.kind, t.id, what))
			}
		}
	}
	var missing []string
	for _, t := range targets {
		if err := manifest.Delete(ctx, cli, t.key); err != nil {
			if errors.Is(err, manifest.ErrNotFound) && len(files) > 0 {
				missing = append(missing, fmt.Sprintf("%s/%s (%s)", t.kind.Plural(), t.id, t.fromFile))
				continue
			}
			return err
		}
		fmt.Fprintf(a.stdout, "%s/%s deleted\n", t.kind.Plural(), t.id)
	}
	if len(missing) > 0 {
		return fmt.Errorf("not found, so not deleted: %s", strings.Join(missing, ", "))
	}
	return nil
}

// sortKey orders keys for listing: a block's or an affinity's CIDR compares by address (the
// address bytes, zero-padded, replace its text); other keys compare as they are.
func sortKey(key string) string {
	kind, id, err := store.ParseKey(key)
	if err != nil || (kind != store.KindBlock && kind != store.KindBlockAffinity) {
		return key
	}
	node, cidr := "", id
	if kind == store.KindBlockAffinity {
		node, cidr, _ = strings.Cut(id, "/")
	}
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return key
	}
	a := p.Addr().As16()
	return node + "/" + string(a[:]) + string(rune(p.Bits()))
}
