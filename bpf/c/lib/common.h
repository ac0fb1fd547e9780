/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Constants and the packet summary every part reads (struct pkt). */
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

#define TH_FIN 0x01
#define TH_SYN 0x02
#define TH_RST 0x04
#define TH_ACK 0x10

#endif
