package store

import (
	"fmt"
	"slices"
	"strings"
)

// Selector is a parsed Calico label selector, as BGPPeer's nodeSelector and peerSelector (and
// an IP pool's nodeSelector) hold it: `all()`, `has(k)`, `k == 'v'`, `k != 'v'`,
// `k in {'a', 'b'}`, `k not in {...}`, `k contains 'v'`, `k starts with 'v'`,
// `k ends with 'v'`, `!e`, `e && e`, `e || e` and parentheses. It matches a set of labels.
// The zero Selector is none given (Set reports false) and matches nothing.
type Selector struct {
	src  string
	root *selNode
}

// selNode is one node of a selector's expression tree.
type selNode struct {
	op          string // all, has, ==, !=, in, notin, contains, starts, ends, not, and, or
	key         string
	value       string
	values      []string // in, notin: sorted
	left, right *selNode // not: left; and, or: both
}

// ParseSelector parses s. An empty (or blank) s is no selector: Set reports false.
func ParseSelector(s string) (Selector, error) {
	if strings.TrimSpace(s) == "" {
		return Selector{}, nil
	}
	p := selParser{src: s}
	n, err := p.or()
	if err == nil {
		p.space()
		if p.pos < len(p.src) {
			err = p.fail("unexpected %q", p.src[p.pos:])
		}
	}
	if err != nil {
		return Selector{}, err
	}
	return Selector{src: s, root: n}, nil
}

// Set reports whether a selector was given.
func (s Selector) Set() bool { return s.root != nil }

// String is the selector as written.
func (s Selector) String() string { return s.src }

// Matches reports whether labels satisfy s. An unset selector matches nothing.
func (s Selector) Matches(labels map[string]string) bool {
	return s.root != nil && s.root.matches(labels)
}

func (n *selNode) matches(l map[string]string) bool {
	v, has := l[n.key]
	switch n.op {
	case "all":
		return true
	case "has":
		return has
	case "==":
		return has && v == n.value
	case "!=":
		return !has || v != n.value
	case "in":
		_, found := slices.BinarySearch(n.values, v)
		return has && found
	case "notin":
		_, found := slices.BinarySearch(n.values, v)
		return !has || !found
	case "contains":
		return has && strings.Contains(v, n.value)
	case "starts":
		return has && strings.HasPrefix(v, n.value)
	case "ends":
		return has && strings.HasSuffix(v, n.value)
	case "not":
		return !n.left.matches(l)
	case "and":
		return n.left.matches(l) && n.right.matches(l)
	case "or":
		return n.left.matches(l) || n.right.matches(l)
	}
	return false
}

// selParser is a recursive-descent parser over the selector's text.
type selParser struct {
	src string
	pos int
}

func (p *selParser) fail(format string, args ...any) error {
	return fmt.Errorf("selector %q at %d: %s", Clip(p.src, 200), p.pos, fmt.Sprintf(format, args...))
}

func (p *selParser) space() {
	for p.pos < len(p.src) && (p.src[p.pos] == ' ' || p.src[p.pos] == '\t' || p.src[p.pos] == '\n') {
		p.pos++
	}
}

// eat consumes tok (after spaces) when it comes next.
func (p *selParser) eat(tok string) bool {
	p.space()
	if strings.HasPrefix(p.src[p.pos:], tok) {
		p.pos += len(tok)
		return true
	}
	return false
}

// word consumes a keyword (not followed by a label character).
func (p *selParser) word(w string) bool {
	p.space()
	rest := p.src[p.pos:]
	if strings.HasPrefix(rest, w) && (len(rest) == len(w) || !isLabelChar(rest[len(w)])) {
		p.pos += len(w)
		return true
	}
	return false
}

func (p *selParser) or() (*selNode, error) {
	l, err := p.and()
	for err == nil && p.eat("||") {
		var r *selNode
		if r, err = p.and(); err == nil {
			l = &selNode{op: "or", left: l, right: r}
		}
	}
	return l, err
}

func (p *selParser) and() (*selNode, error) {
	l, err := p.unary()
	for err == nil && p.eat("&&") {
		var r *selNode
		if r, err = p.unary(); err == nil {
			l = &selNode{op: "and", left: l, right: r}
		}
	}
	return l, err
}

func (p *selParser) unary() (*selNode, error) {
	if p.eat("!") && !strings.HasPrefix(p.src[p.pos:], "=") {
		n, err := p.unary()
		return &selNode{op: "not", left: n}, err
	}
	if p.eat("(") {
		n, err := p.or()
		if err == nil && !p.eat(")") {
			err = p.fail("want ')'")
		}
		return n, err
	}
	if p.word("all") {
		if !p.eat("(") || !p.eat(")") {
			return nil, p.fail("want all()")
		}
		return &selNode{op: "all"}, nil
	}
	if p.word("has") {
		if !p.eat("(") {
			return nil, p.fail("want has(<label>)")
		}
		k, err := p.label()
		if err == nil && !p.eat(")") {
			err = p.fail("want ')'")
		}
		return &selNode{op: "has", key: k}, err
	}
	k, err := p.label()
	if err != nil {
		return nil, err
	}
	n := &selNode{key: k}
	switch {
	case p.eat("=="):
		n.op = "=="
	case p.eat("!="):
		n.op = "!="
	case p.word("in"):
		n.op = "in"
	case p.word("not"):
		if !p.word("in") {
			return nil, p.fail("want 'not in'")
		}
		n.op = "notin"
	case p.word("contains"):
		n.op = "contains"
	case p.word("starts"):
		if !p.word("with") {
			return nil, p.fail("want 'starts with'")
		}
		n.op = "starts"
	case p.word("ends"):
		if !p.word("with") {
			return nil, p.fail("want 'ends with'")
		}
		n.op = "ends"
	default:
		return nil, p.fail("want an operator (==, !=, in, not in, contains, starts with, ends with) after %q", k)
	}
	if n.op == "in" || n.op == "notin" {
		if !p.eat("{") {
			return nil, p.fail("want '{'")
		}
		for !p.eat("}") {
			if len(n.values) > 0 && !p.eat(",") {
				return nil, p.fail("want ',' or '}'")
			}
			v, err := p.str()
			if err != nil {
				return nil, err
			}
			n.values = append(n.values, v)
		}
		slices.Sort(n.values)
		return n, nil
	}
	n.value, err = p.str()
	return n, err
}

func isLabelChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '/' || c == '-'
}

func (p *selParser) label() (string, error) {
	p.space()
	start := p.pos
	for p.pos < len(p.src) && isLabelChar(p.src[p.pos]) {
		p.pos++
	}
	if p.pos == start {
		return "", p.fail("want a label name")
	}
	return p.src[start:p.pos], nil
}

func (p *selParser) str() (string, error) {
	p.space()
	if p.pos >= len(p.src) || (p.src[p.pos] != '\'' && p.src[p.pos] != '"') {
		return "", p.fail("want a quoted value")
	}
	q := p.src[p.pos]
	end := strings.IndexByte(p.src[p.pos+1:], q)
	if end < 0 {
		return "", p.fail("unterminated string")
	}
	v := p.src[p.pos+1 : p.pos+1+end]
	p.pos += end + 2
	return v, nil
}
