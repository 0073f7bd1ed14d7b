#!/usr/bin/env bash
# The soak (issue 19): CYCLES (default 10,000) ADD/DEL cycles through `plexus` with two delegates
# (two plexus-macvlan rails with plexus-ipam, from NAD files), CLIENTS (default 16) concurrent
# clients each with its own pod namespace, every call a real process of the release binaries.
# Prints the JSON of scripts/bench/soak.py (p50/p99 of the first and last 1,000 cycles, open
# files, memory, and what was left) and exits 1 on any failure or leak. Not a test: a benchmark
# (figures in BENCHMARKS.md); run as root on an idle machine.
#
#   bash scripts/soak.sh                    # 10,000 cycles, 16 clients
#   CYCLES=1000 bash scripts/soak.sh        # shorter
set -euo pipefail
cd "$(dirname "$0")/.."
CYCLES=${CYCLES:-10000}
CLIENTS=${CLIENTS:-16}
[ "$(id -u)" = 0 ] || { echo "soak.sh: run as root (namespaces)" >&2; exit 1; }

BIN=$(bash scripts/build-release.sh)
work=$(mktemp -d)
node=plxsoak-n$$
pods=()
cleanup() {
  for p in "${pods[@]}"; do ip netns del "$p" 2>/dev/null || true; done
  ip netns del "$node" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
ip netns add "$node"
ip -n "$node" link set lo up
for i in 0 1; do
  ip -n "$node" link add "nic$i" mtu 9000 type veth peer name "nic${i}p"
  ip -n "$node" link set "nic$i" up; ip -n "$node" link set "nic${i}p" up
done
for c in $(seq 1 "$CLIENTS"); do
  p=plxsoak-p$$-$c
  ip netns add "$p"; pods+=("$p")
  ip -n "$p" link set lo up
done

printf '{"dataRoots": ["%s"]}\n' "$work" > "$work/policy.json"
chmod 600 "$work/policy.json"
export PLEXUS_POLICY=$work/policy.json
mkdir -p "$work/nads"
for i in 0 1; do
  cat > "$work/nads/rail$i.yaml" <<YAML
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: rail$i, namespace: default}
spec:
  config: '{"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic$i", "mtu": 9000, "ipam": {"type": "plexus-ipam", "range": "198.18.$((80 + i)).0/24", "dataDir": "$work/ipam"}}'
YAML
done
echo "{\"cniVersion\":\"1.1.0\",\"name\":\"plexus\",\"type\":\"plexus\",\"nadDir\":\"$work/nads\",\"networks\":\"rail0,rail1\",\"cniDir\":\"$work/cache\",\"binDir\":\"$BIN\"}" > "$work/meta.json"

# One cycle first: what stays (the store's directories, lock file, cursors) exists before counting.
env_run() { ip netns exec "$node" env CNI_COMMAND="$1" CNI_CONTAINERID=warmup CNI_NETNS="/run/netns/${pods[0]}" \
  CNI_IFNAME=net1 CNI_PATH="$BIN:/usr/lib/cni" CNI_ARGS="K8S_POD_NAMESPACE=default;K8S_POD_NAME=warmup" "$BIN/plexus" < "$work/meta.json" >/dev/null; }
env_run ADD; env_run DEL

pod_list=$(IFS=,; echo "${pods[*]}")
ip netns exec "$node" python3 scripts/bench/soak.py --plugin "$BIN/plexus" --conf "$work/meta.json" \
  --pods "$pod_list" --cycles "$CYCLES" --state "$work/ipam,$work/cache" > "$work/soak.json"
cat "$work/soak.json"
python3 scripts/bench/benchtool.py soak-clean "$work/soak.json"
