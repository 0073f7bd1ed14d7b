#!/usr/bin/env bash
# Installs Multus thick on the node of scripts/cluster.sh as Multus's own
# deployments/multus-daemonset-thick.yml does (v4.2.3, the version scripts/peers.sh builds):
# multus-daemon in a privileged DaemonSet pod (host network and PID, the host's root at /hostroot
# for its delegates' chroot, its ServiceAccount's in-cluster credentials), multus-shim copied into
# the CNI bin dir by an init container, the daemon's config in a ConfigMap with
# `"multusConfigFile": "auto"`: it writes 00-multus.conf around the first config of the conf dir
# (the node's cluster network) and removes it when it stops. What differs from a real node: the
# image is made here from the peers' binaries and busybox (no registry), the node's paths (CNI
# dirs, Multus's cache directory, its socket and log, plexus's node policy in PLEXUS_POLICY) are
# under the cluster's state dir.
#
#   eval "$(bash scripts/cluster.sh up)"; bash scripts/cluster-multus-thick.sh
#   bash scripts/cluster-multus-thick.sh --uninstall   # the DaemonSet deleted: 00-multus.conf goes
#
# MULTUS_MASTER_CNI names the config Multus wraps (its "multusMasterCNI"); without it, auto mode
# takes the first config in the conf dir — on a node plexus runs, plexus's own.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${KUBECONFIG:?run scripts/cluster.sh up first and export what it prints}"
state=$(dirname "$KUBECONFIG")
kubectl() { ip netns exec "$NODE_NETNS" "$PEERS_BIN/kubectl" --kubeconfig "$KUBECONFIG" "$@"; }
image=localhost/multus-thick:test

if [ "${1:-}" = --uninstall ]; then
  kubectl -n kube-system delete daemonset kube-multus-ds --cascade=foreground --wait=true --timeout=120s > /dev/null
  for _ in $(seq 100); do
    [ -e "$CNI_CONF_DIR/00-multus.conf" ] || break
    sleep 0.2
  done
  [ ! -e "$CNI_CONF_DIR/00-multus.conf" ] || { echo "cluster-multus-thick.sh: 00-multus.conf left" >&2; exit 1; }
  rm -f "$CNI_BIN_DIR/multus-shim"
  kubectl -n kube-system delete configmap/multus-daemon-config serviceaccount/multus --ignore-not-found > /dev/null
  kubectl delete clusterrolebinding/multus clusterrole/multus --ignore-not-found > /dev/null
  echo "cluster-multus-thick.sh: Multus thick uninstalled" >&2
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
r=$work/rootfs
mkdir -p "$r/bin" "$r/usr/src/multus-cni/bin" "$r/dev" "$r/proc" "$r/sys" "$r/etc" "$r/tmp"
cp /bin/busybox "$r/bin/busybox"
for t in sh cp ls cat; do ln -sf busybox "$r/bin/$t"; done
# multus-daemon looks itself up (it must be root) in /etc/passwd.
echo 'root:x:0:0:root:/root:/bin/sh' > "$r/etc/passwd"
echo 'root:x:0:' > "$r/etc/group"
cp "$PEERS_BIN/multus-daemon" "$PEERS_BIN/multus-shim" "$r/usr/src/multus-cni/bin/"
tar -C "$r" -cf "$work/rootfs.tar" .
store=(--root "$work/podman/root" --runroot "$work/podman/run" --storage-driver vfs)
podman "${store[@]}" import -q --change 'CMD ["/usr/src/multus-cni/bin/multus-daemon"]' "$work/rootfs.tar" "$image" > /dev/null
podman "${store[@]}" save -q --format docker-archive -o "$work/image.tar" "$image" > /dev/null
ip netns exec "$NODE_NETNS" "$PEERS_BIN/ctr" -a "$state/containerd.sock" -n k8s.io images import "$work/image.tar" > /dev/null
podman "${store[@]}" rmi -a -f > /dev/null 2>&1 || true

cache=$PLEXUS_DATA_DIR/multus socket_dir=$state/run/multus
mkdir -p "$cache" "$socket_dir"
# Each host directory the daemon names in its config is mounted at its own path, as Multus's
# manifest mounts /opt/cni/bin and /var/lib/cni/multus ("identical between pod and host").
# each_dir FORMAT DIR...: FORMAT (printf: the volume's index, then its path) for each directory.
each_dir() {
  local format=$1 i=0
  shift
  for path in "$@"; do
    # shellcheck disable=SC2059
    printf "$format\n" "$i" "$path"
    i=$((i + 1))
  done
}
# The pods' network namespaces: where this node's containerd keeps them (netnsMountsUnderStateDir;
# Multus's manifest mounts /run/netns, containerd's default).
netns=$state/containerd/state/io.containerd.grpc.v1.cri/netns
mkdir -p "$netns"
# The socket's parent, not the socket's directory: multus-daemon removes and remakes that one.
dirs=("$CNI_CONF_DIR" "$CNI_BIN_DIR" "$cache" "$(dirname "$socket_dir")" "$state/log" "$netns")
kubectl apply -f - > /dev/null << EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: multus, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: multus}
rules:
- {apiGroups: [k8s.cni.cncf.io], resources: ["*"], verbs: ["*"]}
- {apiGroups: [""], resources: [pods, pods/status], verbs: [get, list, update, watch]}
- {apiGroups: ["", events.k8s.io], resources: [events], verbs: [create, patch, update]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: multus}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: multus}
subjects: [{kind: ServiceAccount, name: multus, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: multus-daemon-config, namespace: kube-system}
data:
  daemon-config.json: |
    {
      "chrootDir": "/hostroot",
      "cniVersion": "0.3.1",
      "logLevel": "verbose",
      "logFile": "$state/log/multus.log",
      "cniConfigDir": "$CNI_CONF_DIR",
      "multusAutoconfigDir": "$CNI_CONF_DIR",
      "multusConfigFile": "auto",
      "socketDir": "$socket_dir",
      "daemonSocketDir": "$socket_dir",
      "binDir": "$CNI_BIN_DIR",
      "cniDir": "$cache"${MULTUS_MASTER_CNI:+,
      \"multusMasterCNI\": \"$MULTUS_MASTER_CNI\"}
    }
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: kube-multus-ds, namespace: kube-system, labels: {app: multus}}
spec:
  selector: {matchLabels: {name: multus}}
  template:
    metadata: {labels: {app: multus, name: multus}}
    spec:
      hostNetwork: true
      hostPID: true
      tolerations: [{operator: Exists}]
      serviceAccountName: multus
      terminationGracePeriodSeconds: 10
      initContainers:
      - name: install-multus-binary
        image: $image
        imagePullPolicy: Never
        command: [/bin/cp, /usr/src/multus-cni/bin/multus-shim, $CNI_BIN_DIR/multus-shim]
        securityContext: {privileged: true}
        volumeMounts:
$(each_dir "        - {name: v%s, mountPath: %s, mountPropagation: HostToContainer}" "${dirs[@]}")
      containers:
      - name: kube-multus
        image: $image
        imagePullPolicy: Never
        command: [/usr/src/multus-cni/bin/multus-daemon, -config, /etc/cni/net.d/multus.d/daemon-config.json]
        env:
        - name: MULTUS_NODE_NAME
          valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
        # The test node's policy is not at plexus's default path: its delegates (plexus's, when
        # Multus runs them) are told where it is, as containerd is (scripts/cluster.sh).
        - {name: PLEXUS_POLICY, value: "$PLEXUS_POLICY"}
        securityContext: {privileged: true}
        volumeMounts:
        - {name: config, mountPath: /etc/cni/net.d/multus.d, readOnly: true}
        - {name: hostroot, mountPath: /hostroot, mountPropagation: HostToContainer}
$(each_dir "        - {name: v%s, mountPath: %s, mountPropagation: HostToContainer}" "${dirs[@]}")
      volumes:
      - {name: config, configMap: {name: multus-daemon-config}}
      - {name: hostroot, hostPath: {path: /}}
$(each_dir "      - {name: v%s, hostPath: {path: %s}}" "${dirs[@]}")
EOF
kubectl -n kube-system rollout status daemonset/kube-multus-ds --timeout=120s > /dev/null
for _ in $(seq 150); do
  [ -e "$CNI_CONF_DIR/00-multus.conf" ] && break
  sleep 0.2
done
[ -e "$CNI_CONF_DIR/00-multus.conf" ] || { echo "cluster-multus-thick.sh: no 00-multus.conf after 30 s" >&2; exit 1; }
echo "cluster-multus-thick.sh: Multus thick installed" >&2
