#!/usr/bin/env bash
# The test command (README.md; .ci/run calls exactly this). On a fresh machine with only the Rust
# toolchain it installs what the tests need, then runs: fmt check, clippy -D warnings, the build
# of every binary, and the whole suite (scripts/runtests.py, as nextest would). Needs root: the
# tests create namespaces.
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
#   iperf3 iputils-ping          traffic between two nodes' pods (a TCP transfer; ping with don't-fragment)
#   gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user binutils   the arm64 build and its run under qemu
packages=(containernetworking-plugins iproute2 procps protobuf-compiler libprotobuf-dev etcd-server etcd-client
          podman runc containerd busybox-static tar openssl iptables util-linux iperf3 iputils-ping
          gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user binutils python3)
# Each step's time, printed at the end (docs/CONTRIBUTING.md keeps the breakdown).
times=()
step_start=$SECONDS
step() {
  [ -n "${step_name:-}" ] && times+=("$((SECONDS - step_start)) s  $step_name")
  step_name=$1 step_start=$SECONDS
  echo "== $1"
}
# The CPU seconds (user + system) of the processes a shell has waited for: `times` run in that
# shell (not in a $(...), whose own children it would count) into FILE, read back with
# `cpu_in FILE`.
cpu_in() {
  tail -1 "$1" | awk '{ n = 0; for (i = 1; i <= 2; i++) { split($i, t, /[ms]/); n += t[1] * 60 + t[2] } printf "%.0f", n }'
}
# Builds that only later steps need run in the background beside the steps in the foreground
# (2 cores: one build's download, link or serial stretch is the other's CPU), their output in a
# log shown when they fail. `later KEY TITLE CMD...` starts one, `await KEY` waits for it.
bg=$(mktemp -d)
declare -A bg_pid=() bg_title=()
trap 'for p in "${bg_pid[@]}"; do kill -- -"$p" 2> /dev/null || true; done; rm -rf "$bg"' EXIT
later() {
  local key=$1 title=$2
  shift 2
  echo "== started in the background: $title"
  bg_title[$key]=$title
  set -m
  ( s=$SECONDS rc=0; "$@" > "$bg/$key.log" 2>&1 || rc=$?; times > "$bg/$key.times"; echo "$rc $((SECONDS - s)) $(cpu_in "$bg/$key.times")" > "$bg/$key.rc"; exit "$rc" ) &
  set +m
  bg_pid[$key]=$!
}
await() {
  local key=$1 rc secs cpu
  wait "${bg_pid[$key]}" || true
  unset "bg_pid[$key]"
  read -r rc secs cpu < "$bg/$key.rc"
  times+=("$secs s  ${bg_title[$key]} (in the background, $cpu CPU s)")
  if [ "$rc" != 0 ]; then
    tail -60 "$bg/$key.log"
    echo "== ${bg_title[$key]} failed (exit $rc)" >&2
    exit 1
  fi
}

# Disk: a cold run needs about $disk_needed_gb GB on the disk of the clone and /var/cache (the build,
# the peers, the fuzz build, the clusters' state; docs/CONTRIBUTING.md); said up front, so that a
# run that will fill the disk says why before its tests fail on ENOSPC. The footprint is printed
# at the end. No incremental compilation: the test command builds each crate once (2 GB less).
export CARGO_INCREMENTAL=0
disk_needed_gb=20
free_gb() { df --output=avail -BG "$1" | tail -1 | tr -dc 0-9; }
for d in . /var/cache; do
  if [ "$(free_gb "$d")" -lt "$disk_needed_gb" ]; then
    echo "scripts/test.sh: warning: $(free_gb "$d") GB free on the disk of $d; a cold run needs about $disk_needed_gb GB" >&2
  fi
done

step "Debian packages"
need_packages "${packages[@]}"
# The arm64 build's Rust target, added here: rustup is not to be run twice at once, and the fuzz
# job below installs the nightly toolchain.
need_rust_target aarch64-unknown-linux-gnu
# How the lints run (see the clippy step): the workspace's compiler and its arguments.
clippy_driver=$(rustup which clippy-driver) clippy_args=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__
# Started now, needed later: the peers (Kubernetes, etcd, containerd, crictl, whereabouts, helm,
# reference plugins, built from tests/peers/ into a cache outside the clone: minutes the first
# time, nothing after), the shipped build, which the real-cluster tests install, and cnitool.
later peers "the peers (scripts/peers.sh)" bash scripts/peers.sh
later release "the shipped build (scripts/build-release.sh)" bash scripts/build-release.sh
# Built from Debian's source package; the tests drive plexus through it.
later cnitool "cnitool (scripts/tools/build-cnitool.sh)" bash scripts/tools/build-cnitool.sh
# The previous release (CHANGELOG.md's newest), from its commit, unoptimised, cached outside the
# clone by commit: the version-skew tests run it beside this tree's build. At nice 10: it is
# needed only when the tests start.
previous() {
  renice -n 10 -p "$BASHPID" > /dev/null
  bash scripts/previous-release.sh
}
later previous "the previous release (scripts/previous-release.sh), at nice 10" previous
# At low priority, from the start, so they take only what CPU the rest leaves: the arm64 build
# (nice 10), then, once the tests' own build is done ($bg/built), checked under qemu-user (its
# entry-point checks, the demo, the image index of both architectures); and, at the lowest (nice
# 19), the fuzz targets' build, then, while the tests run, each target fuzzed for 5 s after its
# regressions. The arm64 build is the release profile unoptimised (release-unoptimized,
# Cargo.toml): the same code with the release profile's semantics, cross-compiled and linked as
# shipped, without LLVM's optimisations and the fat-LTO links (216 CPU seconds from scratch against
# 672 at opt-level 3 without LTO, and some 1,000 with it; `bash scripts/arm64-check.sh` alone
# checks the shipped profile). The arm64 build has a target dir of its own
# (cargo's locks never make one build wait for another); the fuzz targets build into
# /var/cache/plexus-fuzz. Their reports are shown after the tests.
fuzzing() {
  renice -n 19 -p "$BASHPID" > /dev/null
  export PLEXUS_FUZZ_OPT_LEVEL=1
  bash scripts/fuzz.sh --build-only || return
  until [ -e "$bg/testing" ]; do sleep 1; done
  # Two targets at a time (each fuzzer uses one core): the runs end a cold run, 44 s instead of 82.
  PLEXUS_FUZZ_JOBS=2 bash scripts/fuzz.sh 5 > "$bg/fuzz.out" 2>&1 || { cat "$bg/fuzz.out"; return 1; }
}
arm64() {
  renice -n 10 -p "$BASHPID" > /dev/null
  export PLEXUS_PROFILE=release-unoptimized
  bash scripts/arm64-check.sh --build-only > /dev/null || return
  until [ -e "$bg/built" ]; do sleep 1; done
  RUSTC_WORKSPACE_WRAPPER=$clippy_driver CLIPPY_ARGS=$clippy_args bash scripts/arm64-check.sh > "$bg/arm64.out" 2>&1 ||
    { cat "$bg/arm64.out"; return 1; }
}
later fuzzing "the fuzz targets: build and 5-second runs, at nice 19" fuzzing
later arm64 "the arm64 build and its check, at nice 10" arm64
step "cargo fmt --check"
cargo fmt --all -- --check
# clippy's driver is rustc with clippy's lints: made the workspace's compiler (dependencies are
# compiled by rustc as ever), one build lints every target with -D warnings, exactly as
# `cargo clippy --workspace --all-targets -- -D warnings`, and makes the binaries the tests exec
# and the tests themselves, where clippy and then the build compiled every dependency twice.
# CLIPPY_ARGS is how cargo-clippy hands its arguments to the driver; the probe shows the driver
# takes them (a lint it must deny) before the build relies on it. The later cargo commands here
# (the test runner's, the arm64 check's) keep both variables, so they build nothing again.
step "cargo clippy -D warnings and the build of every target, in one pass"
export RUSTC_WORKSPACE_WRAPPER=$clippy_driver CLIPPY_ARGS=$clippy_args
if echo 'pub fn f(v: &Vec<u8>) -> usize { v.len() }' | CARGO_PRIMARY_PACKAGE=1 "$RUSTC_WORKSPACE_WRAPPER" rustc - \
    --edition 2024 --crate-type lib --crate-name probe --emit metadata -o "$bg/probe.rmeta" 2> /dev/null; then
  echo "scripts/test.sh: clippy-driver did not deny clippy::ptr_arg with CLIPPY_ARGS=$CLIPPY_ARGS" >&2
  exit 1
fi
cargo build --workspace --all-targets --locked
touch "$bg/built"
step "waiting for the shipped build, the peers, cnitool and the previous release"
await release
await peers
await cnitool
await previous
# The tests run by scripts/runtests.py as cargo-nextest would run them (a process each, scheduled
# by .config/nextest.toml: groups, priorities, the timeout), every one of them whatever fails: a
# fresh machine would compile nextest first, 165 CPU seconds of a run that is short of CPU.
step "tests"
touch "$bg/testing"
python3 scripts/runtests.py --workspace --locked
step "waiting for the fuzz runs and the arm64 check"
await fuzzing
await arm64
# The regressions replayed, then each target fuzzed for 5 s (scripts/fuzz.sh).
echo "== fuzz targets, 5 s each"
cat "$bg/fuzz.out"
# The shipped build cross-compiled for aarch64 and run under qemu-user; the image index of both.
echo "== linux/arm64 (scripts/arm64-check.sh)"
tail -3 "$bg/arm64.out"
step done
echo "== disk: $(du -sh target | cut -f1) target, $(du -shc /var/cache/plexus-* 2> /dev/null | tail -1 | cut -f1) /var/cache/plexus-*, $(free_gb .) GB left"
echo "== time by step"
printf '  %s\n' "${times[@]}"
times > "$bg/all.times"
echo "  $SECONDS s  in all ($(cpu_in "$bg/all.times") CPU s)"
