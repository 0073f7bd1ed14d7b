#!/usr/bin/env bash
# Installs plexus on the cluster scripts/cluster.sh brought up, the way users install it: the image
# scripts/build-image.sh builds (this machine's architecture; no shell in it), imported into the
# node's containerd, then either the plain manifests (conf-examples/deploy/{thin,daemon}, applied
# with `kubectl apply -k` through a kustomization of this node's) or the Helm chart
# (deploy/helm/plexus, `helm install`). What differs from a real node is only what a
# kustomization or the chart's values set: the image, and the node's paths (the test node keeps its
# CNI dirs under the cluster's state dir, not in the machine's /opt/cni/bin and /etc/cni/net.d).
# Returns once the DaemonSet's pod has written the meta config (and, in daemon mode, the daemon is
# ready).
#
#   eval "$(bash scripts/cluster.sh up)"; bash scripts/cluster-install.sh
#
# PLEXUS_META_KEYS adds members to the meta config (e.g. '"namespaceIsolation": true'), as an
# admin would in the ConfigMap. PLEXUS_DAEMON_MODE=1 installs daemon mode ("daemonSocket" in the
# meta config). PLEXUS_INSTALL_WITH=helm installs with the chart instead of the manifests;
# PLEXUS_HELM_ARGS adds arguments to `helm install`; PLEXUS_CHART and PLEXUS_IMAGE_TAG install
# another chart and image tag (another release's, its image imported beforehand: tests/tests/rollout.rs).
#
#   bash scripts/cluster-install.sh --uninstall   # as README says: with the manifests, the
#                                                 # DaemonSet in the foreground first, then the rest
set -euo pipefail
cd "$(dirname "$0")/.."
: "${KUBECONFIG:?run scripts/cluster.sh up first and export what it prints}"
state=$(dirname "$KUBECONFIG")
kubectl() { ip netns exec "$NODE_NETNS" "$PEERS_BIN/kubectl" --kubeconfig "$KUBECONFIG" "$@"; }
helm() { ip netns exec "$NODE_NETNS" "$PEERS_BIN/helm" --kubeconfig "$KUBECONFIG" "$@"; }
mode=thin
[ -n "${PLEXUS_DAEMON_MODE:-}" ] && mode=daemon

if [ "${1:-}" = --uninstall ]; then
  if [ "${PLEXUS_INSTALL_WITH:-}" = helm ]; then
    helm uninstall plexus -n kube-system --wait --timeout 300s >&2
  else
    kubectl -n kube-system delete daemonset plexus --cascade=foreground --wait=true --timeout=300s > /dev/null
    kubectl delete -f "conf-examples/deploy/$mode/plexus.yaml" --ignore-not-found --wait=true > /dev/null
  fi
  echo "cluster-install.sh: plexus uninstalled" >&2
  exit 0
fi

image=localhost/plexus:test
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
arch=$(dpkg --print-architecture)
# The image's archive is made once per build and kept beside it: the real-cluster tests install
# the same build a dozen times (each image build: 3 s and 4 CPU seconds, a gzip of 50 MB). Its key
# is what goes into it: the binaries (by name, size and modification time: a build that changes
# one rewrites it; hashing their 60 MB at each install cost more than the rest of it), the
# Containerfile and the script, and the revision (labels).
bin=$(bash scripts/build-release.sh)
images=${CARGO_TARGET_DIR:-$(pwd)/target}/tmp/images
mkdir -p "$images"
key=$({ stat -c '%n %s %.9Y' "$bin"/plexus*; cat deploy/image/Containerfile scripts/build-image.sh; git rev-parse HEAD 2> /dev/null
  git status --porcelain 2> /dev/null; } | sha256sum | cut -c1-16)
archive=$images/plexus-$arch-$key.tar
(
  flock 9
  if [ ! -f "$archive" ]; then
    ARCHES=$arch IMAGE=$image ARCHIVE=$work/image.tar PLEXUS_IMAGE_STORE=$work/podman bash scripts/build-image.sh > /dev/null
    podman --root "$work/podman/root" --runroot "$work/podman/run" --storage-driver vfs rmi -a -f > /dev/null 2>&1 || true
    rm -f "$images/plexus-$arch-"*.tar
    mv "$work/image.tar" "$archive"
  fi
) 9> "$images/.lock"
# Every node's containerd gets the image (`cluster.sh up --nodes N`: node K's files are in
# $state/node-K, its network namespace $NODE_NETNS-nK).
nodes=$(cat "$state/nodes" 2> /dev/null || echo 1)
node_state() { if [ "$1" = 1 ]; then echo "$state"; else echo "$state/node-$1"; fi; }
node_netns() { if [ "$1" = 1 ]; then echo "$NODE_NETNS"; else echo "$NODE_NETNS-n$1"; fi; }
for k in $(seq "$nodes"); do
  ip netns exec "$(node_netns "$k")" "$PEERS_BIN/ctr" -a "$(node_state "$k")/containerd.sock" -n k8s.io images import \
    --platform "linux/$arch" "$archive" > /dev/null
done

socket=$state/run/plexus-daemon.sock
journal=$state/run/network-status
if [ "$mode" = daemon ]; then
  PLEXUS_META_KEYS="\"daemonSocket\": \"$socket\"${PLEXUS_META_KEYS:+, $PLEXUS_META_KEYS}"
fi
# The meta config's keys for this node (the bootstrap bridge stays the cluster network).
keys="\"clusterNetwork\": \"$CLUSTER_NETWORK\", \"cniDir\": \"$PLEXUS_DATA_DIR/meta\", \
\"podResourcesSocket\": \"$state/kubelet/pod-resources/kubelet.sock\", \"logFile\": \"$state/log/plexus.log\", \
\"logLevel\": \"debug\"${PLEXUS_META_KEYS:+, $PLEXUS_META_KEYS}"

if [ "${PLEXUS_INSTALL_WITH:-}" = helm ]; then
  # shellcheck disable=SC2086
  helm install plexus "${PLEXUS_CHART:-deploy/helm/plexus}" -n kube-system --set "mode=$mode" \
    --set image.repository=localhost/plexus --set "image.tag=${PLEXUS_IMAGE_TAG:-test}" --set image.pullPolicy=Never \
    --set "cni.binDir=$CNI_BIN_DIR" --set "cni.confDir=$CNI_CONF_DIR" \
    --set "daemon.socket=$socket" --set "daemon.statusJournal=$journal" \
    --set-json "metaConfig.keys={$keys}" ${PLEXUS_HELM_ARGS:-} > /dev/null
else
  # A kustomization of this node's over the plain manifests: the image, the env that carries the
  # node's paths, and the ConfigMap's meta config.
  cat > "$work/kustomization.yaml" << EOF
resources:
- $(realpath --relative-to="$work" "conf-examples/deploy/$mode")
images:
- {name: localhost/plexus, newTag: test}
patches:
- patch: |
    apiVersion: apps/v1
    kind: DaemonSet
    metadata: {name: plexus, namespace: kube-system}
    spec:
      template:
        spec:
          containers:
          - name: plexus
            imagePullPolicy: Never
            env:
            - {name: CNI_BIN_DIR, value: "$CNI_BIN_DIR"}
            - {name: CNI_CONF_DIR, value: "$CNI_CONF_DIR"}
            - {name: DAEMON_SOCKET, value: "$socket"}
            - {name: STATUS_JOURNAL, value: "$journal"}
- patch: |
    apiVersion: v1
    kind: ConfigMap
    metadata: {name: plexus-config, namespace: kube-system}
    data:
      00-plexus.conflist: |
        {"cniVersion": "1.0.0", "name": "plexus", "plugins": [{"type": "plexus",
         "kubeconfig": "$CNI_CONF_DIR/plexus.d/plexus.kubeconfig", "binDir": "$CNI_BIN_DIR", $keys}]}
EOF
  kubectl apply -k "$work" > /dev/null
fi
# installed: the meta config and its kubeconfig on every node.
installed() {
  local k conf
  for k in $(seq "$nodes"); do
    conf=$(node_state "$k")/net.d
    [ -f "$conf/00-plexus.conflist" ] && [ -f "$conf/plexus.d/plexus.kubeconfig" ] || return 1
  done
}
for _ in $(seq 600); do
  installed && break
  sleep 0.2
done
installed || {
  echo "cluster-install.sh: the DaemonSet did not install plexus" >&2
  kubectl -n kube-system get pods -o wide >&2
  kubectl -n kube-system describe daemonset plexus >&2 || true
  kubectl -n kube-system logs daemonset/plexus --tail 50 >&2 || true
  exit 1
}
if [ "$mode" = daemon ]; then
  kubectl -n kube-system rollout status daemonset/plexus --timeout 120s > /dev/null || {
    echo "cluster-install.sh: plexus-daemon did not become ready" >&2
    kubectl -n kube-system logs daemonset/plexus --tail 50 >&2 || true
    exit 1
  }
fi
echo "cluster-install.sh: plexus installed by its DaemonSet ($mode mode, ${PLEXUS_INSTALL_WITH:-manifests})" >&2
