#!/usr/bin/env bash
# Builds the binaries plexus ships: release profile, statically linked against glibc, so they
# start fast (no dynamic loader work: ~0.3 ms of every invocation) and run on any host they are
# copied to, like the Go reference plugins. Prints the directory holding them. Arguments name
# packages to build (`-p plexus -p plexus-macvlan`); none: every binary of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
# etcd-client's build script runs protoc (plexus-ipam's etcd store); a fresh machine has none.
source scripts/lib/packages.sh
need_packages protobuf-compiler libprotobuf-dev
host=$(rustc -vV | sed -n 's/^host: //p')
# Called from a test (scripts/cluster-install.sh under cargo nextest), this script inherits the
# variables cargo sets for the test crate. ring's build script reruns when CARGO_MANIFEST_DIR
# changes, so one of them left set rebuilds ring and everything above it (kube, rustls, tonic):
# minutes inside a test, then again outside it. The build sees what a shell would.
unset CARGO_MANIFEST_DIR CARGO_MANIFEST_PATH CARGO_CRATE_NAME CARGO_BIN_NAME CARGO_PRIMARY_PACKAGE \
  CARGO_TARGET_TMPDIR OUT_DIR "${!CARGO_PKG_@}"
# --target keeps RUSTFLAGS off build scripts and proc-macros, which cannot be static.
# Not position-independent (relocation-model=static), like the Go reference plugins: a static-pie
# binary first applies its ~16k relocations and copies .data.rel.ro on every start (~0.15 ms for
# plexus); the stack, heap and mmap areas stay randomized.
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static -C relocation-model=static" \
  cargo build --release --locked --bins --target "$host" "${@:---workspace}" >&2
echo "$(pwd)/target/$host/release"
