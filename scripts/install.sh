#!/usr/bin/env bash
# Installs plexus into a CNI bin dir: builds the release binaries (scripts/build-release.sh) and
# copies them in atomically. Only plexus's own file names are ever written; a manifest
# (.plexus-installed) records what was installed so --uninstall removes exactly that.
#
#   scripts/install.sh [--bin-dir DIR] [--uninstall]      (DESTDIR is honoured)
#   PLEXUS_BIN=DIR installs already-built binaries from DIR instead of building.
set -euo pipefail
cd "$(dirname "$0")/.."
bin_dir=/opt/cni/bin
uninstall=
while [ $# -gt 0 ]; do
  case "$1" in
    --bin-dir) bin_dir=$2; shift 2 ;;
    --bin-dir=*) bin_dir=${1#*=}; shift ;;
    --uninstall) uninstall=1; shift ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
target="${DESTDIR:-}$bin_dir"
manifest="$target/.plexus-installed"
source scripts/lib/shipped.sh
binaries=("${SHIPPED[@]}")

if [ -n "$uninstall" ]; then
  [ -f "$manifest" ] || { echo "nothing installed by plexus in $target"; exit 0; }
  while read -r name; do
    case " ${binaries[*]} " in *" $name "*) ;; *) continue ;; esac   # only our own names
    rm -f "$target/$name" && echo "removed $target/$name"
  done < "$manifest"
  rm -f "$manifest"
  exit 0
fi

built=${PLEXUS_BIN:-$(bash scripts/build-release.sh)}
mkdir -p "$target"
: > "$manifest.new"
for b in "${binaries[@]}"; do
  install -m 0755 "$built/$b" "$target/.$b.new"
  mv -f "$target/.$b.new" "$target/$b"
  echo "$b" >> "$manifest.new"
  echo "installed $target/$b"
done
mv -f "$manifest.new" "$manifest"
