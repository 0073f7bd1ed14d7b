#!/usr/bin/env bash
# plexus on linux/arm64, checked on this amd64 machine: the shipped build cross-compiled for
# aarch64 (scripts/build-release.sh with PLEXUS_ARCH=arm64), then run under qemu-user through
# binfmt_misc, so that plexus exec'ing its delegates runs them under qemu too:
#   - the entry point's spec-corner checks (tests/tests/entry_point.rs: the same bad input yields
#     the reference plugin's code and message) against the arm64 binaries;
#   - the demo's ADD and DEL through `plexus` in namespaces (scripts/demo.sh, arm64 binaries).
# PLEXUS_PROFILE=release-unoptimized checks that profile's build instead of the shipped one (the
# test command does: the same code with the release profile's semantics, unoptimised, Cargo.toml).
# scripts/test.sh runs it after the test suite. It registers a binfmt_misc handler for aarch64
# ELF files when none is there, and removes only the one it registered.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/packages.sh
source scripts/lib/shipped.sh
[ "$(id -u)" = 0 ] || { echo "arm64-check.sh: run as root (binfmt_misc, namespaces)" >&2; exit 1; }
[ "$(uname -m)" = aarch64 ] && { echo "arm64-check.sh: this machine is arm64 already: the test suite runs there" >&2; exit 0; }
need_packages qemu-user binutils python3

# The shipped binaries and the test plugin the entry-point checks run (`--build-only`: that build
# alone, its directory printed; scripts/test.sh builds it early, checks it after the tests).
echo "== the arm64 build (scripts/build-release.sh, PLEXUS_ARCH=arm64)" >&2
BIN=$(PLEXUS_ARCH=arm64 bash scripts/build-release.sh "${SHIPPED_BUILD[@]}" --bin plexus-test-plugin)
if [ "${1:-}" = --build-only ]; then
  echo "$BIN"
  exit 0
fi
for b in plexus plexus-macvlan plexus-ipam plexus-test-plugin; do
  readelf -h "$BIN/$b" | grep -q 'Machine:.*AArch64' || { echo "arm64-check.sh: $BIN/$b is not an aarch64 binary" >&2; exit 1; }
done

binfmt=/proc/sys/fs/binfmt_misc
mountpoint -q "$binfmt" || mount -t binfmt_misc binfmt_misc "$binfmt"
ours=
trap '[ -z "$ours" ] || echo -1 > "$binfmt/$ours"' EXIT
if ! grep -qls 'magic 7f454c460201010000000000000000000200b700' "$binfmt"/* 2> /dev/null; then
  # ELF, 64-bit, little-endian, executable or shared object, machine 0xb7 (AArch64).
  ours=plexus-aarch64-$$
  # The kernel reads the \x escapes itself: they are written as text, not as bytes (a NUL byte
  # would end the magic early, and every 64-bit ELF file, this machine's own, would go to qemu).
  magic='\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00'
  mask='\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff'
  echo ":$ours:M::$magic:$mask:$(command -v qemu-aarch64):F" > "$binfmt/register"
  # This machine's own binaries must still run natively.
  /bin/true || { echo -1 > "$binfmt/$ours"; echo "arm64-check.sh: the handler took native binaries" >&2; exit 1; }
fi
echo '{"cniVersion": "1.0.0"}' | CNI_COMMAND=VERSION "$BIN/plexus" | grep -q supportedVersions \
  || { echo "arm64-check.sh: the arm64 plexus does not run under qemu-user" >&2; exit 1; }

echo "== the entry point's spec-corner checks, arm64 binaries under qemu-user"
# The workspace's feature set, as the test command's own build and run: `-p plexus-tests` alone
# would unify features differently and build a dozen dependencies again (a minute on a fresh
# machine); only the entry_point binary runs.
PLEXUS_TEST_BIN_DIR=$BIN python3 scripts/runtests.py -E 'binary(entry_point)' --workspace --locked

echo "== the demo: ADD and DEL through plexus, arm64 binaries under qemu-user"
out=$(PLEXUS_DEMO_BIN=$BIN bash scripts/demo.sh 2>&1) || { echo "$out"; exit 1; }
echo "$out" | grep -q '"address": "198.18.100.2/24"' || { echo "$out"; echo "arm64-check.sh: no address in the ADD result" >&2; exit 1; }
echo "$out" | grep -q 'interfaces left in the pod: lo $' || { echo "$out"; echo "arm64-check.sh: DEL left interfaces" >&2; exit 1; }
echo "$out" | grep -q 'addresses held in the IPAM store: 0' || { echo "$out"; echo "arm64-check.sh: DEL left reservations" >&2; exit 1; }

echo "== the DaemonSet image for linux/amd64 and linux/arm64 (scripts/build-image.sh), one index"
work=$(mktemp -d)
trap '[ -z "$ours" ] || echo -1 > "$binfmt/$ours"; rm -rf "$work"' EXIT
# The arm64 binaries checked above; amd64's are the shipped build (the release profile).
ARCHES="amd64 arm64" IMAGE=localhost/plexus:check ARCHIVE=$work/image.tar PLEXUS_IMAGE_STORE=$work/store \
  PLEXUS_BIN_DIR_ARM64=$BIN env -u PLEXUS_PROFILE bash scripts/build-image.sh > /dev/null
mkdir "$work/oci" && tar -C "$work/oci" -xf "$work/image.tar"
python3 scripts/bench/benchtool.py image-index "$work/oci" "$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)" "${SHIPPED[@]}"
echo "arm64-check.sh: arm64 ADD/DEL through plexus and the entry point's checks pass under qemu-user; the image index holds both architectures"
