#!/usr/bin/env bash
# Installs plexus on the cluster scripts/cluster.sh brought up, the way users install it: an image
# built locally from the release binaries (scripts/build-release.sh) and a busybox shell, imported
# into the node's containerd, then conf-examples/deploy/{crd,rbac,daemonset}.yaml applied with
# kubectl. The only changes to the manifests are the image name and the host paths (the test node
# keeps its CNI dirs under the cluster's state dir instead of the machine's /opt/cni/bin and
# /etc/cni/net.d). Returns once the DaemonSet's pod has written the meta config.
#
#   eval "$(bash scripts/cluster.sh up)"; bash scripts/cluster-install.sh
#
# PLEXUS_META_KEYS adds members to the meta config (e.g. '"namespaceIsolation": true'), as an
# admin would in the DaemonSet's config. PLEXUS_DAEMON_MODE=1 installs daemon mode instead
# (conf-examples/deploy/daemonset-daemon.yaml, "daemonSocket" in the meta config) and returns once
# plexus-daemon is ready too.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${KUBECONFIG:?run scripts/cluster.sh up first and export what it prints}"
state=$(dirname "$KUBECONFIG")
image=localhost/plexus:test
kubectl() { ip netns exec "$NODE_NETNS" "$PEERS_BIN/kubectl" --kubeconfig "$KUBECONFIG" "$@"; }

BIN=$(bash scripts/build-release.sh)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/rootfs/bin" "$work/rootfs/plexus/bin" "$work/rootfs/plexus/conf" "$work/rootfs/tmp"
cp /bin/busybox "$work/rootfs/bin/busybox"
for t in sh cp mv mkdir chmod cat base64 sha256sum sleep; do ln -s busybox "$work/rootfs/bin/$t"; done
for b in plexus plexus-macvlan plexus-host-device plexus-ipam plexusctl plexus-daemon; do cp "$BIN/$b" "$work/rootfs/plexus/bin/"; done
daemonset=conf-examples/deploy/daemonset.yaml
socket=$state/run/plexus-daemon.sock
if [ -n "${PLEXUS_DAEMON_MODE:-}" ]; then
  daemonset=conf-examples/deploy/daemonset-daemon.yaml
  PLEXUS_META_KEYS="\"daemonSocket\": \"$socket\"${PLEXUS_META_KEYS:+, $PLEXUS_META_KEYS}"
fi
# The meta config for this node: the bootstrap bridge stays the cluster network.
cat > "$work/rootfs/plexus/conf/00-plexus.conflist" << EOF
{"cniVersion": "1.0.0", "name": "plexus", "plugins": [
  {"type": "plexus", "clusterNetwork": "$CLUSTER_NETWORK",
   "kubeconfig": "$CNI_CONF_DIR/plexus.d/plexus.kubeconfig", "cniDir": "$PLEXUS_DATA_DIR/meta",
   "binDir": "$CNI_BIN_DIR", "podResourcesSocket": "$state/kubelet/pod-resources/kubelet.sock", "logFile": "$state/log/plexus.log", "logLevel": "debug"${PLEXUS_META_KEYS:+, $PLEXUS_META_KEYS}}]}
EOF
tar -C "$work/rootfs" -cf "$work/rootfs.tar" .
store=(--root "$work/podman/root" --runroot "$work/podman/run" --storage-driver vfs)
podman "${store[@]}" import -q --change 'CMD ["/bin/sh"]' "$work/rootfs.tar" "$image" > /dev/null
podman "${store[@]}" save -q --format docker-archive -o "$work/image.tar" "$image" > /dev/null
ip netns exec "$NODE_NETNS" "$PEERS_BIN/ctr" -a "$state/containerd.sock" -n k8s.io images import "$work/image.tar" > /dev/null
podman "${store[@]}" rmi -a -f > /dev/null 2>&1 || true

kubectl apply -f conf-examples/deploy/crd.yaml -f conf-examples/deploy/rbac.yaml > /dev/null
sed -e "s|image: .*|image: $image\n        imagePullPolicy: Never|" \
  -e "s|path: /opt/cni/bin|path: $CNI_BIN_DIR|" -e "s|path: /etc/cni/net.d|path: $CNI_CONF_DIR|" \
  -e "s|value: /opt/cni/bin|value: $CNI_BIN_DIR|" -e "s|value: /etc/cni/net.d|value: $CNI_CONF_DIR|" \
  -e "s|value: /run/plexus/daemon.sock|value: $socket|" -e "s|value: /run/plexus/network-status|value: $state/run/network-status|" \
  "$daemonset" | kubectl apply -f - > /dev/null
for _ in $(seq 120); do
  [ -f "$CNI_CONF_DIR/00-plexus.conflist" ] && [ -f "$CNI_CONF_DIR/plexus.d/plexus.kubeconfig" ] && break
  sleep 1
done
[ -f "$CNI_CONF_DIR/00-plexus.conflist" ] || {
  echo "cluster-install.sh: the DaemonSet did not install plexus" >&2
  kubectl -n kube-system get pods -o wide >&2
  kubectl -n kube-system describe daemonset plexus >&2 || true
  exit 1
}
if [ -n "${PLEXUS_DAEMON_MODE:-}" ]; then
  kubectl -n kube-system rollout status daemonset/plexus --timeout 120s > /dev/null || {
    echo "cluster-install.sh: plexus-daemon did not become ready" >&2
    kubectl -n kube-system logs daemonset/plexus --tail 50 >&2 || true
    exit 1
  }
fi
echo "cluster-install.sh: plexus installed by its DaemonSet" >&2
