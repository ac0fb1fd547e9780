// Package dataplane will own the kernel's routes, VXLAN device, neighbours and FDB entries
// through netlink: it will make them match calc's desired state after the first in-sync, and
// repair drift. Nothing is implemented yet.
package dataplane
