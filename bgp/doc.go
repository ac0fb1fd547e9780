// Package bgp is sluice's BGP stage: one embedded speaker per node (GoBGP, as a library),
// driven by calc's BGP ops like the other drivers. calc decides what the speaker is, whom it
// peers with and what it announces (calico/node's rules); this package only makes the running
// speaker match: it starts the speaker, adds, changes and removes sessions, and adds and
// withdraws paths, each through a tracker so that only what changed is touched (a block
// claimed is one path added, a block released one withdrawn).
//
// Sessions' passwords are read from files named by calc (a secret's key under the secrets
// directory); etcd holds none. The package does not log: GoBGP's own log goes to the
// slog.Logger the caller gives, and what the stage does is reported through callbacks.
package bgp
