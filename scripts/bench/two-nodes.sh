#!/usr/bin/env bash
# Two nodes of one cluster (scripts/cluster.sh up --nodes 2, RoCE ports cabled rail by rail to the
# fabric namespace's bridges, MTU 9000), plexus installed:
#   1. transfers: 1 GiB over one TCP connection (iperf3) from node A to node B — between the
#      nodes' own ports (no plexus: the floor), between two pods on a plexus-macvlan network and
#      on a plexus-host-device network; ROUNDS rounds, the three alternated;
#   2. cluster-wide IPAM on both nodes at once: COUNT allocations per node by 16 clients per node
#      (a plugin process per ADD/DEL, a pod named in CNI_ARGS, as a runtime runs them), then their
#      release, one range shared by the two nodes — whereabouts v0.9.2 (its Kubernetes store and
#      Lease) on both, plexus-ipam's Kubernetes store on both, plexus-ipam's etcd store on both
#      (an etcd on node A's management address); both nodes' ADDs, then both nodes' DELs, so
#      every address handed out is held until both nodes have allocated (distinct = 2 × COUNT).
#      Failed ADDs are DELeted and retried, as the kubelet would, and counted.
# Writes OUT/two-nodes.json (and each run's raw results); figures, never a pass/fail on time.
#
#   bash scripts/bench/two-nodes.sh OUT
set -euo pipefail
cd "$(dirname "$0")/../.."
top=$(pwd)
out=${1:?usage: scripts/bench/two-nodes.sh OUT_DIR}
mkdir -p "$out"
ROUNDS=${ROUNDS:-5}
COUNT=${COUNT:-500}
log() { echo "bench/two-nodes.sh: $*" >&2; }

env_file=$(mktemp)
etcd_pid=
cleanup() {
  [ -n "$etcd_pid" ] && kill "$etcd_pid" 2> /dev/null
  bash scripts/cluster.sh down > /dev/null 2>&1 || true
  rm -f "$env_file"
}
trap cleanup EXIT
bash scripts/cluster.sh up --nodes 2 > "$env_file"
set -a
# shellcheck disable=SC1090
. "$env_file"
set +a
bash scripts/cluster-install.sh
state=$(dirname "$KUBECONFIG")
k() { ip netns exec "$NODE_NETNS" "$PEERS_BIN/kubectl" --kubeconfig "$KUBECONFIG" "$@"; }
crictl_on() { # NODE_NETNS NODE_FILES ARGS...
  ip netns exec "$1" "$PEERS_BIN/crictl" --runtime-endpoint "unix://$2/containerd.sock" "${@:3}" 2> /dev/null
}
# What node K runs sees node K's files at the state dir's paths (its mount namespace).
on_node() { # K CMD...
  if [ "$1" = 1 ]; then
    nsenter --net="/run/netns/$NODE_NETNS" -- "${@:2}"
  else
    nsenter --net="/run/netns/$NODE_NETNS_2" --mount="$NODE_STATE_2/mnt" -- "${@:2}"
  fi
}

# An etcd for plexus-ipam's etcd store, on node A's management address (node B reaches it across
# the fabric), and the node policy: the API server's store with the admin's credentials, the etcd
# profile `fabric`.
mkdir -p "$state/bench-etcd"
ip netns exec "$NODE_NETNS" /usr/bin/etcd --name bench --data-dir "$state/bench-etcd" \
  --listen-client-urls http://198.18.250.1:23790 --advertise-client-urls http://198.18.250.1:23790 \
  --listen-peer-urls http://198.18.250.1:23800 --initial-advertise-peer-urls http://198.18.250.1:23800 \
  --initial-cluster bench=http://198.18.250.1:23800 --log-level error > "$out/etcd.log" 2>&1 &
etcd_pid=$!
printf '{"dataRoots": ["%s"], "deviceInfoDir": "%s", "kubernetes": {"kubeconfig": "%s", "namespace": "kube-system"},
  "stores": {"fabric": {"etcd": {"endpoints": ["http://198.18.250.1:23790"], "prefix": "/plexus-bench"}}}}\n' \
  "$PLEXUS_DATA_DIR" "$state/devinfo" "$KUBECONFIG" > "$PLEXUS_POLICY"

# 1. Transfers.
nad() { # NAME CONFIG
  printf 'apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata: {name: %s, namespace: default}\nspec:\n  config: '"'"'%s'"'"'\n---\n' "$1" "$2"
}
ipam() { printf '"ipam": {"type": "plexus-ipam", "range": "%s", "store": "kubernetes"}' "$1"; }
{
  nad mv "{\"cniVersion\": \"1.0.0\", \"type\": \"plexus-macvlan\", \"master\": \"ens1f0np0\", $(ipam 198.18.190.0/24)}"
  nad hd "{\"cniVersion\": \"1.0.0\", \"type\": \"plexus-host-device\", \"device\": \"ens2f0np0\", \"dataDir\": \"$PLEXUS_DATA_DIR/hd\", $(ipam 198.18.191.0/24)}"
  for pod in a:plexus-node b:plexus-node-2; do
    cat << EOF
apiVersion: v1
kind: Pod
metadata: {name: ${pod%%:*}, namespace: default, annotations: {k8s.v1.cni.cncf.io/networks: "mv,hd"}}
spec:
  nodeName: ${pod#*:}
  terminationGracePeriodSeconds: 0
  containers:
  - {name: c, image: $TEST_IMAGE, imagePullPolicy: Never, command: ["/bin/sh", "-c", "sleep 3600"]}
---
EOF
  done
} | k apply -f - > /dev/null
k wait --for=condition=Ready pod/a pod/b --timeout=180s > /dev/null
pid_of() { # NODE_NETNS NODE_FILES POD
  crictl_on "$1" "$2" inspectp "$(crictl_on "$1" "$2" pods --name "$3" --state ready -q)" | python3 -c 'import json,sys; print(json.load(sys.stdin)["info"]["pid"])'
}
a_ns=/proc/$(pid_of "$NODE_NETNS" "$state" a)/ns/net
b_ns=/proc/$(pid_of "$NODE_NETNS_2" "$NODE_STATE_2" b)/ns/net
addr_of() { # POD IFNAME
  k get pod "$1" -o jsonpath='{.metadata.annotations.k8s\.v1\.cni\.cncf\.io/network-status}' |
    python3 -c 'import json,sys; print([s for s in json.load(sys.stdin) if s["interface"] == sys.argv[1]][0]["ips"][0])' "$2"
}
ip -n "$NODE_NETNS" addr add 198.18.193.1/24 dev ens7f0np0
ip -n "$NODE_NETNS_2" addr add 198.18.193.2/24 dev ens7f0np0
declare -A src_ns dst_ns src dst
src_ns[floor]=/run/netns/$NODE_NETNS dst_ns[floor]=/run/netns/$NODE_NETNS_2 src[floor]=198.18.193.1 dst[floor]=198.18.193.2
for case in macvlan:net1 host-device:net2; do
  name=${case%%:*}
  src_ns[$name]=$a_ns dst_ns[$name]=$b_ns src[$name]=$(addr_of a "${case#*:}") dst[$name]=$(addr_of b "${case#*:}")
done
for round in $(seq "$ROUNDS"); do
  for name in floor macvlan host-device; do
    nsenter --net="${dst_ns[$name]}" -- iperf3 -s -1 -B "${dst[$name]}" -p 5201 > /dev/null 2>&1 &
    server=$!
    # iperf3 --json exits 0 also when refused (its server not listening yet): its report says.
    for _ in $(seq 50); do
      nsenter --net="${src_ns[$name]}" -- iperf3 -c "${dst[$name]}" -B "${src[$name]}" -p 5201 -n 1G -J \
        > "$out/transfer-$name-$round.json" 2> /dev/null && ! grep -q '"error"' "$out/transfer-$name-$round.json" && break
      sleep 0.1
    done
    wait "$server" || true
    log "transfer $name round $round: $(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"] / 1e9, 2))' "$out/transfer-$name-$round.json") Gbit/s"
  done
done
ip -n "$NODE_NETNS" addr del 198.18.193.1/24 dev ens7f0np0
ip -n "$NODE_NETNS_2" addr del 198.18.193.2/24 dev ens7f0np0
k delete pod a b --wait=true --timeout=120s > /dev/null

# 2. Cluster-wide IPAM on both nodes at once.
BIN=$(bash scripts/build-release.sh)
printf '{"datastore": "kubernetes", "kubernetes": {"kubeconfig": "%s"}}\n' "$KUBECONFIG" > "$state/whereabouts.conf"
for who in wb px-k8s px-etcd; do
  for n in 1 2; do
    case $who in
      wb) ipam='{"type": "whereabouts", "range": "198.18.168.0/21", "configuration_path": "'"$state/whereabouts.conf"'"}' ;;
      px-k8s) ipam='{"type": "plexus-ipam", "range": "198.18.176.0/21", "store": "kubernetes", "nodeName": "node-'$n'"}' ;;
      px-etcd) ipam='{"type": "plexus-ipam", "range": "198.18.160.0/21", "store": "fabric", "nodeName": "node-'$n'"}' ;;
    esac
    echo "{\"cniVersion\": \"1.0.0\", \"name\": \"load\", \"ipam\": $ipam}" > "$state/$who-$n.json"
  done
  plugin=$BIN/plexus-ipam
  [ "$who" = wb ] && plugin=$PEERS_BIN/whereabouts
  # Both nodes' ADDs, then both nodes' DELs: every address is held until both have allocated.
  for verb in add del; do
    pids=()
    for n in 1 2; do
      on_node "$n" env PLEXUS_POLICY="$PLEXUS_POLICY" python3 "$top/scripts/bench/cni_load.py" --plugin "$plugin" \
        --conf "$state/$who-$n.json" --count "$COUNT" --clients 16 --pods --retries 20 --latencies \
        --phase "$verb" --prefix "$who-n$n-" > "$out/ipam-$who-$n-$verb.json" &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
  done
  log "ipam $who: $(python3 scripts/bench/two_nodes_summary.py ipam "$out/ipam-$who"-{1,2}-{add,del}.json)"
done
python3 scripts/bench/two_nodes_summary.py all "$out" "$ROUNDS" > "$out/two-nodes.json"
cat "$out/two-nodes.json"
