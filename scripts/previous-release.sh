#!/usr/bin/env bash
# Builds the previous release of plexus — the newest release CHANGELOG.md lists, from the commit
# its heading names — for the version-skew tests (tests/tests/skew.rs) and the rollout from it
# (tests/tests/rollout.rs): its shipped binaries with its own scripts/build-release.sh, in the
# release profile unoptimised (release-unoptimized: the release profile's semantics, statically
# linked as shipped, without LLVM's optimisations and the fat-LTO links), from `git archive` of the
# commit (the clone's history holds it; a shallow clone does not). Cached outside the clone by
# commit (PLEXUS_PREVIOUS_CACHE, default /var/cache/plexus-previous): built once per machine.
# target/tools/previous points at the release: bin/ (the binaries) and deploy/ (its chart, image
# file and manifests, as it shipped them); prints that directory.
#
#   bash scripts/previous-release.sh
set -euo pipefail
cd "$(dirname "$0")/.."
commit=$(sed -n 's/^## [0-9][^ ]* .*(commit \([0-9a-f]\{40\}\)).*/\1/p' CHANGELOG.md | head -n 1)
[ -n "$commit" ] || { echo "previous-release.sh: CHANGELOG.md names no release commit" >&2; exit 1; }
git cat-file -e "$commit^{commit}" 2> /dev/null || {
  echo "previous-release.sh: commit $commit (CHANGELOG.md's newest release) is not in this clone's history" >&2
  exit 1
}
cache=${PLEXUS_PREVIOUS_CACHE:-/var/cache/plexus-previous}/$commit
link=$(pwd)/target/tools/previous
mkdir -p "$cache" "$(dirname "$link")"
exec 9> "$cache/.lock"
flock 9
if [ ! -x "$cache/release/bin/plexus" ]; then
  rm -rf "$cache/src" "$cache/release.new"
  mkdir -p "$cache/src" "$cache/release.new/bin"
  git archive "$commit" | tar -x -C "$cache/src"
  bin=$(cd "$cache/src" && CARGO_TARGET_DIR="$cache/target" PLEXUS_PROFILE=release-unoptimized bash scripts/build-release.sh)
  source scripts/lib/shipped.sh
  for b in "${SHIPPED[@]}"; do cp "$bin/$b" "$cache/release.new/bin/"; done
  cp -r "$cache/src/deploy" "$cache/release.new/deploy"
  mv "$cache/release.new" "$cache/release"
  # What a rebuild would need goes; the release is what is used.
  rm -rf "$cache/target" "$cache/src"
fi
ln -sfn "$cache/release" "$link"
echo "$link"
