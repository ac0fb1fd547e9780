/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The data path of one address family (FAMILY, lib/family.h): sluice.c includes this once for
 * IPv4 and once for IPv6. The headers, by concern, in the order their definitions need (and
 * that keeps the slow paths, BPF-to-BPF functions, in one order); each holds one logic for both
 * families. No include guard: each inclusion is a family's. */
#include "family.h"
#include "parse.h"
#include "conntrack.h"
#include "icmp.h"
#include "frag.h"
#include "fib.h"
#include "tunnel.h"
#include "lb.h"
#include "nat.h"
#include "tunnel_in.h"
#include "icmp_nat.h"
#include "prog.h"
#include "socket.h"
#include "clean.h"
