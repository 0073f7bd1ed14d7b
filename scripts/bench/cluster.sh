#!/usr/bin/env bash
# Side by side on one real node (scripts/cluster.sh): the stack users run today — Multus thin +
# the reference macvlan + whereabouts (its Kubernetes store) — against plexus + plexus-macvlan +
# plexus-ipam (its default node-local store), swapping the CNI config file between runs. Both
# stacks first pass the same functional check (a pod on two networks: Ready, addresses in the pod
# and in network-status, everything released on delete). Then, for each stack and for 1, 4 and 8
# RoCE networks per pod: PODS pods created at once, and
#   - the CNI ADD time of each sandbox as containerd logs it ("begin cni setup" → "cni result"),
#   - the time from creation to all pods Ready,
#   - the API requests of the CNI plugins' service accounts per pod (the apiserver's audit log).
# Then plexus-ipam's kubernetes store against whereabouts (below). Writes OUT/cluster.json and
# OUT/ipam-k8s.json (scripts/bench/report.py renders them); PODBENCH=0 or IPAM=0 skip a part.
# Figures, never a pass/fail on time.
#
#   bash scripts/bench/cluster.sh OUT
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: scripts/bench/cluster.sh OUT_DIR}
mkdir -p "$out"
PODS=${PODS:-20}
NETS=${NETS:-1 4 8}

env_file=$(mktemp)
trap 'bash scripts/cluster.sh down > /dev/null 2>&1 || true; rm -f "$env_file"' EXIT
bash scripts/cluster.sh up > "$env_file"
set -a
# shellcheck disable=SC1090
. "$env_file"
set +a
bash scripts/cluster-install.sh
state=$(dirname "$KUBECONFIG")
k() { ip netns exec "$NODE_NETNS" "$PEERS_BIN/kubectl" --kubeconfig "$KUBECONFIG" "$@"; }
crictl() { ip netns exec "$NODE_NETNS" "$PEERS_BIN/crictl" --runtime-endpoint "unix://$state/containerd.sock" "$@" 2> /dev/null; }
log() { echo "bench/cluster.sh: $*" >&2; }

# The peers, installed as their projects install them: binaries in the CNI bin dir, their own
# ServiceAccounts and RBAC (taken from their manifests), kubeconfigs with those accounts' tokens.
cp "$PEERS_BIN"/{multus,macvlan,whereabouts} "$CNI_BIN_DIR/"
multus_dir=$PEERS_BIN/../share/multus
wb_dir=$PEERS_BIN/../share/whereabouts
rbac_of() { # the ServiceAccount, ClusterRole and ClusterRoleBinding documents of a manifest
  python3 scripts/bench/benchtool.py rbac-docs "$1"
}
{ rbac_of "$multus_dir/deployments/multus-daemonset.yml"; rbac_of "$wb_dir/doc/crds/daemonset-install.yaml"; } | k apply -f - > /dev/null
for sa in multus whereabouts; do
  token=$(k -n kube-system create token "$sa" --duration 4h)
  umask 077
  cat > "$state/$sa.kubeconfig" << EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "https://198.18.250.1:6443", certificate-authority: "$state/pki/ca.crt"}
users:
- name: $sa
  user: {token: "$token"}
contexts:
- name: $sa
  context: {cluster: local, user: $sa, namespace: kube-system}
current-context: $sa
EOF
done

# whereabouts needs its flat file (its DaemonSet writes one to /etc/cni/net.d/whereabouts.d/).
printf '{"datastore": "kubernetes", "kubernetes": {"kubeconfig": "%s"}}\n' "$state/whereabouts.kubeconfig" > "$state/whereabouts.conf"

# Eight rails per stack, the same ports and ranges (the stacks never run at once).
nads=""
for i in 0 1 2 3 4 5 6 7; do
  port=ens$((i + 1))f0np0 range=198.18.$((200 + i)).0/24
  nads+="---
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: p-rail$i, namespace: default}
spec:
  config: '{\"cniVersion\": \"1.0.0\", \"type\": \"plexus-macvlan\", \"master\": \"$port\", \"mode\": \"bridge\",
    \"ipam\": {\"type\": \"plexus-ipam\", \"range\": \"$range\", \"dataDir\": \"$PLEXUS_DATA_DIR/ipam\"}}'
---
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: w-rail$i, namespace: default}
spec:
  config: '{\"cniVersion\": \"1.0.0\", \"type\": \"macvlan\", \"master\": \"$port\", \"mode\": \"bridge\",
    \"ipam\": {\"type\": \"whereabouts\", \"range\": \"$range\", \"configuration_path\": \"$state/whereabouts.conf\"}}'
"
done
echo "$nads" | k apply -f - > /dev/null

# use_stack plexus|multus: the CNI config containerd takes (the first file of the conf dir).
use_stack() {
  local want
  if [ "$1" = multus ]; then
    cat > "$CNI_CONF_DIR/.00-multus.conf.new" << EOF
{"cniVersion": "1.0.0", "name": "multus-cni-network", "type": "multus", "kubeconfig": "$state/multus.kubeconfig",
 "cniDir": "$PLEXUS_DATA_DIR/multus", "binDir": "$CNI_BIN_DIR", "clusterNetwork": "$CLUSTER_NETWORK",
 "logFile": "$state/log/multus.log", "logLevel": "error"}
EOF
    mv "$CNI_CONF_DIR/.00-multus.conf.new" "$CNI_CONF_DIR/00-multus.conf"
    want=multus-cni-network
  else
    rm -f "$CNI_CONF_DIR/00-multus.conf"
    want='"Name": "plexus"'
  fi
  for _ in $(seq 60); do
    crictl info | grep -q "$want" && return 0
    sleep 0.5
  done
  log "containerd did not take the $1 config"
  return 1
}

# pods NAME-PREFIX COUNT NETWORKS: pod manifests, label bench=NAME-PREFIX.
pods() {
  for i in $(seq 1 "$2"); do
    cat << EOF
---
apiVersion: v1
kind: Pod
metadata:
  name: $1-$i
  namespace: default
  labels: {bench: "$1"}
  annotations: {k8s.v1.cni.cncf.io/networks: "$3"}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - {name: c, image: $TEST_IMAGE, imagePullPolicy: Never, command: ["/bin/sh", "-c", "sleep 3600"]}
EOF
  done
}

held() { # addresses the stack holds
  if [ "$1" = multus ]; then
    k get ippools.whereabouts.cni.cncf.io -A -o json | python3 scripts/bench/benchtool.py allocations
  else
    find "$PLEXUS_DATA_DIR/ipam" -path '*/ips/*' -type f 2> /dev/null | wc -l
  fi
}

wait_released() {
  for _ in $(seq 240); do
    [ "$(held "$1")" = 0 ] && return 0
    sleep 0.5
  done
  log "$1: addresses still held after the pods were deleted"
  return 1
}

prefix() { # the NAD name prefix of a stack
  if [ "$1" = multus ]; then echo w; else echo p; fi
}

# The functional check both stacks pass before they are measured.
check() {
  local stack=$1 p; p=$(prefix "$1")
  use_stack "$stack"
  pods "check-$stack" 1 "$p-rail0,$p-rail1" | k apply -f - > /dev/null
  k wait --for=condition=Ready pod -l "bench=check-$stack" --timeout=120s > /dev/null || {
    k describe pod -l "bench=check-$stack" >&2
    tail -20 "$state/log/multus.log" >&2 2> /dev/null || true
    return 1
  }
  local addrs status
  addrs=$(k exec "check-$stack-1" -- ip -o -4 addr)
  status=$(k get pod "check-$stack-1" -o jsonpath='{.metadata.annotations.k8s\.v1\.cni\.cncf\.io/network-status}')
  echo "$addrs" | grep -q "net1 .*inet 198.18.200." || { log "$stack: no net1 address: $addrs"; return 1; }
  echo "$addrs" | grep -q "net2 .*inet 198.18.201." || { log "$stack: no net2 address: $addrs"; return 1; }
  python3 scripts/bench/benchtool.py network-status "$status" "$p" || { log "$stack: network-status: $status"; return 1; }
  [ "$(held "$stack")" = 2 ] || { log "$stack: expected 2 addresses held"; return 1; }
  k delete pod -l "bench=check-$stack" --wait=true --timeout=120s > /dev/null
  wait_released "$stack"
  if [ "$stack" = multus ] && [ -n "$(k get overlappingrangeipreservations.whereabouts.cni.cncf.io -A -o name)" ]; then
    log "multus: whereabouts left OverlappingRangeIPReservations"
    return 1
  fi
  log "$stack: functional check passed"
}

# One run: PODS pods with N networks of a stack, created at once, then deleted.
run() {
  local stack=$1 n=$2 p name=b-$1-$2 nets="" a0 a1 a2 c0 t0 t1
  p=$(prefix "$stack")
  for i in $(seq 0 $((n - 1))); do nets+="${nets:+,}$p-rail$i"; done
  a0=$(wc -l < "$state/log/audit.log")
  c0=$(wc -l < "$state/log/containerd.log")
  t0=$(date +%s.%N)
  pods "$name" "$PODS" "$nets" | k apply -f - > /dev/null
  k wait --for=condition=Ready pod -l "bench=$name" --timeout=900s > /dev/null
  t1=$(date +%s.%N)
  a1=$(wc -l < "$state/log/audit.log")
  k get pods -l "bench=$name" -o json > "$out/cluster-$stack-$n-pods.json"
  tail -n +"$((c0 + 1))" "$state/log/containerd.log" | grep -E 'begin cni setup|cni result' > "$out/cluster-$stack-$n-cni.log" || true
  k delete pod -l "bench=$name" --wait=true --timeout=300s > /dev/null
  wait_released "$stack"
  a2=$(wc -l < "$state/log/audit.log")
  sed -n "$((a0 + 1)),${a1}p" "$state/log/audit.log" > "$out/cluster-$stack-$n-audit-add.log"
  sed -n "$((a1 + 1)),${a2}p" "$state/log/audit.log" > "$out/cluster-$stack-$n-audit-del.log"
  local wall
  wall=$(python3 scripts/bench/benchtool.py elapsed "$t0" "$t1")
  echo "{\"stack\": \"$stack\", \"networks\": $n, \"pods\": $PODS, \"wall_s\": $wall}" > "$out/cluster-$stack-$n.json"
  log "$stack, $n networks: $PODS pods Ready in $wall s"
}

if [ "${PODBENCH:-1}" = 1 ]; then
  check plexus
  check multus
  for n in $NETS; do
    for stack in multus plexus; do
      use_stack "$stack"
      run "$stack" "$n"
    done
  done
  use_stack plexus
  python3 scripts/bench/cluster_summary.py "$out" "$PODS" "$NETS" > "$out/cluster.json"
  cat "$out/cluster.json"
fi

# plexus-ipam's kubernetes store against whereabouts on the same API server: 1,000 allocations by
# 16 concurrent clients, then their release (each on a range of its own), as the IPAM plugins
# are run by a runtime (a process per ADD/DEL, a pod named in CNI_ARGS). whereabouts' failed ADDs
# (its Lease under contention) are DELeted and retried, as the kubelet would, and counted.
if [ "${IPAM:-1}" = 1 ]; then
  k apply -f conf-examples/deploy/rbac-ipam-kubernetes.yaml > /dev/null
  printf '{"dataRoots": ["%s"], "deviceInfoDir": "%s", "kubernetes": {"kubeconfig": "%s", "namespace": "kube-system"}}\n' \
    "$PLEXUS_DATA_DIR" "$state/devinfo" "$CNI_CONF_DIR/plexus.d/plexus.kubeconfig" > "$PLEXUS_POLICY"
  BIN=$(bash scripts/build-release.sh)
  echo '{"cniVersion": "1.0.0", "name": "load", "ipam": {"type": "plexus-ipam", "range": "198.18.164.0/22", "store": "kubernetes"}}' > "$state/px-load.json"
  echo "{\"cniVersion\": \"1.0.0\", \"name\": \"load\", \"ipam\": {\"type\": \"whereabouts\", \"range\": \"198.18.168.0/22\", \"configuration_path\": \"$state/whereabouts.conf\"}}" > "$state/wb-load.json"
  for who in px wb; do
    plugin=$BIN/plexus-ipam conf=$state/px-load.json
    [ "$who" = wb ] && plugin=$PEERS_BIN/whereabouts conf=$state/wb-load.json
    a0=$(wc -l < "$state/log/audit.log")
    ip netns exec "$NODE_NETNS" env PLEXUS_POLICY="$PLEXUS_POLICY" python3 scripts/bench/cni_load.py --plugin "$plugin" \
      --conf "$conf" --count "${IPAM_COUNT:-1000}" --clients 16 --pods --retries 20 --prefix "$who" > "$out/ipam-k8s-$who.json"
    sed -n "$((a0 + 1)),\$p" "$state/log/audit.log" > "$out/ipam-k8s-$who-audit.log"
    log "ipam $who: $(cat "$out/ipam-k8s-$who.json")"
  done
  python3 scripts/bench/benchtool.py ipam-k8s-summary "$out" "${IPAM_COUNT:-1000}" > "$out/ipam-k8s.json"
  cat "$out/ipam-k8s.json"
fi
