#!/usr/bin/env bash
# plexus at N hollow nodes (scripts/cluster.sh up --hollow N; docs/hollow-nodes.md), side by side
# with the stack it replaces: for each stack of STACKS and each N, the 8 RoCE networks (8 NADs, a
# macvlan on each rail's port, one /21 per rail: for plexus, plexus-macvlan with plexus-ipam's
# Kubernetes store on whereabouts' objects through plexus-daemon; for multus, the reference
# macvlan with whereabouts and its Lease through Multus thick's multus-daemon on every node; for
# nodeslice, the same with whereabouts' node slices, a /28 of each rail per node; for blocks,
# plexus with plexus-ipam's pools, an nv-ipam IPPool per rail whose nodes claim blocks of
# BLOCK_SIZE (16) addresses and allocate from them in their own files), PODS
# pods per node created at once across all nodes with all 8 networks, then deleted at once. Per
# stack and N:
#   - CNI ADD and DEL p50/p99 (the kubelet stand-in's timings of the shim's exec), pods Ready
#     and gone p50/p99 (from the create or delete request to the watch event);
#   - API requests per pod by the stack's service accounts (the audit log: plexus; multus and
#     whereabouts), and what they were;
#   - the API server's and etcd's CPU seconds over the burst and their RSS; plexus-daemon's RSS
#     per node (median and largest) after the burst, and again with 5,000 more NADs in the
#     cluster (a namespace of NADs no pod uses); the watches open on the API server;
#   - ResourceSlice writes per minute at steady state (a minute with nothing asked of the nodes);
#   - a daemon restarted on a running cluster: from its start to ready (plexus-daemon: caches
#     synced, slice published, registered with the stand-in; multus-daemon: its socket served);
#   - duplicate addresses among the pods' secondary interfaces (must be 0), and what the burst left
#     in the store (IPPool entries, OverlappingRangeIPReservations) once its pods are gone;
#   - a steady churn (scale.py churn): PODS/2 pods per node kept, CHURN_RATE (N/16) pods a second
#     replaced for CHURN_SECONDS (60): CNI ADD and new pods' Ready p50/p99, duplicates among the
#     live pods every 5 s;
#   - the stack's lists and watches of pods that did not name the node (plexus: must be 0).
# Writes OUT/scale-STACK-N.json, OUT/scale.json (all) and OUT/scale.svg (p99 CNI ADD and API
# requests per pod against N, a line per stack: docs/scale.svg is a copy); figures, never a
# pass/fail on time. BURST_TIMEOUT (seconds, default 900) bounds the wait for the pods to be Ready
# and then gone: a stack that does not make it is a result, with what it left.
#
#   bash scripts/bench/scale.sh OUT                 # STACKS="plexus multus nodeslice", N = 16 64 128
#   STACKS=plexus NODES="8 16" PODS=4 bash scripts/bench/scale.sh OUT
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: scripts/bench/scale.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
NODES=${NODES:-16 64 128}
STACKS=${STACKS:-plexus multus nodeslice}
PODS=${PODS:-8}
log() { echo "bench/scale.sh: $*" >&2; }

env_file=$(mktemp)
cleanup() {
  bash scripts/cluster.sh down > /dev/null 2>&1 || true
  rm -f "$env_file"
}
trap cleanup EXIT

# cpu PID: its user + system CPU seconds so far.
cpu() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"; }
# rss_kib PID: its resident set now (KiB).
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
# agents_rss N: the node agents' resident sets (pids/daemon-K of the N hollow nodes), median and
# largest, as JSON.
agents_rss() {
  for k in $(seq "$1"); do rss_kib "$(cat "$HOLLOW_DIR/pids/daemon-$k")"; done | sort -n |
    awk '{v[NR] = $1} END {printf "{\"median_kib\": %d, \"max_kib\": %d}", v[int((NR + 1) / 2)], v[NR]}'
}

# The shim's ADD or DEL durations (ms) of the timings file's lines FROM..TO (of the calls started
# at SINCE, Unix ms, or later), as p50/p99/max.
cni_spread() { # FILE FROM TO VERB [SINCE]
  sed -n "$2,$3p" "$1" | python3 -c '
import json, sys
sys.path.insert(0, "scripts/bench")
from scale import spread
v = [x for x in map(json.loads, sys.stdin) if x["start_ms"] >= int(sys.argv[2])]
ok = [x["ms"] for x in v if x["verb"] == sys.argv[1] and not x["error"]]
print(json.dumps(dict(spread(ok), failed=sum(1 for x in v if x["verb"] == sys.argv[1] and x["error"]))))' "$4" "${5:-0}"
}

# The service accounts of a stack's node agents.
accounts() { case $1 in plexus | blocks) echo plexus ;; multus | nodeslice) echo multus whereabouts ;; esac; }

# What the audit log's lines FROM..TO say the stack's service accounts asked, per verb and resource.
audit_of() { # STACK FROM TO
  sed -n "$2,$3p" "$state/log/audit.log" | python3 -c '
import json, sys, collections
users = ["system:serviceaccount:kube-system:" + a for a in sys.argv[1:]]
c = collections.Counter()
for l in sys.stdin:
    e = json.loads(l)
    if e["user"]["username"] not in users:
        continue
    r = e.get("objectRef") or {}
    c[e["verb"] + " " + r.get("resource", "") + ("/" + r["subresource"] if r.get("subresource") else "")] += 1
print(json.dumps({"total": sum(c.values()), "by": dict(c.most_common())}))' $(accounts "$1")
}

# How often the stack's service accounts listed or watched pods without naming a node (the whole
# log: the daemons' starts, the burst, the restart). Multus listed every pod of the cluster at
# start before multus-cni PR #1434; a node's daemon should never.
cluster_wide_pod_reads() { # STACK
  python3 -c '
import json, sys
users = ["system:serviceaccount:kube-system:" + a for a in sys.argv[2:]]
n = 0
for l in open(sys.argv[1]):
    e = json.loads(l)
    r = e.get("objectRef") or {}
    if (e["user"]["username"] in users and e["verb"] in ("list", "watch")
            and r.get("resource") == "pods" and "spec.nodeName" not in e["requestURI"].replace("%3D", "=")):
        n += 1
print(n)' "$state/log/audit.log" $(accounts "$1")
}

results=()
for stack in $STACKS; do
  case $stack in
    plexus) label=plexus ;;
    multus) label=multus+whereabouts ;;
    nodeslice) label="multus+whereabouts node slices" ;;
    blocks) label="plexus blocks" ;;
    *) log "STACKS: plexus, multus, nodeslice, blocks"; exit 2 ;;
  esac
  hollow_stack=$stack
  [ "$stack" = blocks ] && hollow_stack=plexus
  for n in $NODES; do
    log "$label: $n hollow nodes"
    bash scripts/cluster.sh up --hollow "$n" --hollow-stack "$hollow_stack" > "$env_file"
    set -a
    # shellcheck disable=SC1090
    . "$env_file"
    set +a
    state=$(dirname "$KUBECONFIG")
    kctl() { ip netns exec "$NODE_NETNS" "$PEERS_BIN/kubectl" --kubeconfig "$KUBECONFIG" "$@"; }
    awk -F, 'NR == 1 {print $1}' "$state/pki/tokens.csv" > "$out/.token"
    api=https://198.18.250.1:6443
    python3 scripts/bench/scale.py nads "$stack" 0 "$HOLLOW_DIR/whereabouts.conf" > "$out/nads-$stack.json"
    apiserver=$(cat "$state/pids/kube-apiserver") etcd=$(cat "$state/pids/etcd")
    watches=$(kctl get --raw /metrics | awk '/^apiserver_longrunning_requests\{.*verb="WATCH"/ {s += $2} END {print s + 0}')
    if [ "$stack" = blocks ]; then
      python3 scripts/bench/scale.py ippools 0 "${BLOCK_SIZE:-16}" | kctl apply -f - > /dev/null
    fi
    if [ "$stack" = nodeslice ]; then
      log "$label, $n nodes: the NADs, and every node's slices"
      ip netns exec "$NODE_NETNS" python3 scripts/bench/scale.py slices "$api" "$out/.token" "$state/pki/ca.crt" \
        "$out/nads-$stack.json" "$n" > /dev/null
    fi

    log "$label, $n nodes: $((n * PODS)) pods at once, then deleted"
    a0=$(($(wc -l < "$state/log/audit.log") + 1)) t0=$(($(wc -l < "$HOLLOW_TIMINGS" 2> /dev/null || echo 0) + 1))
    c0_api=$(cpu "$apiserver") c0_etcd=$(cpu "$etcd")
    ip netns exec "$NODE_NETNS" python3 scripts/bench/scale.py burst "$api" "$out/.token" "$state/pki/ca.crt" \
      "$n" "$PODS" "$out/nads-$stack.json" "$out/scale-$stack-$n-burst.json" > /dev/null
    c1_api=$(cpu "$apiserver") c1_etcd=$(cpu "$etcd")
    a1=$(wc -l < "$state/log/audit.log") t1=$(wc -l < "$HOLLOW_TIMINGS")
    # What the burst left in the store once every pod is gone (whereabouts' objects, both stacks').
    left_entries=$(kctl get ippools.whereabouts.cni.cncf.io -A -o json |
      python3 -c 'import json, sys; print(sum(len(p["spec"].get("allocations") or {}) for p in json.load(sys.stdin)["items"]))')
    left_reservations=$(kctl get overlappingrangeipreservations.whereabouts.cni.cncf.io -A --no-headers 2> /dev/null | wc -l)
    daemon_rss=$(agents_rss "$n")

    log "$label, $n nodes: a minute at steady state"
    a2=$(($(wc -l < "$state/log/audit.log") + 1))
    sleep 60
    a3=$(wc -l < "$state/log/audit.log")
    slice_writes=$(sed -n "$a2,${a3}p" "$state/log/audit.log" | grep '"resource":"resourceslices"' |
      grep -c -E '"verb":"(create|update|patch|delete)"' || true)

    log "$label, $n nodes: a daemon restarted"
    ready_ms=$(bash scripts/cluster.sh hollow-restart 1)

    rate=${CHURN_RATE:-$(python3 -c "print(max(0.5, $n / 16))")}
    log "$label, $n nodes: a steady churn, $rate pods replaced a second for ${CHURN_SECONDS:-60} s"
    t2=$(($(wc -l < "$HOLLOW_TIMINGS") + 1))
    ip netns exec "$NODE_NETNS" python3 scripts/bench/scale.py churn "$api" "$out/.token" "$state/pki/ca.crt" \
      "$n" "$PODS" "$out/nads-$stack.json" "${CHURN_SECONDS:-60}" "$rate" "$out/scale-$stack-$n-churn.json" > /dev/null
    t3=$(wc -l < "$HOLLOW_TIMINGS")

    log "$label, $n nodes: 5,000 NADs in the cluster"
    nads_made=$(ip netns exec "$NODE_NETNS" python3 scripts/bench/scale.py many-nads "$api" "$out/.token" \
      "$state/pki/ca.crt" 5000)
    sleep 15 # the daemons' watches deliver them
    rss_5000=$(agents_rss "$n")

    python3 - "$out/scale-$stack-$n.json" << EOF
import json, sys
burst = json.load(open("$out/scale-$stack-$n-burst.json"))
churn = json.load(open("$out/scale-$stack-$n-churn.json"))
# The churn's ADDs only, not those of the pods it keeps (made before it starts).
churn["cni_add_ms"] = json.loads(r"""$(cni_spread "$HOLLOW_TIMINGS" "$t2" "$t3" ADD \
  "$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["started_ms"])' "$out/scale-$stack-$n-churn.json")")""")
pods = burst["pods"]
# JSON the shell functions printed (a spread with no successful ADD has nulls).
audit = json.loads(r"""$(audit_of "$stack" "$a0" "$a1")""")
add_ms = json.loads(r"""$(cni_spread "$HOLLOW_TIMINGS" "$t0" "$t1" ADD)""")
del_ms = json.loads(r"""$(cni_spread "$HOLLOW_TIMINGS" "$t0" "$t1" DEL)""")
json.dump({
  "stack": "$label", "nodes": $n, "pods": pods, "networks_per_pod": 8,
  "cni_add_ms": add_ms, "cni_del_ms": del_ms,
  "pod_ready_ms": burst["ready_ms"], "pod_gone_ms": burst["gone_ms"],
  "all_ready_s": burst["all_ready_s"], "not_ready": burst["not_ready_count"], "errors": burst["errors"],
  "not_gone": burst["not_gone_count"],
  "api_requests_per_pod": round(audit["total"] / pods, 2), "api_requests": audit["by"],
  "apiserver_cpu_s": round($c1_api - $c0_api, 1), "etcd_cpu_s": round($c1_etcd - $c0_etcd, 1),
  "apiserver_cpu_s_per_pod": round(($c1_api - $c0_api) / pods, 3),
  "apiserver_rss_mib": round($(rss_kib "$apiserver") / 1024), "etcd_rss_mib": round($(rss_kib "$etcd") / 1024),
  "daemon_rss": $daemon_rss, "watches_open": $watches,
  "nads_in_cluster": 8 + $nads_made, "daemon_rss_with_nads": $rss_5000,
  "cluster_wide_pod_reads": $(cluster_wide_pod_reads "$stack"),
  "resourceslice_writes_per_minute": $slice_writes, "daemon_start_to_ready_ms": $ready_ms,
  "duplicates": burst["duplicates"], "churn": churn,
  "left_after_burst": {"pool_entries": $left_entries, "reservations": $left_reservations},
}, open(sys.argv[1], "w"), indent=1)
EOF
    results+=("$out/scale-$stack-$n.json")
    cat "$out/scale-$stack-$n.json" >&2
    bash scripts/cluster.sh down > /dev/null
  done
done
python3 -c 'import json, sys; json.dump([json.load(open(f)) for f in sys.argv[2:]], open(sys.argv[1], "w"), indent=1)' \
  "$out/scale.json" "${results[@]}"
python3 scripts/bench/scale.py plot "$out/scale.json" "$out/scale.svg"
rm -f "$out/.token"
