package main

import (
	"strconv"
	"strings"
)

// compareDebVersions orders two Debian package versions as dpkg does ([epoch:]upstream
// [-revision], '~' before anything, even the end): negative when a < b, 0 when equal,
// positive when a > b. Picking the newest kernel of a series rests on it
// (6.12.9 < 6.12.10, 6.12.118-1~deb12u1 < 6.12.118-1).
func compareDebVersions(a, b string) int {
	ea, ua, ra := splitDebVersion(a)
	eb, ub, rb := splitDebVersion(b)
	if ea != eb {
		if ea < eb {
			return -1
		}
		return 1
	}
	if c := compareDebPart(ua, ub); c != 0 {
		return c
	}
	return compareDebPart(ra, rb)
}

func splitDebVersion(v string) (epoch int, upstream, revision string) {
	if i := strings.IndexByte(v, ':'); i >= 0 {
		epoch, _ = strconv.Atoi(v[:i])
		v = v[i+1:]
	}
	upstream = v
	if i := strings.LastIndexByte(v, '-'); i >= 0 {
		upstream, revision = v[:i], v[i+1:]
	}
	return epoch, upstream, revision
}

// debOrder is the weight of one character in a non-digit run: '~' sorts before everything,
// the end of the run next, then letters, then everything else.
func debOrder(c byte) int {
	switch {
	case c == '~':
		return -1
	case c >= '0' && c <= '9':
		return 0
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		return int(c)
	default:
		return int(c) + 256
	}
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func compareDebPart(a, b string) int {
	for a != "" || b != "" {
		// A run of non-digits, compared with debOrder (a missing character counts as 0).
		for (a != "" && !isDigit(a[0])) || (b != "" && !isDigit(b[0])) {
			ac, bc := 0, 0
			if a != "" && !isDigit(a[0]) {
				ac = debOrder(a[0])
			}
			if b != "" && !isDigit(b[0]) {
				bc = debOrder(b[0])
			}
			if ac != bc {
				return ac - bc
			}
			if a != "" && !isDigit(a[0]) {
				a = a[1:]
			}
			if b != "" && !isDigit(b[0]) {
				b = b[1:]
			}
		}
		// A run of digits, compared as numbers.
		for a != "" && a[0] == '0' {
			a = a[1:]
		}
		for b != "" && b[0] == '0' {
			b = b[1:]
		}
		na, nb := 0, 0
		for na < len(a) && isDigit(a[na]) {
			na++
		}
		for nb < len(b) && isDigit(b[nb]) {
			nb++
		}
		if na != nb {
			return na - nb
		}
		if c := strings.Compare(a[:na], b[:nb]); c != 0 {
			return c
		}
		a, b = a[na:], b[nb:]
	}
	return 0
}
