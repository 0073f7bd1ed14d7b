#!/usr/bin/env bash
# The test command (README.md; .ci/run calls exactly this). On a fresh machine with only the Rust
# toolchain it installs what the tests need, then runs: fmt check, clippy -D warnings, the build
# of every binary, and the whole suite under nextest. Needs root: the tests create namespaces.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/packages.sh

if [ "$(id -u)" != 0 ]; then
  echo "scripts/test.sh: run as root (tests create network namespaces and links)" >&2
  exit 1
fi

# Debian packages the tests use, installed only when missing:
#   containernetworking-plugins  the reference plugins, side by side with ours (/usr/lib/cni)
#   iproute2 procps              ip and sysctl, the harness's independent view of the kernel
#   protobuf-compiler libprotobuf-dev   protoc and the well-known protos, for etcd-client's build
#   etcd-server etcd-client      a real etcd (and etcdctl) for the cluster-wide IPAM store tests
#   podman runc containerd busybox-static tar   real runtimes driving plexus (a busybox image made locally)
#   openssl iptables util-linux  the real Kubernetes node (certificates, the service address, nsenter/unshare)
#   gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user binutils   the arm64 build and its run under qemu
packages=(containernetworking-plugins iproute2 procps protobuf-compiler libprotobuf-dev etcd-server etcd-client
          podman runc containerd busybox-static tar openssl iptables util-linux
          gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user binutils python3)
# Each step's time, printed at the end (docs/CONTRIBUTING.md keeps the breakdown).
times=()
step_start=$SECONDS
step() {
  [ -n "${step_name:-}" ] && times+=("$((SECONDS - step_start)) s  $step_name")
  step_name=$1 step_start=$SECONDS
  echo "== $1"
}
step "Debian packages"
need_packages "${packages[@]}"
command -v cargo-nextest >/dev/null || cargo install --locked cargo-nextest
# Built from Debian's source package; the tests drive plexus through it.
step "cnitool (scripts/tools/build-cnitool.sh)"
bash scripts/tools/build-cnitool.sh

# The peers: Kubernetes, etcd, containerd, crictl, Multus, whereabouts, helm, reference plugins,
# built from tests/peers/ into a cache outside the clone: minutes the first time, instant after.
step "the peers (scripts/peers.sh)"
bash scripts/peers.sh

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
step "build every binary (tests exec them)"
cargo build --workspace --bins --locked
# The shipped build, which the real-cluster tests install: built here, not inside the first of
# them, so no test's time includes minutes of compiling.
step "the shipped build (scripts/build-release.sh)"
bash scripts/build-release.sh > /dev/null
step "tests"
cargo nextest run --workspace --locked --no-fail-fast
# Built into /var/cache/plexus-fuzz, outside the clone.
step "fuzz targets, 5 s each (scripts/fuzz.sh)"
bash scripts/fuzz.sh 5
# The shipped build cross-compiled for aarch64 and run under qemu-user; the image index of both.
step "linux/arm64 (scripts/arm64-check.sh)"
bash scripts/arm64-check.sh
step done
echo "== time by step"
printf '  %s\n' "${times[@]}"
echo "  $SECONDS s  in all"
