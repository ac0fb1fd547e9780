package store

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// BenchmarkDecodeBlock decodes a /26 block of calico-ipam's shape, empty and with 10
// addresses in use; and a block affinity.
func BenchmarkDecodeBlock(b *testing.B) {
	empty := fmt.Sprintf(`{"cidr":"10.64.1.0/26","affinity":"host:node-0001","strictAffinity":false,"allocations":[%s],"unallocated":[%s],"attributes":[],"deleted":false}`,
		strings.TrimSuffix(strings.Repeat("null,", 64), ","), seq(0, 64))
	var allocs, attrs []string
	for i := range 64 {
		if i < 10 {
			allocs = append(allocs, fmt.Sprint(i))
			attrs = append(attrs, fmt.Sprintf(`{"handle_id":"k8s-pod-network.%064d","secondary":{"namespace":"default","node":"node-0001","pod":"web-%d","timestamp":"2026-12-01 10:00:00.000000000 +0000 UTC"}}`, i, i))
		} else {
			allocs = append(allocs, "null")
		}
	}
	used := fmt.Sprintf(`{"cidr":"10.64.1.0/26","affinity":"host:node-0001","strictAffinity":false,"allocations":[%s],"unallocated":[%s],"attributes":[%s],"deleted":false,"sequenceNumber":1733,"sequenceNumberForAllocation":{"0":1724}}`,
		strings.Join(allocs, ","), seq(10, 64), strings.Join(attrs, ","))
	for _, c := range []struct{ name, key, value string }{
		{"empty", BlockKey(netip.MustParsePrefix("10.64.1.0/26")), empty},
		{"10-used", BlockKey(netip.MustParsePrefix("10.64.1.0/26")), used},
		{"affinity", AffinityKey("node-0001", netip.MustParsePrefix("10.64.1.0/26")), `{"state":"confirmed","deleted":false}`},
	} {
		b.Run(c.name, func(b *testing.B) {
			v := []byte(c.value)
			b.SetBytes(int64(len(v)))
			b.ReportAllocs()
			for range b.N {
				if _, err := Decode(c.key, v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func seq(from, to int) string {
	var s []string
	for i := from; i < to; i++ {
		s = append(s, fmt.Sprint(i))
	}
	return strings.Join(s, ",")
}
