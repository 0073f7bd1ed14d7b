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
packages=(containernetworking-plugins iproute2 procps protobuf-compiler libprotobuf-dev etcd-server etcd-client
          podman runc containerd busybox-static tar openssl iptables util-linux)
need_packages "${packages[@]}"
command -v cargo-nextest >/dev/null || cargo install --locked cargo-nextest
echo "== cnitool (built from Debian's source package; the tests drive plexus through it)"
bash scripts/tools/build-cnitool.sh

echo "== the peers: Kubernetes, etcd, containerd, crictl, Multus, whereabouts, reference plugins (scripts/peers.sh;"
echo "   built from tests/peers/ into a cache outside the clone: minutes the first time, instant after)"
bash scripts/peers.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== build every binary (tests exec them)"
cargo build --workspace --bins --locked
echo "== the shipped build (scripts/build-release.sh), which the real-cluster tests install: built here,"
echo "   not inside the first of them, so no test's time includes minutes of compiling"
bash scripts/build-release.sh > /dev/null
echo "== tests"
cargo nextest run --workspace --locked --no-fail-fast
echo "== fuzz targets, 5 s each (scripts/fuzz.sh; built into /var/cache/plexus-fuzz, outside the clone)"
bash scripts/fuzz.sh 5
