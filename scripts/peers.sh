#!/usr/bin/env bash
# Builds the peers plexus is tested and measured beside — Kubernetes (kube-apiserver, kubelet,
# kube-controller-manager, kube-scheduler, kubectl), etcd 3.6, containerd 2.0 (+ shim, ctr),
# crictl, Multus v4 (thin and thick), whereabouts and the current reference plugins — from their
# Go modules, pinned in tests/peers/*/go.{mod,sum}. Nothing of theirs is committed.
#
# The binaries go into a cache outside the clone, keyed by the hash of those go.mod/go.sum files,
# so a repeat run (CI's too) reuses them; the Go module and build caches live there as well.
# Prints the directory of the binaries (under their upstream names) on stdout; progress on stderr.
#
#   bash scripts/peers.sh            # build what is missing, print the bin dir
#   PLEXUS_PEERS_CACHE=/dir bash scripts/peers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)

cache=${PLEXUS_PEERS_CACHE:-/var/cache/plexus-peers}
key=$(cat tests/peers/*/go.mod tests/peers/*/go.sum 2>/dev/null | sha256sum | cut -c1-16)
bin=$cache/$key/bin
if [ -f "$bin/.complete" ]; then
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || { echo "peers.sh: Go is needed (the machines have it)" >&2; exit 1; }
mkdir -p "$cache"
export GOMODCACHE=$cache/gomod GOCACHE=$cache/gobuild
# Static binaries; the toolchain the machine has (its go.mod files ask for go 1.24).
export CGO_ENABLED=0 GOTOOLCHAIN=${GOTOOLCHAIN:-local} GOFLAGS=-mod=readonly
partial=$cache/$key/bin.partial
rm -rf "$partial"
mkdir -p "$partial"

# build MODULE OUTPUT PACKAGE [LDFLAGS]: one binary from one pinned module.
build() {
  local module=$1 out=$2 pkg=$3 ldflags=${4:-}
  local started=$SECONDS
  (cd "$top/tests/peers/$module" && go build -trimpath -ldflags "-s -w $ldflags" -o "$partial/$out" "$pkg")
  echo "peers.sh: $out ($module) in $((SECONDS - started)) s" >&2
}

k8s_version=$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' tests/peers/kubernetes/go.mod)
minor=$(echo "$k8s_version" | cut -d. -f2)
k8s_ldflags="-X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1"
k8s_ldflags+=" -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
k8s_ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version"
for c in kube-apiserver kubelet kube-controller-manager kube-scheduler kubectl; do
  build kubernetes "$c" "k8s.io/kubernetes/cmd/$c" "$k8s_ldflags"
done
build etcd etcd go.etcd.io/etcd/server/v3
build etcd etcdctl go.etcd.io/etcd/etcdctl/v3
for c in containerd containerd-shim-runc-v2 ctr; do
  build containerd "$c" "github.com/containerd/containerd/v2/cmd/$c"
done
build cri-tools crictl sigs.k8s.io/cri-tools/cmd/crictl
for c in multus multus-daemon multus-shim; do
  build multus "$c" "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/$c"
done
build whereabouts whereabouts github.com/k8snetworkplumbingwg/whereabouts/cmd
for p in main/macvlan main/host-device main/bridge main/loopback ipam/host-local ipam/static meta/tuning meta/sbr; do
  build plugins "$(basename "$p")" "github.com/containernetworking/plugins/plugins/$p"
done

touch "$partial/.complete"
rm -rf "$bin"
mv "$partial" "$bin"
echo "$bin"
