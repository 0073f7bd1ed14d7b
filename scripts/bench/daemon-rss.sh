#!/usr/bin/env bash
# plexus-daemon against Multus thick's multus-daemon (issue #16), on one real node
# (scripts/cluster.sh) holding the objects of a large cluster: NADS NetworkAttachmentDefinitions
# (default 5,000, in 10 namespaces) and PODS pods (default 10,000; LOCAL of them, default 200,
# bound to the daemons' node, the rest to 49 other node names), created through the real API
# server. Each daemon runs alone as a process on the node with its own ServiceAccount's token,
# watching the same objects with its own node filter; its RSS is read from /proc SETTLE seconds
# after it started (default 30; plexus-daemon's /readyz also says its caches are synced), and
# its cache sizes from its metrics. The controller-manager is stopped meanwhile, so that nothing
# removes or evicts the pods of nodes without a kubelet. Writes OUT/daemon-rss.json; figures,
# never a pass/fail.
#
# What tenants may write (issue 35), with NAD_KIB and FLOOD: every NAD's config padded to NAD_KIB
# KiB (200 NADs of 1,434 KiB: just under etcd's request limit); then, after plexus-daemon's RSS is
# read, FLOOD requests through the plexus shim to it, each naming a delegate type nobody
# installed (every type and network distinct: scripts/bench/type_flood.py), and its RSS and
# metric series read again. NAME names the output (OUT/NAME.json).
#
#   bash scripts/bench/daemon-rss.sh OUT
#   NADS=200 PODS=0 NAD_KIB=1434 FLOOD=10000 NAME=daemon-hostile bash scripts/bench/daemon-rss.sh OUT
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: scripts/bench/daemon-rss.sh OUT_DIR}
mkdir -p "$out"
NADS=${NADS:-5000} PODS=${PODS:-10000} LOCAL=${LOCAL:-200} SETTLE=${SETTLE:-30}
NAD_KIB=${NAD_KIB:-0} FLOOD=${FLOOD:-0} NAME=${NAME:-daemon-rss}
LOCAL=$((LOCAL < PODS ? LOCAL : PODS))
# The DaemonSet's memory limit, for the report.
limit_mib=$(sed -n 's/.*limits: {memory: \([0-9]*\)Mi}.*/\1/p' conf-examples/deploy/daemon/plexus.yaml)

env_file=$(mktemp)
work=$(mktemp -d)
pid=
pod_ns=plxrss-pod$$
trap '[ -z "$pid" ] || kill "$pid" 2> /dev/null || true; ip netns del "$pod_ns" 2> /dev/null || true; bash scripts/cluster.sh down > /dev/null 2>&1 || true; rm -rf "$env_file" "$work"' EXIT
bash scripts/cluster.sh up > "$env_file"
set -a
# shellcheck disable=SC1090
. "$env_file"
set +a
state=$(dirname "$KUBECONFIG")
k() { ip netns exec "$NODE_NETNS" "$PEERS_BIN/kubectl" --kubeconfig "$KUBECONFIG" "$@"; }
log() { echo "bench/daemon-rss.sh: $*" >&2; }
BIN=$(bash scripts/build-release.sh -p plexus-daemon -p plexus)
bash scripts/cluster.sh stop kube-controller-manager

# The CRD and the chart's ServiceAccount and RBAC (the manifests' DaemonSet itself is not run here).
k apply -f deploy/helm/plexus/crds/network-attachment-definitions.yaml > /dev/null
"$PEERS_BIN/helm" template plexus deploy/helm/plexus -n kube-system --show-only templates/serviceaccount.yaml --show-only templates/rbac.yaml | k apply -f - > /dev/null
multus_dir=$PEERS_BIN/../share/multus
python3 scripts/bench/benchtool.py rbac-docs "$multus_dir/deployments/multus-daemonset-thick.yml" | k apply -f - > /dev/null

log "creating $NADS NADs (configs padded to ${NAD_KIB} KiB) and $PODS pods ($LOCAL on bench-node)"
python3 scripts/bench/benchtool.py fleet "$work/objects" "$NADS" "$PODS" "$LOCAL" "$NAD_KIB"
k create -f "$(ls "$work/objects"/*.json | head -1)" > /dev/null
ls "$work/objects" | tail -n +2 | xargs -P 4 -I{} sh -c "ip netns exec '$NODE_NETNS' '$PEERS_BIN/kubectl' --kubeconfig '$KUBECONFIG' create -f '$work/objects/{}' > /dev/null"
log "created: $(k get network-attachment-definitions -A --no-headers | wc -l) NADs, $(k get pods -A --no-headers | wc -l) pods"

token_for() { k -n kube-system create token "$1" --duration 1h; }
rss_of() { awk '/^VmRSS/ {r=$2} /^VmHWM/ {h=$2} END {printf "{\"rss_kib\": %d, \"hwm_kib\": %d}", r, h}' "/proc/$1/status"; }

log "plexus-daemon"
token_for plexus > "$work/plexus.token"
cat > "$work/plexus.kubeconfig" << KC
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "https://198.18.250.1:6443", certificate-authority: "$state/pki/ca.crt"}}]
users: [{name: plexus, user: {tokenFile: "$work/plexus.token"}}]
contexts: [{name: plexus, context: {cluster: local, user: plexus}}]
current-context: plexus
KC
ip netns exec "$NODE_NETNS" "$BIN/plexus-daemon" --kubeconfig "$work/plexus.kubeconfig" --node-name bench-node \
  --socket "$work/plexus-run/daemon.sock" --status-journal "$work/plexus-run/network-status" --metrics-address 127.0.0.1:9135 --log-level warn 2> "$work/plexus-daemon.log" &
pid=$!
start=$(date +%s.%N)
until ip netns exec "$NODE_NETNS" curl -sf http://127.0.0.1:9135/readyz > /dev/null 2>&1; do sleep 0.1; done
synced=$(printf "%.3f" "$(echo "$(date +%s.%N) - $start" | bc)")
sleep "$SETTLE"
plexus_rss=$(rss_of "$pid")
metrics=$(ip netns exec "$NODE_NETNS" curl -sf http://127.0.0.1:9135/metrics)
cached_nads=$(echo "$metrics" | awk '/^plexus_daemon_cached_objects\{kind="network-attachment-definition"\}/ {print $2}')
cached_pods=$(echo "$metrics" | awk '/^plexus_daemon_cached_objects\{kind="pod"\}/ {print $2}')
log "plexus-daemon: $plexus_rss, synced after ${synced}s, cached ${cached_nads:-0} NADs and ${cached_pods:-0} pods"
flood='null'
if [ "$FLOOD" -gt 0 ]; then
  log "plexus-daemon: $FLOOD requests of distinct unknown delegate types"
  ip netns add "$pod_ns"
  mkdir -p "$work/flood"
  sent=$(ip netns exec "$NODE_NETNS" python3 scripts/bench/type_flood.py --shim "$BIN/plexus" \
    --socket "$work/plexus-run/daemon.sock" --netns "/run/netns/$pod_ns" --work "$work/flood" --count "$FLOOD")
  after=$(rss_of "$pid")
  series=$(ip netns exec "$NODE_NETNS" curl -sf http://127.0.0.1:9135/metrics | grep -c '^plexus_daemon_delegate_duration_seconds_count' || true)
  flood="{\"sent\": $sent, \"after\": $after, \"delegate_series\": $series}"
  log "plexus-daemon after the flood: $after, $series delegate series"
fi
kill "$pid"; wait "$pid" 2> /dev/null || true; pid=

log "multus-daemon (Multus thick)"
mkdir -p "$work/sa" "$work/multus-run" "$work/multus-net.d"
token_for multus > "$work/sa/token"
cp "$state/pki/ca.crt" "$work/sa/ca.crt"
# As its thick DaemonSet runs it: "multusConfigFile": "auto" (its config manager writes the
# multus conf from the primary network's and keeps the daemon running; with a file named there
# multus-daemon v4.2 returns from main at once).
echo '{"cniVersion": "0.3.1", "name": "bootstrap", "type": "bridge"}' > "$work/multus-net.d/00-default.conf"
cat > "$work/multus-daemon.json" << JSON
{"chrootDir": "/", "cniVersion": "0.3.1", "logLevel": "error", "logToStderr": true,
 "cniConfigDir": "$work/multus-net.d", "multusAutoconfigDir": "$work/multus-net.d",
 "multusConfigFile": "auto", "socketDir": "$work/multus-run"}
JSON
# In-cluster configuration, as in its DaemonSet: the token and CA where client-go looks for them
# (a tmpfs over /run in a mount namespace of its own), the API server's service address.
ip netns exec "$NODE_NETNS" unshare -m --propagation private sh -c "
  mount -t tmpfs tmpfs /run && mkdir -p /run/secrets/kubernetes.io/serviceaccount &&
  cp '$work/sa/token' '$work/sa/ca.crt' /run/secrets/kubernetes.io/serviceaccount/ &&
  exec env KUBERNETES_SERVICE_HOST=198.18.250.1 KUBERNETES_SERVICE_PORT=6443 MULTUS_NODE_NAME=bench-node \
    '$PEERS_BIN/multus-daemon' -config '$work/multus-daemon.json'" 2> "$work/multus-daemon.log" &
pid=$!
sleep 2
mpid=$(pgrep -P "$pid" -f multus-daemon || echo "$pid")
sleep "$SETTLE"
if ! kill -0 "$mpid" 2> /dev/null || [ ! -S "$work/multus-run/multus.sock" ]; then
  log "multus-daemon did not serve (pid $mpid); its log:"; tail -30 "$work/multus-daemon.log" >&2; exit 1
fi
multus_rss=$(rss_of "$mpid")
kill "$pid" "$mpid" 2> /dev/null || true; wait "$pid" 2> /dev/null || true; pid=

cat > "$out/$NAME.json" << JSON
{"nads": $NADS, "pods": $PODS, "local": $LOCAL, "settle_s": $SETTLE, "plexus_synced_s": $synced, "nad_kib": $NAD_KIB,
 "limit_mib": $limit_mib, "plexus_cached": {"nads": ${cached_nads:-0}, "pods": ${cached_pods:-0}},
 "plexus": $plexus_rss, "multus": $multus_rss, "flood": $flood}
JSON
cat "$out/$NAME.json"
