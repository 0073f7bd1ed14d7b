#!/usr/bin/env bash
# Fetches the current upstream reference plugins — Debian unstable's containernetworking-plugins
# (1.9.x at the time of writing; bookworm's 1.1.1 predates upstream's two-move host-device) —
# into target/tools/cni-upstream/<version>/ and prints that directory. Used by the benchmarks only.
# Verified the way apt verifies: InRelease's signature against Debian's archive keyring, the
# Packages index against InRelease's SHA256, the .deb against the index's SHA256. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/../.."
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=${UPSTREAM_SUITE:-sid}
tools=$(pwd)/target/tools/cni-upstream
source scripts/lib/packages.sh
need_packages curl gpgv debian-archive-keyring xz-utils
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "fetch-upstream-plugins.sh: $*" >&2; exit 1; }

curl -fsS -o "$work/InRelease" "$mirror/dists/$suite/InRelease"
gpgv --keyring /usr/share/keyrings/debian-archive-keyring.gpg --output "$work/Release" "$work/InRelease" 2>/dev/null \
  || fail "the signature of $suite's InRelease does not verify"
index=main/binary-amd64/Packages.xz
want=$(awk -v f="$index" '/^SHA256:/{s=1; next} /^[^ ]/{s=0} s && $3 == f {print $1}' "$work/Release")
[ -n "$want" ] || fail "$index is not listed in $suite's Release"
curl -fsS -o "$work/Packages.xz" "$mirror/dists/$suite/$index"
echo "$want  $work/Packages.xz" | sha256sum -c --quiet - || fail "$index does not match its SHA256"
xz -dc "$work/Packages.xz" > "$work/Packages"
awk '/^Package: containernetworking-plugins$/{p=1} p && /^$/{exit} p' "$work/Packages" > "$work/entry"
version=$(sed -n 's/^Version: //p' "$work/entry")
file=$(sed -n 's/^Filename: //p' "$work/entry")
sum=$(sed -n 's/^SHA256: //p' "$work/entry")
[ -n "$version" ] && [ -n "$file" ] && [ -n "$sum" ] || fail "containernetworking-plugins not found in $suite"
dir=$tools/$version
if [ ! -x "$dir/host-device" ]; then
  curl -fsS -o "$work/plugins.deb" "$mirror/$file"
  echo "$sum  $work/plugins.deb" | sha256sum -c --quiet - || fail "$file does not match its SHA256"
  dpkg-deb -x "$work/plugins.deb" "$work/root"
  mkdir -p "$dir"
  cp "$work/root/usr/lib/cni/"* "$dir/"
fi
echo "$dir"
