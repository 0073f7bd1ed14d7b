#!/usr/bin/env bash
# Builds cnitool — the CNI project's own runner, the reference client of libcni — from Debian's
# source package, offline (GOPROXY=off, the library from golang-github-appc-cni-dev), into
# target/tools/cnitool. Idempotent: does nothing when it is there.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(pwd)/target/tools/cnitool
[ -x "$out" ] && exit 0
source scripts/lib/packages.sh
# cnitool's source comes from Debian's source package: deb-src lines first, then one update.
if ! grep -rqs '^Types: deb-src' /etc/apt/sources.list.d/ 2>/dev/null && ! grep -qs '^deb-src' /etc/apt/sources.list 2>/dev/null; then
  sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > /etc/apt/sources.list.d/debian-src.sources
  apt-get update -q
fi
need_packages golang-go golang-github-appc-cni-dev xz-utils dpkg-dev
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get source -q --download-only golang-github-appc-cni=1.1.2-1 >/dev/null 2>&1 \
  && tar xJf golang-github-appc-cni_1.1.2.orig.tar.xz)
src=$(find "$work" -path '*/cnitool/cnitool.go' | head -n 1)
[ -n "$src" ] || { echo "build-cnitool.sh: cnitool source not found in the Debian source package" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
GO111MODULE=off GOPATH=/usr/share/gocode GOPROXY=off GOCACHE="$work/gocache" \
  go build -o "$out" "$src"
echo "built $out"
