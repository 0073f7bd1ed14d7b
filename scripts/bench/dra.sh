#!/usr/bin/env bash
# plexus's DRA driver beside dranet v1.0.1 (github.com/google/dranet, built by
# `scripts/peers.sh dranet`) on one real node (scripts/cluster.sh, Kubernetes 1.34; containerd 2.0
# with NRI on, which dranet needs). Both drivers run throughout, each publishing the same PORTS
# veth "RoCE ports" (rb000 ..) as its own devices; the rounds alternate: PODS pods created at once,
# each with a claim (from a ResourceClaimTemplate of the driver's class) for NICS whole ports.
# Between them, the floor: pods without claims (the node's own pod start, the same cluster
# network). Measured, per pod: its creation to Ready (a watch of the pods, local clock, from
# just before the create); per sandbox: the CRI RunPodSandbox as containerd logs it (request →
# "returns sandbox id": the network setup of both, CNI and NRI, inside), containerd's CNI ADD
# ("begin cni setup" → "cni result": for plexus the claimed ports are attached in it, for dranet
# only the cluster network) and dranet's NRI RunPodSandbox hook (its own "took" log line, -v=2),
# where dranet attaches.
#
# What each does with a port: plexus (daemon mode, installed with Helm, dra.enabled) moves it into
# the pod with plexus-host-device, addresses it from plexus-ipam's file store, and puts its RDMA
# device's /dev/infiniband nodes in the container by CDI (this kernel has no RDMA: a fake sysfs
# makes the veths ConnectX functions, the device nodes are made with mknod); dranet moves it with
# the address it has on the node (each rbNNN gets one; dranet has no IPAM) and, seeing no RDMA
# device in the real sysfs, adds no device nodes. So plexus does more per port.
#
# PODS × NICS is at most 128: dranet publishes a node's devices in one ResourceSlice, and a slice
# holds 128 devices (plexus splits a larger pool into several slices).
#
#   bash scripts/bench/dra.sh OUT     # OUT/dra.json, and the table on stdout
#   PODS=16 NICS=8 ROUNDS=3 bash scripts/bench/dra.sh OUT
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib/roce-sysfs.sh
out=${1:?usage: scripts/bench/dra.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
PODS=${PODS:-16}
NICS=${NICS:-8}
ROUNDS=${ROUNDS:-3}
ports=$((PODS * NICS))
[ "$ports" -le 128 ] || { echo "bench/dra.sh: PODS × NICS = $ports: at most 128 (one ResourceSlice of dranet's)" >&2; exit 2; }
log() { echo "bench/dra.sh: $*" >&2; }

dranet=$(bash scripts/peers.sh dranet)/dranet
sys=$(mktemp -d)
env_file=$(mktemp)
dranet_pid=
cleanup() {
  [ -n "$dranet_pid" ] && kill "$dranet_pid" 2> /dev/null && wait "$dranet_pid" 2> /dev/null
  # The node's logs stay with the figures (plexus at debug level: each ADD's steps, timed).
  [ -n "${state:-}" ] && mkdir -p "$out/logs" && cp "$state"/log/{plexus,containerd,kubelet}.log "$out/logs/" 2> /dev/null
  [ -n "${state:-}" ] && grep -v 'cloud.go:53\]' "$state/log/dranet.log" > "$out/logs/dranet.log" 2> /dev/null
  bash scripts/cluster.sh down > /dev/null 2>&1 || true
  rm -rf "$sys" "$env_file"
}
trap cleanup EXIT

# The ports, and the fake sysfs that makes them ConnectX functions for plexus: 8 PCIe roots of
# PORTS/8 functions each (NUMA 0 and 1), an RDMA device and uverbs node per function.
port_name() { printf 'rb%03d' "$1"; }
roce_sysfs "$sys" $(for ((n = 0; n < ports; n++)); do port_name "$n"; done)

PLEXUS_CLUSTER_NRI=1 PLEXUS_CLUSTER_SYSFS=$sys bash scripts/cluster.sh up > "$env_file"
set -a
# shellcheck disable=SC1090
. "$env_file"
set +a
state=$(dirname "$KUBECONFIG")
k() { ip netns exec "$NODE_NETNS" "$PEERS_BIN/kubectl" --kubeconfig "$KUBECONFIG" "$@"; }

# make_ports: every port missing on the node made (again), with its address. A veth dies with the
# namespace it is in, where a NIC would come back to the node: dranet does not always move its
# ports back (below), so after its rounds the bench makes the lost ones again.
make_ports() {
  local n name
  for ((n = 0; n < ports; n++)); do
    name=$(port_name "$n")
    ip -n "$NODE_NETNS" link show "$name" > /dev/null 2>&1 && continue
    ip -n "$FABRIC_NETNS" link del "$name" 2> /dev/null || true
    ip -n "$NODE_NETNS" link add "$name" mtu 9000 type veth peer name "$name" netns "$FABRIC_NETNS" mtu 9000
    ip -n "$NODE_NETNS" addr add "198.18.$((100 + n / 8)).$((n % 8 + 1))/24" dev "$name"
    ip -n "$NODE_NETNS" link set "$name" up
    ip -n "$FABRIC_NETNS" link set "$name" up
    [ "${1:-}" = again ] && lost=$((lost + 1))
  done
  return 0
}
lost=0
log "$ports ports, device nodes"
make_ports
mkdir -p "$state/dev/infiniband"
for ((n = 0; n < ports; n++)); do mknod -m 666 "$state/dev/infiniband/uverbs$n" c 231 $((192 + n)); done
mknod -m 666 "$state/dev/infiniband/rdma_cm" c 10 58

log "plexus (daemon mode, DRA on)"
PLEXUS_DAEMON_MODE=1 PLEXUS_INSTALL_WITH=helm PLEXUS_HELM_ARGS="--set dra.enabled=true \
  --set dra.kubeletDir=$state/kubelet --set dra.cdiDir=$state/cdi --set dra.devRoot=$state/dev \
  --set dra.claimsDir=$state/dra-claims --set-json env=[{\"name\":\"PLEXUS_SYSFS_ROOT\",\"value\":\"$sys\"}]" \
  bash scripts/cluster-install.sh

log "dranet"
# dranet's kubelet plugin keeps its sockets at /var/lib/kubelet/plugins{,_registry}/ and the
# kubelet dials what it registers: in the node's mount namespace (the kubelet's) those two are the
# kubelet's --root-dir ones (a tmpfs over /var/lib/kubelet, its device-plugins bind made again).
# dranet itself runs in a mount namespace of its own below the node's (mounts made there do not
# go back; containerd's new netns mounts reach it): the node's sysfs (its netdevs) on /sys, and a
# tmpfs on /run with containerd's NRI socket dir at /run/nri.
mkdir -p "$state/kubelet/plugins" "$state/kubelet/plugins_registry"
nsenter --mount="$state/mnt" sh -c "
  mount -t tmpfs tmpfs /var/lib/kubelet
  mkdir /var/lib/kubelet/device-plugins /var/lib/kubelet/plugins /var/lib/kubelet/plugins_registry
  mount --bind '$state/kubelet/device-plugins' /var/lib/kubelet/device-plugins
  mount --bind '$state/kubelet/plugins' /var/lib/kubelet/plugins
  mount --bind '$state/kubelet/plugins_registry' /var/lib/kubelet/plugins_registry"
nsenter --net="/run/netns/$NODE_NETNS" --mount="$state/mnt" -- unshare --mount --propagation slave sh -c "
  mount -t sysfs sysfs /sys
  mount -t tmpfs tmpfs /run
  mkdir /run/nri
  mount --bind '$state/nri' /run/nri
  exec '$dranet' --kubeconfig '$KUBECONFIG' --hostname-override '$NODE_NAME' --bind-address 127.0.0.1:19177 \
    --filter '\"dra.net/ifName\" in attributes && attributes[\"dra.net/ifName\"].StringValue.startsWith(\"rb\")' -v=2
" > "$state/log/dranet.log" 2>&1 &
dranet_pid=$!

k apply -f conf-examples/dra/deviceclasses.yaml > /dev/null
# plexus's claims take their ports' config from a NAD (`network`): plexus-host-device's state and
# plexus-ipam's file store in the test node's data root (its policy allows no other).
cat << EOF | k apply -f - > /dev/null
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: ports, namespace: default}
spec:
  config: '{"cniVersion": "1.0.0", "name": "ports", "type": "plexus-host-device", "dataDir": "$PLEXUS_DATA_DIR/hd",
    "ipam": {"type": "plexus-ipam", "range": "198.18.96.0/22", "dataDir": "$PLEXUS_DATA_DIR/ipam"}}'
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: dra.net}
spec:
  selectors:
  - cel: {expression: device.driver == "dra.net"}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: ports-plexus, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: ports
        exactly: {deviceClassName: roce.plexus.dev, count: $NICS}
      config:
      - requests: [ports]
        opaque:
          driver: plexus.dev
          parameters: {mtu: 9000, network: ports}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: ports-dranet, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: ports
        exactly: {deviceClassName: dra.net, count: $NICS}
EOF

# slice_devices DRIVER: how many devices the node's slices of DRIVER offer.
slice_devices() {
  k get resourceslices -o json | python3 scripts/bench/dra_summary.py devices "$1" "$NODE_NAME"
}
# settled: every port back on the node, both drivers offering all of them. After dranet's rounds
# the ports it did not give back are made again and counted ($out/dranet-lost): dranet's
# StopPodSandbox finds nothing to move back when the kubelet has unprepared the claim first (its
# prepared state is per claim and in memory), and the port dies with the pod's namespace.
settled() {
  local deadline=$((SECONDS + 300)) before=$lost
  if [ "${1:-}" = dranet ]; then
    sleep 5
    make_ports again
    echo "$lost" > "$out/dranet-lost"
    [ "$lost" = "$before" ] || log "dranet gave $((lost - before)) port(s) of round $2 not back: made again"
  fi
  until [ "$(ip -n "$NODE_NETNS" -o link show | grep -c ': rb[0-9]')" = "$ports" ] \
    && [ "$(slice_devices plexus.dev)" = "$ports" ] && [ "$(slice_devices dra.net)" = "$ports" ]; do
    if [ $SECONDS -ge $deadline ]; then
      log "not settled: $(ip -n "$NODE_NETNS" -o link show | grep -c ': rb[0-9]') ports on the node, plexus offers $(slice_devices plexus.dev), dranet $(slice_devices dra.net)"
      tail -20 "$state/log/dranet.log" >&2
      return 1
    fi
    sleep 1
  done
}
log "waiting for both drivers to offer the $ports ports"
settled

# claims DRIVER: the pod spec's claim of NICS ports of DRIVER, and its container ("floor": none).
claims() {
  if [ "$1" = floor ]; then
    echo "  containers: [{name: main, image: $TEST_IMAGE, imagePullPolicy: Never, command: [sleep, \"3600\"]}]"
  else
    echo "  resourceClaims: [{name: ports, resourceClaimTemplateName: ports-$1}]"
    echo "  containers:"
    echo "  - {name: main, image: $TEST_IMAGE, imagePullPolicy: Never, command: [sleep, \"3600\"], resources: {claims: [{name: ports}]}}"
  fi
}

# round DRIVER R: PODS pods at once, each claiming NICS ports of DRIVER; raw files OUT/DRIVER-R.*.
round() {
  local driver=$1 r=$2 tag="dra-$1-$2" c0 watcher i
  local base=$out/$driver-$r
  c0=$(wc -l < "$state/log/containerd.log")
  {
    for ((i = 0; i < PODS; i++)); do
      cat << EOF
apiVersion: v1
kind: Pod
metadata: {name: $tag-$i, namespace: default, labels: {bench: $tag}}
spec:
  terminationGracePeriodSeconds: 0
$(claims "$driver")
---
EOF
    done
  } > "$base.yaml"
  # Every Ready pod as the watch sees it, with the local time (a session of its own, ended whole).
  setsid bash -c 'ip netns exec "$1" "$2" --kubeconfig "$3" get pods -l "$4" -w \
      -o jsonpath="{.metadata.name} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}" \
    | while read -r name ready; do [ "$ready" = True ] && echo "$name $(date +%s.%N)"; done' \
    watch "$NODE_NETNS" "$PEERS_BIN/kubectl" "$KUBECONFIG" "bench=$tag" > "$base.ready" &
  watcher=$!
  sleep 1
  date +%s.%N > "$base.t0"
  k create -f "$base.yaml" > /dev/null
  local deadline=$((SECONDS + 600))
  until [ "$(cut -d' ' -f1 "$base.ready" | sort -u | wc -l)" -ge "$PODS" ]; do
    if [ $SECONDS -ge $deadline ]; then
      log "$driver round $r: not all pods Ready"
      k get pods -l "bench=$tag" -o wide >&2
      k get events --sort-by=.lastTimestamp | tail -20 >&2
      break
    fi
    sleep 0.2
  done
  kill -- -"$watcher" 2> /dev/null || true
  wait "$watcher" 2> /dev/null || true
  tail -n +"$((c0 + 1))" "$state/log/containerd.log" | grep -E 'begin cni setup|cni result|RunPodSandbox for' > "$base.cni" || true
  log "$driver round $r: $(sort -u "$base.ready" | wc -l) of $PODS pods Ready"
  k delete pods -l "bench=$tag" --wait=true --timeout=300s > /dev/null
  settled "$driver" "$r"
}

# The floor (pods without claims: the node's own pod start) between the two, alternating which
# goes first.
for ((r = 1; r <= ROUNDS; r++)); do
  if ((r % 2)); then order="plexus floor dranet"; else order="dranet floor plexus"; fi
  for driver in $order; do round "$driver" "$r"; done
done
# dranet's hook times, from its log (klog writes it out every 5 s).
sleep 6
for ((r = 1; r <= ROUNDS; r++)); do
  for driver in plexus floor dranet; do
    grep -E "RunPodSandbox Pod default/dra-$driver-$r-[0-9]+ UID .* took" "$state/log/dranet.log" > "$out/$driver-$r.nri" || true
  done
done
python3 scripts/bench/dra_summary.py summary "$out" "$PODS" "$NICS" "$ROUNDS" > "$out/dra.json"
python3 scripts/bench/dra_summary.py table "$out/dra.json"
