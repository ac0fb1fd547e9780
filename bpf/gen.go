package bpf

// The C sources in c/ are compiled with bpf2go; the generated Go and the object are
// committed, so building and testing need no clang. `make generate` rebuilds them.
//go:generate go tool bpf2go -cc clang -strip llvm-strip -target bpfel -type fe_key_v4 -type fe_val -type be_key -type be_val_v4 -type be_idx_key_v4 -type src_key_v4 -type cnet_key_v4 -type cnet_val -type aff_key_v4 -type aff_val_v4 -type ct_key_v4 -type ct_val_v4 -type cfg -type sock_key_v4 -type sock_val_v4 -type ct_clean_ctx_v4 -type fe_key_v6 -type be_val_v6 -type be_idx_key_v6 -type src_key_v6 -type cnet_key_v6 -type aff_key_v6 -type aff_val_v6 -type ct_key_v6 -type ct_val_v6 -type ct_clean_ctx_v6 -type addr6 -type cfg_v6 -type sock_key_v6 -type sock_val_v6 sluice c/sluice.c -- -O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu
