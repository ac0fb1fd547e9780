// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* sluice's service data path: tc programs on host and workload interfaces that translate
 * service traffic (cluster IPs, node ports, external and load-balancer addresses), forward
 * node-port traffic to an endpoint's node through a VXLAN tunnel of their own (the client's
 * address kept), and send replies back the way the request came. See docs/internals.md ("bpf")
 * for the design and the Go files of package bpf for the other side.
 *
 * The parts are headers under lib/, by concern. The data path (lib/datapath.h) is included
 * twice, once a family: its headers hold one logic for IPv4 and IPv6, compiled for each
 * (lib/family.h says how). */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "sluice.h"

#include "lib/common.h"
#include "lib/maps.h"

#define FAMILY 4
#include "lib/datapath.h"
#undef FAMILY
#define FAMILY 6
#include "lib/datapath.h"
#undef FAMILY

char LICENSE[] SEC("license") = "Dual BSD/GPL";
