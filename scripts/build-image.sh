#!/usr/bin/env bash
# Builds plexus's DaemonSet image (deploy/image/Containerfile) from the shipped static binaries,
# for linux/amd64 and linux/arm64, joined in one image index (a multi-arch manifest list), with
# Podman from Debian's packages. The image holds /plexus/bin and nothing else; no architecture
# needs emulation to build it (there is no RUN step).
#
#   bash scripts/build-image.sh                          # localhost/plexus:<version>, both architectures
#   IMAGE=registry.example/plexus:0.1.0 bash scripts/build-image.sh
#   ARCHES=amd64 bash scripts/build-image.sh             # one architecture
#   ARCHIVE=/tmp/plexus.tar bash scripts/build-image.sh  # also an OCI archive of the index
#   podman manifest push --all registry.example/plexus:0.1.0 docker://registry.example/plexus:0.1.0
#
# PLEXUS_IMAGE_STORE=DIR keeps Podman's storage in DIR (vfs driver) instead of the machine's.
# PLEXUS_BIN_DIR=DIR takes the binaries from DIR instead of building them (one architecture's:
# ARCHES names it); PLEXUS_BIN_DIR_ARM64 (or _AMD64) does so for that architecture alone.
# Prints the image name on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/packages.sh
need_packages podman
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
revision=$(git rev-parse HEAD 2> /dev/null || echo unknown)
[ -z "$(git status --porcelain 2> /dev/null)" ] || revision+="-dirty"
source_url=$(git remote get-url origin 2> /dev/null | grep -E '^https://' || true)
IMAGE=${IMAGE:-localhost/plexus:$version}
ARCHES=${ARCHES:-amd64 arm64}
# What the image carries: the shipped binaries (not the test ones the workspace build makes too).
source scripts/lib/shipped.sh

store=()
if [ -n "${PLEXUS_IMAGE_STORE:-}" ]; then
  store=(--root "$PLEXUS_IMAGE_STORE/root" --runroot "$PLEXUS_IMAGE_STORE/run" --storage-driver vfs)
fi
podman() { command podman "${store[@]}" "$@"; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

podman manifest rm "$IMAGE" > /dev/null 2>&1 || true
podman rmi -f "$IMAGE" > /dev/null 2>&1 || true
podman manifest create "$IMAGE" > /dev/null
for arch in $ARCHES; do
  # The same build the tests use (the shipped binaries), so nothing is built twice.
  arch_dir=PLEXUS_BIN_DIR_${arch^^}
  bin=${!arch_dir:-${PLEXUS_BIN_DIR:-$(PLEXUS_ARCH=$arch bash scripts/build-release.sh)}}
  mkdir -p "$work/$arch/bin"
  for b in "${SHIPPED[@]}"; do cp "$bin/$b" "$work/$arch/bin/"; done
  echo "== image for linux/$arch" >&2
  podman build -q --format oci --platform "linux/$arch" --manifest "$IMAGE" \
    --timestamp "$(git log -1 --format=%ct 2> /dev/null || echo 0)" \
    --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
    ${source_url:+--label "org.opencontainers.image.source=$source_url"} \
    -f deploy/image/Containerfile "$work/$arch" > /dev/null
done
if [ -n "${ARCHIVE:-}" ]; then
  rm -f "$ARCHIVE"
  podman manifest push -q --all --format oci "$IMAGE" "oci-archive:$ARCHIVE:$IMAGE" >&2
fi
echo "$IMAGE"
