#!/usr/bin/env bash
# Builds the binaries plexus ships: release profile, statically linked against glibc, so they
# start fast (no dynamic loader work: ~0.3 ms of every invocation) and run on any host they are
# copied to, like the Go reference plugins. Prints the directory holding them. Arguments name
# packages or binaries to build (`-p plexus -p plexus-macvlan`, `--workspace --bins`); none: the
# binaries plexus ships (scripts/lib/shipped.sh), not the test helpers beside them (each release
# binary is a fat-LTO link of its own: the helpers took 64 of the build's 1,030 CPU seconds).
#
#   bash scripts/build-release.sh                 # this machine's architecture
#   PLEXUS_ARCH=arm64 bash scripts/build-release.sh   # linux/arm64 (aarch64), cross-compiled
#   PLEXUS_PROFILE=release-unoptimized bash scripts/build-release.sh   # a cargo profile other than release
#
# amd64 and arm64 are built on either: the other one with Debian's cross C toolchain
# (gcc-aarch64-linux-gnu or gcc-x86-64-linux-gnu, for ring's C and the static link) and the Rust
# target added with rustup; both installed here when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/packages.sh
source scripts/lib/shipped.sh
# etcd-client's build script runs protoc (plexus-ipam's etcd store); a fresh machine has none.
need_packages protobuf-compiler libprotobuf-dev
host=$(rustc -vV | sed -n 's/^host: //p')
# Set by the test and bench scripts only (the test command's arm64 check: Cargo.toml, release-unoptimized).
profile=${PLEXUS_PROFILE:-release}
target_dir=${CARGO_TARGET_DIR:-$(pwd)/target}
case "${PLEXUS_ARCH:-}" in
  "") target=$host ;;
  amd64) target=x86_64-unknown-linux-gnu ;;
  arm64) target=aarch64-unknown-linux-gnu ;;
  *) echo "build-release.sh: PLEXUS_ARCH=$PLEXUS_ARCH: amd64 or arm64" >&2; exit 1 ;;
esac
if [ "$target" != "$host" ]; then
  case $target in
    aarch64-*) cross=aarch64-linux-gnu; need_packages gcc-aarch64-linux-gnu libc6-dev-arm64-cross ;;
    x86_64-*) cross=x86_64-linux-gnu; need_packages gcc-x86-64-linux-gnu libc6-dev-amd64-cross ;;
  esac
  need_rust_target "$target"
  triple_env=$(echo "$target" | tr 'a-z-' 'A-Z_')
  export "CARGO_TARGET_${triple_env}_LINKER=$cross-gcc" "CC_${target//-/_}=$cross-gcc" "AR_${target//-/_}=$cross-ar"
  # A target dir of its own: cargo locks the host's release dir (build scripts) for a cross build
  # too, and scripts/test.sh runs this one while the tests run the host's.
  target_dir=${CARGO_TARGET_DIR:-$(pwd)/target}/cross
  export CARGO_TARGET_DIR=$target_dir
fi
# Called from a test (scripts/cluster-install.sh under the test runner), this script inherits the
# variables cargo sets for the test crate. ring's build script reruns when CARGO_MANIFEST_DIR
# changes, so one of them left set rebuilds ring and everything above it (kube, rustls, tonic):
# minutes inside a test, then again outside it. The build sees what a shell would.
unset CARGO_MANIFEST_DIR CARGO_MANIFEST_PATH CARGO_CRATE_NAME CARGO_BIN_NAME CARGO_PRIMARY_PACKAGE \
  CARGO_TARGET_TMPDIR OUT_DIR "${!CARGO_PKG_@}"
# scripts/test.sh builds the tests with clippy's driver as the workspace's compiler; the shipped
# build is rustc's alone (and is not rebuilt when a test calls this script).
unset RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS
# --target keeps RUSTFLAGS off build scripts and proc-macros, which cannot be static.
# Not position-independent (relocation-model=static), like the Go reference plugins: a static-pie
# binary first applies its ~16k relocations and copies .data.rel.ro on every start (~0.15 ms for
# plexus); the stack, heap and mmap areas stay randomized.
[ $# -gt 0 ] || set -- "${SHIPPED_BUILD[@]}"
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static -C relocation-model=static" \
  cargo build --profile "$profile" --locked --target "$target" "$@" >&2
echo "$target_dir/$target/$profile"
