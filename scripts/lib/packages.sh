# Sourced by every script that needs Debian packages: `need_packages p...` installs those of the
# named packages that are not installed yet (one `apt-get update` and one install, quiet, no
# recommends), and does nothing when all are there. Output goes to stderr, so scripts that print
# a result on stdout (build-release.sh, peers.sh) stay usable in $(...).
need_packages() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "== installing ${missing[*]}" >&2
  apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
}

# `need_rust_target TRIPLE`: the Rust standard library for TRIPLE added with rustup when missing
# (build-release.sh for a cross build; test.sh before its background jobs, as rustup is not to be
# run twice at once).
need_rust_target() {
  rustup target list --installed | grep -qx "$1" || rustup target add "$1" >&2
}
