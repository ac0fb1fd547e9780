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
	benchDecode(b, []decodeCase{
		{"empty", BlockKey(netip.MustParsePrefix("10.64.1.0/26")), empty},
		{"10-used", BlockKey(netip.MustParsePrefix("10.64.1.0/26")), used},
		{"affinity", AffinityKey("node-0001", netip.MustParsePrefix("10.64.1.0/26")), `{"state":"confirmed","deleted":false}`},
	})
}

// decodeCase is one value to decode under its key, as a sub-benchmark of its name.
type decodeCase struct{ name, key, value string }

// benchDecode decodes each case's value over and over, as a sub-benchmark of its own.
func benchDecode(b *testing.B, cases []decodeCase) {
	for _, c := range cases {
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

// BenchmarkDecodeService decodes a node-port service and its endpoint slice of 10 endpoints,
// as BenchmarkServicesArriving in cmd/sluiced writes them.
func BenchmarkDecodeService(b *testing.B) {
	var eps []string
	for e := range 10 {
		eps = append(eps, fmt.Sprintf(`{"addresses":["10.65.%d.%d"],"conditions":{"ready":true},"nodeName":"node-%03d"}`, e, 10+e, e))
	}
	svc := `{"kind":"Service","apiVersion":"v1","metadata":{"name":"svc-00042","namespace":"bench","uid":"uid-svc-00042"},"spec":{"type":"NodePort","clusterIPs":["10.96.0.42"],"ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":8080,"nodePort":30042}],"externalTrafficPolicy":"Cluster"}}`
	slice := fmt.Sprintf(`{"kind":"EndpointSlice","apiVersion":"discovery.k8s.io/v1","metadata":{"name":"svc-00042-1","namespace":"bench","labels":{"kubernetes.io/service-name":"svc-00042"}},"addressType":"IPv4","endpoints":[%s],"ports":[{"name":"http","protocol":"TCP","port":8080}]}`,
		strings.Join(eps, ","))
	benchDecode(b, []decodeCase{
		{"service", ServicePrefix + "bench/svc-00042", svc},
		{"slice", EndpointSlicePrefix + "bench/svc-00042-1", slice},
	})
}
