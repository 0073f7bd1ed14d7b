#!/usr/bin/env bash
# Builds the peers plexus is tested and measured beside — Kubernetes (kube-apiserver, kubelet,
# kube-controller-manager, kube-scheduler, kubectl), etcd 3.6, containerd 2.0 (+ shim, ctr),
# crictl, Multus v4 (thin and thick), whereabouts (and one run of its reconciler), helm 4 and
# the current reference plugins — from their Go modules, pinned in tests/peers/*/go.{mod,sum}.
# Nothing of theirs is committed. Plus a test device plugin of ours (tests/peers/deviceplugin),
# built the same way.
#
# The binaries go into a cache outside the clone, per module keyed by the hash of its go.mod/go.sum
# (and, for tests/peers/deviceplugin, our test device plugin, its Go source), so a repeat run (CI's
# too) reuses them and a changed module rebuilds alone; the Go module and build caches live there
# during a build and are removed after it (see the end).
# One build cache serves every module, and a package compiles once for all of them when its
# version and those of everything below it are the same: so the modules of Multus, whereabouts and
# the test device plugin and the Kubernetes module require the same versions of what they share
# (k8s.io/client-go, api, apimachinery, kubelet, grpc, golang.org/x/..., otel), each raised to the
# highest of them (`go get`, never lowered: Multus v4.2.3 asks for newer grpc and golang.org/x
# than Kubernetes 1.34.4, Kubernetes for newer k8s.io than Multus): whereabouts then builds in 3
# CPU seconds after Kubernetes instead of 129, and Multus needs only its own and the CNI
# libraries' 42 packages. Not containerd 2.0 (it does not compile against cri-api 0.34) nor crictl (its newer grpc and
# otel would raise some 40 of Kubernetes' modules), nor etcd or helm (newer than Kubernetes 1.34).
# Prints the directory of the binaries (under their upstream names) on stdout; progress on stderr.
#
#   bash scripts/peers.sh            # build what is missing, print the bin dir
#   PLEXUS_PEERS_CACHE=/dir bash scripts/peers.sh
#   bash scripts/peers.sh dranet     # a peer only a benchmark uses: its own bin dir
#
# Peers only a benchmark uses (dranet, for scripts/bench/dra.sh; kwok, for the hollow nodes of
# `cluster.sh up --hollow`; nodeslice, whereabouts' node-slice controller for their benchmark's
# `--hollow-stack nodeslice`) are not in the set the tests use:
# `peers.sh MODULE` builds that module alone (cached the same way) and prints its directory.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)

cache=${PLEXUS_PEERS_CACHE:-/var/cache/plexus-peers}
# What each pinned module builds (module dir under tests/peers: binary=package ...).
k8s_version=$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' tests/peers/kubernetes/go.mod)
declare -A binaries=(
  [kubernetes]="kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver kubelet=k8s.io/kubernetes/cmd/kubelet
    kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager
    kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler kubectl=k8s.io/kubernetes/cmd/kubectl"
  [etcd]="etcd=go.etcd.io/etcd/server/v3 etcdctl=go.etcd.io/etcd/etcdctl/v3"
  [containerd]="containerd=github.com/containerd/containerd/v2/cmd/containerd
    containerd-shim-runc-v2=github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
    ctr=github.com/containerd/containerd/v2/cmd/ctr"
  [cri-tools]="crictl=sigs.k8s.io/cri-tools/cmd/crictl"
  [multus]="multus=gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus
    multus-daemon=gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-daemon
    multus-shim=gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-shim"
  [whereabouts]="whereabouts=github.com/k8snetworkplumbingwg/whereabouts/cmd
    whereabouts-reconcile=plexus.local/peers/whereabouts"
  [plugins]="macvlan=github.com/containernetworking/plugins/plugins/main/macvlan
    host-device=github.com/containernetworking/plugins/plugins/main/host-device
    bridge=github.com/containernetworking/plugins/plugins/main/bridge
    loopback=github.com/containernetworking/plugins/plugins/main/loopback
    host-local=github.com/containernetworking/plugins/plugins/ipam/host-local
    static=github.com/containernetworking/plugins/plugins/ipam/static
    tuning=github.com/containernetworking/plugins/plugins/meta/tuning
    sbr=github.com/containernetworking/plugins/plugins/meta/sbr"
  [deviceplugin]="plexus-test-device-plugin=plexus.test/deviceplugin"
  [helm]="helm=helm.sh/helm/v4/cmd/helm"
)
# Peers of the benchmarks only (`peers.sh MODULE`).
declare -A bench_binaries=(
  [dranet]="dranet=github.com/google/dranet/cmd/dranet"
  [kwok]="kwok=sigs.k8s.io/kwok/cmd/kwok"
  [nodeslice]="whereabouts-node-slice-controller=github.com/k8snetworkplumbingwg/whereabouts/cmd/nodeslicecontroller"
)
# Files of a module the scripts read besides its binaries (module path:dir): whereabouts' CRDs
# and DaemonSet manifest (scripts/cluster.sh, the benchmarks), Multus's manifests (the
# benchmarks). Copied to share/MODULE/DIR beside the set's bin dir ($PEERS_BIN/../share).
declare -A shares=(
  [whereabouts]="github.com/k8snetworkplumbingwg/whereabouts:doc/crds"
  [multus]="gopkg.in/k8snetworkplumbingwg/multus-cni.v4:deployments"
)
# A module's key: its go.mod, go.sum and our own Go sources (the test tools); the set's key: the
# modules' keys. A change to one module rebuilds only that module.
module_key() {
  local files=("tests/peers/$1/go.mod" "tests/peers/$1/go.sum")
  shopt -s nullglob
  files+=("tests/peers/$1/"*.go)
  shopt -u nullglob
  cat "${files[@]}" | sha256sum | cut -c1-16
}
modules=$(printf '%s\n' "${!binaries[@]}" | sort)
key=$(for m in $modules; do echo "$m $(module_key "$m")"; done | sha256sum | cut -c1-16)
bin=$cache/$key/bin
if [ $# -eq 0 ] && [ -f "$bin/.complete" ] && [ -d "$cache/$key/share" ]; then
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || { echo "peers.sh: Go is needed (the machines have it)" >&2; exit 1; }
mkdir -p "$cache"
export GOMODCACHE=$cache/gomod GOCACHE=$cache/gobuild
# Static binaries; the toolchain the machine has (its go.mod files ask for go 1.24).
export CGO_ENABLED=0 GOTOOLCHAIN=${GOTOOLCHAIN:-local} GOFLAGS=-mod=readonly
# The linker drops the debug info (-w) and the symbol table (-s); the compiler is told not to make
# the debug info in the first place (-dwarf=false): a fifth less compile time (helm: 285 -> 231
# CPU seconds) for the same stripped binaries.
# The compiler collects its garbage only when its heap nears 2 GiB (GOGC=off GOMEMLIMIT=2GiB, for
# the build only, never for the binaries it makes): whereabouts from a cold build cache in 105
# user + 24 system CPU seconds, against 119 + 21 at GOGC=400 and 160 user at Go's default; each
# compile at most 1 GB (600 MB at GOGC=400): the machines have 23 GB for two compiles at a time.
export GOGC=off GOMEMLIMIT=2GiB

minor=$(echo "$k8s_version" | cut -d. -f2)
k8s_ldflags="-X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1"
k8s_ldflags+=" -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
k8s_ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version"

# build_module MODULE: its binaries into $cache/modules/MODULE-KEY (kept for later sets).
build_module() {
  local module=$1 dir ldflags="" spec out pkg started
  dir=$cache/modules/$module-$(module_key "$module")
  [ -f "$dir/.complete" ] && return 0
  [ "$module" = kubernetes ] && ldflags=$k8s_ldflags
  rm -rf "$dir.partial"
  mkdir -p "$dir.partial"
  for spec in ${binaries[$module]}; do
    out=${spec%%=*} pkg=${spec#*=} started=$SECONDS
    (cd "$top/tests/peers/$module" && go build -trimpath -gcflags=all=-dwarf=false -ldflags "-s -w $ldflags" -o "$dir.partial/$out" "$pkg")
    echo "peers.sh: $out ($module) in $((SECONDS - started)) s" >&2
  done
  touch "$dir.partial/.complete"
  rm -rf "$dir"
  mv "$dir.partial" "$dir"
}

# share_module MODULE: its files of ${shares[MODULE]} into $share/MODULE (the module's source from
# the module cache, downloaded when missing).
share_module() {
  local module=$1 spec mod path src
  for spec in ${shares[$module]:-}; do
    mod=${spec%%:*} path=${spec#*:}
    src=$(cd "$top/tests/peers/$module" && go mod download -json "$mod" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [ -d "$src/$path" ] || { echo "peers.sh: $mod has no $path" >&2; exit 1; }
    mkdir -p "$share/$module/$(dirname "$path")"
    cp -r "$src/$path" "$share/$module/$path"
  done
}

# The Go module and build caches (6 GB after a cold build) serve only a later build of a changed
# module; the binaries are what the tests use. Removed after a build unless asked to keep them:
# the test command ran out of disk on a CI machine with them. PLEXUS_PEERS_KEEP_GO_CACHES=1 keeps
# them.
clean_go_caches() {
  [ "${PLEXUS_PEERS_KEEP_GO_CACHES:-0}" = 1 ] && return 0
  go clean -cache -modcache
  rm -rf "$GOCACHE" "$GOMODCACHE"
}

if [ $# -gt 0 ]; then
  [ -n "${bench_binaries[$1]:-}" ] || { echo "peers.sh: no benchmark peer $1 (${!bench_binaries[*]})" >&2; exit 2; }
  binaries[$1]=${bench_binaries[$1]}
  dir=$cache/modules/$1-$(module_key "$1")
  [ -f "$dir/.complete" ] || { build_module "$1"; clean_go_caches; }
  echo "$dir"
  exit 0
fi

partial=$cache/$key/bin.partial share=$cache/$key/share.partial
rm -rf "$partial" "$share"
mkdir -p "$partial" "$share"
for m in $modules; do
  build_module "$m"
  for spec in ${binaries[$m]}; do
    ln -f "$cache/modules/$m-$(module_key "$m")/${spec%%=*}" "$partial/${spec%%=*}"
  done
  share_module "$m"
done
chmod -R u+w "$share"
rm -rf "$cache/$key/share"
mv "$share" "$cache/$key/share"
touch "$partial/.complete"
rm -rf "$bin"
mv "$partial" "$bin"
clean_go_caches
echo "$bin"
