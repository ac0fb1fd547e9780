/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Constants and the packet summaries every part reads (struct pkt, IPv6's struct pkt6). */
#ifndef SLUICE_LIB_COMMON_H
#define SLUICE_LIB_COMMON_H

#ifndef AF_INET
#define AF_INET 2
#endif

#define IP_OFF ETH_HLEN
#define L4_OFF (ETH_HLEN + sizeof(struct iphdr))
#define ENCAP_LEN (sizeof(struct iphdr) + sizeof(struct udphdr) + 8 + ETH_HLEN)
#define IP_RF 0x8000
#define IP_DF 0x4000
#define IP_MF 0x2000
#define IP_OFFMASK 0x1fff
#define NSEC 1000000000ULL
/* bpf_skb_adjust_room's decapsulation flags, newer than the UAPI headers this builds with:
 * the inner protocol is IPv4 (Linux 6.3), the UDP tunnel's GSO state goes (7.0). */
#define ADJ_ROOM_DECAP_L3_IPV4 (1ULL << 7)
#define ADJ_ROOM_DECAP_L4_UDP  (1ULL << 10)

#define ICMP_DEST_UNREACH 3
#define ICMP_PORT_UNREACH 3
#define ICMP_FRAG_NEEDED 4

struct icmphdr {
	__u8 type;
	__u8 code;
	__sum16 checksum;
	__be16 unused;
	__be16 mtu;
};

struct pkt {
	__be32 src, dst;
	__be16 sport, dport;
	__u8 proto;
	__u8 tcp_flags; /* TCP header byte 13 */
	__u16 frag;     /* frag_off, host order */
	__u16 tot_len;  /* host order */
	__u8 tos;
	__u8 ttl;
	__u16 l4;       /* offset of the transport header: after the IP header and its options */
	__be16 id;      /* IP identification */
	__u8 later;     /* a later fragment: no transport header, ports from the first fragment */
};

/* IPv6 */
#ifndef AF_INET6
#define AF_INET6 10
#endif

#define IP6_HLEN 40
#define L4_OFF6 (ETH_HLEN + IP6_HLEN)
#define ENCAP6_LEN (IP6_HLEN + sizeof(struct udphdr) + 8 + ETH_HLEN)

#define NEXTHDR_HOP 0
#define NEXTHDR_ROUTING 43
#define NEXTHDR_FRAGMENT 44
#define NEXTHDR_AUTH 51
#define NEXTHDR_DEST 60
#define NEXTHDR_ICMP6 58
/* Extension headers walked before the transport header: more is no packet's. */
#define EXT_MAX 8

#define ICMP6_DST_UNREACH 1
#define ICMP6_PKT_TOO_BIG 2
#define ICMP6_TIME_EXCEED 3
#define ICMP6_PARAM_PROB 4
#define ICMP6_PORT_UNREACH 4 /* code of ICMP6_DST_UNREACH */
/* ICMP6(type, code) is icmp6_back's type_code. */
#define ICMP6(type, code) ((__u16)((type) << 8 | (code)))

struct icmp6hdr_ {
	__u8 type;
	__u8 code;
	__sum16 checksum;
	__be32 data; /* the MTU of a Packet Too Big, else unused */
};

/* pkt6.frag */
#define F6_FRAG  (1 << 0) /* has a fragment header */
#define F6_MORE  (1 << 1) /* more fragments follow */
#define F6_LATER (1 << 2) /* not the first fragment: no transport header */

/* The IPv6 packet summary: struct pkt's fields for IPv6 (the same names, so the code both
 * families share reads either). */
struct pkt6 {
	struct addr6 src, dst;
	__be16 sport, dport;
	__u8 proto;     /* the transport protocol (after the extension headers) */
	__u8 tcp_flags; /* TCP header byte 13 */
	__u16 l4;       /* offset of the transport header */
	__u16 len;      /* payload length (after the 40-byte header), host order */
	__u8 frag;      /* F6_* */
	__u8 later;     /* a later fragment with the ports of its first */
	__be32 id;      /* the fragment header's identification */
};

#define TH_FIN 0x01
#define TH_SYN 0x02
#define TH_RST 0x04
#define TH_ACK 0x10

#endif
