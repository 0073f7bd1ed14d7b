#!/usr/bin/env bash
# Every benchmark the plugin issues define, side by side with the Debian reference plugins and
# the `ip -batch` floor, then BENCHMARKS.md rewritten with medians, ratios, the machine and the
# date. Benchmarks print figures; they never fail on a time. Run as root on an idle machine:
#
#   bash scripts/bench.sh            # all sections
#   RUNS=100 bash scripts/bench.sh   # fewer runs
set -euo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)
RUNS=${RUNS:-300}
WARMUP=${WARMUP:-10}

[ "$(id -u)" = 0 ] || { echo "bench.sh: run as root (namespaces)" >&2; exit 1; }
source scripts/lib/packages.sh
need_packages containernetworking-plugins iproute2 time python3
# hyperfine -N needs --input (stdin for CNI plugins without a shell in between): Debian's 1.15
# lacks it, so a newer hyperfine comes from crates.io into target/tools.
HF=$top/target/tools/bin/hyperfine
if ! "$HF" --help 2>/dev/null | grep -q -- '--input'; then
  cargo install --locked hyperfine --version 1.20.0 --root "$top/target/tools"
fi

echo "== building release binaries (scripts/build-release.sh: static, as shipped)"
BIN=$(bash scripts/build-release.sh)
# The tests' fake API server as a process (an example, which the shipped build leaves out).
bash scripts/build-release.sh --workspace --bins --examples > /dev/null
REF=/usr/lib/cni

# SECTIONS picks sections (default: all); BENCH_WORK keeps results in (and reuses) a directory, so
# a later run can add sections to the same report.
# "fuzz" (every fuzz target to 10 million executions: hours) runs only when named, and "ab" (this
# build against an earlier one, AB_OLD: a commit or a directory of its shipped build) too.
SECTIONS=${SECTIONS:-macvlan ipam fill etcd hostdev meta rails cluster daemon soak}
want() { case " $SECTIONS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
work=${BENCH_WORK:-$(mktemp -d)}
mkdir -p "$work"
# The node policy the benchmarks run under: their stores and state live in $work.
printf '{"dataRoots": ["%s"]}\n' "$work" > "$work/policy.json"
chmod 600 "$work/policy.json"
export PLEXUS_POLICY="$work/policy.json"
node=plxbench-n$$ pod=plxbench-p$$
cleanup() {
  ip netns del "$pod" 2>/dev/null || true; ip netns del "$node" 2>/dev/null || true
  [ -n "${BENCH_WORK:-}" ] || rm -rf "$work"
}
trap cleanup EXIT INT TERM
ip netns add "$node"; ip netns add "$pod"
ip -n "$node" link set lo up
ip -n "$node" link add nic0 mtu 9000 type veth peer name nic0p
ip -n "$node" link set nic0 up; ip -n "$node" link set nic0p up
ip -n "$pod" link set lo up

# hf NAME [hyperfine args...]: run hyperfine inside the node namespace with the CNI environment.
hf() {
  local name=$1; shift
  ip netns exec "$node" env CNI_CONTAINERID=bench CNI_NETNS=/run/netns/$pod CNI_IFNAME=net1 CNI_PATH=$BIN:$REF \
    "$@" 2>&1 | tee "$work/$name.log" >/dev/null
}
unlink_pod="sh -c 'ip -n $pod link del net1 2>/dev/null; true'"

# hf_rounds NAME RUNS-PER-ROUND HYPERFINE-ARGS... -- UNITS...: hyperfine in ROUNDS rounds, the
# commands' order rotated each round, so a drift of the machine's speed during the run does not
# fall on one command; the report pools the rounds' times. A unit is `[--prepare CMD] -n NAME CMD`.
ROUNDS=${ROUNDS:-5}
hf_rounds() {
  local name=$1 runs=$2 sep=$'\x1f' cur="" common=() units=() part=() args=() i r n
  shift 2
  while [ "$1" != "--" ]; do common+=("$1"); shift; done
  shift
  while [ $# -gt 0 ]; do
    if [ "$1" = "-n" ]; then units+=("$cur$1$sep$2$sep$3"); cur=""; shift 3; else cur+="$1$sep$2$sep"; shift 2; fi
  done
  n=${#units[@]}
  rm -f "$work/$name".r*.json
  for ((r = 0; r < ROUNDS; r++)); do
    args=()
    for ((i = 0; i < n; i++)); do
      IFS=$sep read -r -a part <<< "${units[(i + r) % n]}"
      args+=("${part[@]}")
    done
    hf "$name.r$r" "${common[@]}" --runs "$runs" --export-json "$work/$name.r$r.json" "${args[@]}"
  done
}

# rss NAME CONF CMD...: peak RSS (KiB) of one ADD, the link removed first.
rss() {
  local conf=$1; shift
  ip -n "$pod" link del net1 2>/dev/null || true
  ip netns exec "$node" env CNI_COMMAND=ADD CNI_CONTAINERID=bench CNI_NETNS=/run/netns/$pod CNI_IFNAME=net1 \
    CNI_PATH=$BIN:$REF /usr/bin/time -f '%M' -o "$work/rss" "$@" < "$conf" > /dev/null
  cat "$work/rss"
}

if want macvlan; then
echo "== macvlan"
cat > "$work/static.json" <<JSON
{"cniVersion":"1.0.0","name":"bench","type":"macvlan","master":"nic0","mode":"bridge",
 "ipam":{"type":"static","addresses":[{"address":"198.18.0.10/24","gateway":"198.18.0.1"}],"routes":[{"dst":"198.19.0.0/16"}]}}
JSON
cat > "$work/l2.json" <<JSON
{"cniVersion":"1.0.0","name":"bench","type":"macvlan","master":"nic0","mode":"bridge"}
JSON
# Two floors by `ip -batch`, one process each. The floor the issue names does the same netlink
# operations as the plugin: create the macvlan in the pod under a temporary name, then rename it and
# bring it up (from inside the pod: `link-netns` names the master's namespace, `if<N>` its index).
# The stricter one creates it named, sized and up in ONE request from the node namespace.
ip -n "$pod" netns set "$node" auto 2>/dev/null || true
master_idx=$(ip -n "$node" -o link show nic0 | cut -d: -f1)
printf '%s\n' "link add link if$master_idx link-netns $node name plxtmp0 mtu 9000 type macvlan mode bridge" \
  "link set plxtmp0 name net1 up" > "$work/floor-same.batch"
echo "link add link nic0 name net1 mtu 9000 netns $pod up type macvlan mode bridge" > "$work/floor.batch"

per_round=$(( RUNS / ROUNDS ))
hf_rounds macvlan-add-static "$per_round" env CNI_COMMAND=ADD "$HF" -N --warmup "$WARMUP" --input "$work/static.json" \
  --prepare "$unlink_pod" -- -n plexus-macvlan "$BIN/plexus-macvlan" -n reference-macvlan "$REF/macvlan"
hf_rounds macvlan-add-l2 "$per_round" env CNI_COMMAND=ADD "$HF" -N --warmup "$WARMUP" --input "$work/l2.json" \
  --prepare "$unlink_pod" -- -n plexus-macvlan "$BIN/plexus-macvlan" -n reference-macvlan "$REF/macvlan" \
  -n ip-batch-floor-same-ops "ip -n $pod -batch $work/floor-same.batch" -n ip-batch-floor-one-request "ip -batch $work/floor.batch"
# DEL runs on a link that has been up for 300 ms, as in production where DEL comes long after ADD:
# right after link-up the kernel's IPv6 start-up work (DAD, MLD) is in flight and the unregister
# time depends on how soon DEL follows ADD, which would reward the slower plugin.
add_ours="sh -c 'ip -n $pod link del net1 2>/dev/null; CNI_COMMAND=ADD $BIN/plexus-macvlan < $work/static.json >/dev/null; sleep 0.3'"
add_ref="sh -c 'ip -n $pod link del net1 2>/dev/null; CNI_COMMAND=ADD $REF/macvlan < $work/static.json >/dev/null; sleep 0.3'"
DEL_RUNS=$(( RUNS < 100 ? RUNS : 100 ))
hf_rounds macvlan-del "$(( DEL_RUNS / ROUNDS ))" env CNI_COMMAND=DEL "$HF" -N --warmup 3 --input "$work/static.json" -- \
  --prepare "$add_ours" -n plexus-macvlan "$BIN/plexus-macvlan" \
  --prepare "$add_ref" -n reference-macvlan "$REF/macvlan"
rss_ours=$(rss "$work/static.json" "$BIN/plexus-macvlan")
rss_ref=$(rss "$work/static.json" "$REF/macvlan")
ip -n "$pod" link del net1 2>/dev/null || true

echo "{\"ours\": $rss_ours, \"reference\": $rss_ref}" > "$work/macvlan-rss.json"
fi

load() { ip netns exec "$node" python3 scripts/bench/cni_load.py --netns "/run/netns/$pod" "$@"; }
ipam_conf() { # name plugin range datadir [extra json]
  if [ "$2" = host-local ]; then
    echo "{\"cniVersion\":\"1.0.0\",\"name\":\"$1\",\"ipam\":{\"type\":\"host-local\",\"ranges\":[[{\"subnet\":\"$3\"}]],\"dataDir\":\"$4\"}}"
  else
    echo "{\"cniVersion\":\"1.0.0\",\"name\":\"$1\",\"ipam\":{\"type\":\"plexus-ipam\",\"range\":\"$3\",\"dataDir\":\"$4\",\"nodeName\":\"bench\"${5:-}}}"
  fi
}
if want ipam; then
echo "== ipam (file store vs host-local)"
rm -rf "$work"/{ours,hl}-{single,conc}   # a reused BENCH_WORK starts from empty pools
ipam_conf single plexus-ipam 198.18.0.0/24 "$work/ours-single" > "$work/ipam-ours.json"
ipam_conf single host-local 198.18.0.0/24 "$work/hl-single" > "$work/ipam-hl.json"
# One resident attachment in each store, as on a node where other pods hold addresses: plexus-ipam
# removes a store that holds nothing, so without one every timed ADD would make its store anew.
for plugin in "$BIN/plexus-ipam:$work/ipam-ours.json" "$REF/host-local:$work/ipam-hl.json"; do
  ip netns exec "$node" env CNI_COMMAND=ADD CNI_CONTAINERID=resident CNI_NETNS="/run/netns/$pod" CNI_IFNAME=net1 \
    CNI_PATH="$BIN:$REF" "${plugin%%:*}" < "${plugin#*:}" > /dev/null
done
hf ipam-add env CNI_COMMAND=ADD "$HF" -N --runs "$RUNS" --warmup "$WARMUP" --export-json "$work/ipam-add.json" \
  --input "$work/ipam-ours.json" \
  --prepare "sh -c 'CNI_COMMAND=DEL $BIN/plexus-ipam < $work/ipam-ours.json'" -n plexus-ipam "$BIN/plexus-ipam"
hf ipam-add-hl env CNI_COMMAND=ADD "$HF" -N --runs "$RUNS" --warmup "$WARMUP" --export-json "$work/ipam-add-hl.json" \
  --input "$work/ipam-hl.json" \
  --prepare "sh -c 'CNI_COMMAND=DEL $REF/host-local < $work/ipam-hl.json'" -n host-local "$REF/host-local"
ipam_conf conc plexus-ipam 198.18.0.0/22 "$work/ours-conc" > "$work/ipam-ours-conc.json"
ipam_conf conc host-local 198.18.0.0/22 "$work/hl-conc" > "$work/ipam-hl-conc.json"
load --plugin "$BIN/plexus-ipam" --conf "$work/ipam-ours-conc.json" --count 512 --clients 16 > "$work/ipam-conc-ours.json"
load --plugin "$REF/host-local" --conf "$work/ipam-hl-conc.json" --count 512 --clients 16 > "$work/ipam-conc-hl.json"

fi

if want fill; then
echo "== ipam: allocation time as the pool fills (plexus: a /16 to 90 %; host-local: a /20)"
# host-local's ADD scans every allocation file for the container ID, so filling a /16 with it
# takes hours; its curve is taken on a /20 (4094 addresses).
rm -rf "$work/ours-fill" "$work/hl-fill"   # a reused BENCH_WORK starts from empty pools
ipam_conf fill plexus-ipam 198.18.0.0/16 "$work/ours-fill" > "$work/ipam-ours-fill.json"
ipam_conf fill host-local 198.19.0.0/20 "$work/hl-fill" > "$work/ipam-hl-fill.json"
for which in ours hl; do
  plugin=$BIN/plexus-ipam; size=65534
  if [ $which = hl ]; then plugin=$REF/host-local; size=4094; fi
  filled=0
  for pct in 10 30 50 70 90; do
    target=$(( size * pct / 100 ))
    load --plugin "$plugin" --conf "$work/ipam-$which-fill.json" --count $(( target - filled )) --clients 16 \
      --phase add --prefix "fill${pct}-" > /dev/null
    filled=$target
    hf "ipam-curve-$which-$pct" env CNI_COMMAND=ADD "$HF" -N --runs 100 --warmup 5 \
      --export-json "$work/ipam-curve-$which-$pct.json" --input "$work/ipam-$which-fill.json" \
      --prepare "sh -c 'CNI_COMMAND=DEL $plugin < $work/ipam-$which-fill.json'" -n "$which" "$plugin"
  done
done

fi

if want etcd; then
echo "== ipam: etcd store, 1000 allocations, 16 clients, 4 simulated nodes"
etcd_dir=$work/etcd
rm -rf "$etcd_dir"
cport=$(python3 scripts/bench/benchtool.py free-port)
pport=$(python3 scripts/bench/benchtool.py free-port)
ip netns exec "$node" etcd --name bench --data-dir "$etcd_dir" --log-level error \
  --listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
  --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
  --initial-cluster "bench=http://127.0.0.1:$pport" > "$work/etcd.log" 2>&1 &
etcd_pid=$!
trap 'kill $etcd_pid 2>/dev/null; wait $etcd_pid 2>/dev/null || true; cleanup' EXIT
# etcd endpoints come from a store profile of the node policy, never from a network config.
printf '{"dataRoots": ["%s"], "stores": {"bench-etcd": {"etcd": {"endpoints": ["http://127.0.0.1:%s"], "blockSize": 16}}}}\n' \
  "$work" "$cport" > "$work/policy.json"
for _ in $(seq 100); do
  ip netns exec "$node" env ETCDCTL_API=3 etcdctl --endpoints "http://127.0.0.1:$cport" endpoint health >/dev/null 2>&1 && break
  sleep 0.1
done
confs=""
for n in 0 1 2 3; do
  ipam_conf etcd plexus-ipam 198.18.0.0/20 unused ",\"store\":\"bench-etcd\"" \
    | sed "s/\"nodeName\":\"bench\"/\"nodeName\":\"node-$n\"/" > "$work/ipam-etcd-$n.json"
  confs="$confs${confs:+,}$work/ipam-etcd-$n.json"
done
load --plugin "$BIN/plexus-ipam" --conf "$confs" --count 1000 --clients 16 > "$work/ipam-etcd.json"
kill $etcd_pid; wait $etcd_pid 2>/dev/null || true
trap cleanup EXIT INT TERM
fi


if want hostdev; then
echo "== host-device: ADD+DEL cycle (plexus vs reference)"
ip -n "$node" link add ens1f0 mtu 9000 type veth peer name ens1f0p
ip -n "$node" link set ens1f0 up; ip -n "$node" link set ens1f0p up
ip -n "$node" addr add 198.18.60.5/24 dev ens1f0
cat > "$work/hostdev.json" <<JSON
{"cniVersion":"1.0.0","name":"bench","type":"host-device","device":"ens1f0","dataDir":"$work/hd-state",
 "ipam":{"type":"static","addresses":[{"address":"198.18.61.2/24"}]}}
JSON
# One timed command = ADD then DEL; hyperfine's shell mode subtracts the shell's own start-up.
cycle() { echo "CNI_COMMAND=ADD $1 < $work/hostdev.json > /dev/null && CNI_COMMAND=DEL $1 < $work/hostdev.json > /dev/null"; }
# Two references: Debian bookworm's 1.1.1 moves the device once each way; upstream moves it twice
# each way, through a temporary namespace (plugins#1073, the version the issue's target is set
# against), fetched from Debian unstable. And the floor: the same kernel work done by `ip`, one
# move each way (address, up, move back, address and up restored as plexus does).
UPSTREAM=$(bash scripts/tools/fetch-upstream-plugins.sh)
echo "{\"version\": \"$(basename "$UPSTREAM")\"}" > "$work/upstream.json"
ipn="ip -n $pod"
floor="ip link set ens1f0 netns $pod name net1 && $ipn addr add 198.18.61.2/24 dev net1 && $ipn link set net1 up"
floor="$floor && $ipn link set net1 netns $node name ens1f0 && ip addr add 198.18.60.5/24 dev ens1f0 && ip link set ens1f0 up"
hf hostdev-cycle "$HF" --runs "$(( RUNS < 100 ? RUNS : 100 ))" --warmup 5 --export-json "$work/hostdev-cycle.json" \
  -n plexus-host-device "$(cycle "$BIN/plexus-host-device")" -n reference-host-device "$(cycle "$REF/host-device")" \
  -n upstream-host-device "$(cycle "$UPSTREAM/host-device")" -n floor-one-move "$floor"

fi

if want meta; then
echo "== meta-plugin overhead: plexus (nadDir) over calling the delegate directly"
mkdir -p "$work/nads"
cat > "$work/nads/rail0.yaml" <<YAML
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: rail0, namespace: default}
spec:
  config: '{"cniVersion":"1.0.0","name":"rail0","type":"plexus-macvlan","master":"nic0","mode":"bridge"}'
YAML
echo "{\"cniVersion\":\"1.0.0\",\"name\":\"rail0\",\"type\":\"plexus-macvlan\",\"master\":\"nic0\",\"mode\":\"bridge\"}" > "$work/direct.json"
echo "{\"cniVersion\":\"1.0.0\",\"name\":\"plexus\",\"type\":\"plexus\",\"nadDir\":\"$work/nads\",\"networks\":\"rail0@net1\",\"cniDir\":\"$work/meta-cache\",\"binDir\":\"$BIN\"}" > "$work/meta.json"
# Each timed ADD is a new pod's: the previous run's link and delegate cache go first, as DEL would
# remove them (a real ADD never finds a cache under a fresh container ID).
fresh_pod="sh -c 'ip -n $pod link del net1 2>/dev/null; rm -f $work/meta-cache/bench; true'"
hf meta-direct env CNI_COMMAND=ADD "$HF" -N --runs "$RUNS" --warmup "$WARMUP" --input "$work/direct.json" \
  --prepare "$unlink_pod" --export-json "$work/meta-direct.json" -n plexus-macvlan "$BIN/plexus-macvlan"
hf meta-nad env CNI_COMMAND=ADD "$HF" -N --runs "$RUNS" --warmup "$WARMUP" --input "$work/meta.json" \
  --prepare "$fresh_pod" --export-json "$work/meta-nad.json" -n plexus "$BIN/plexus"
echo "{\"meta\": $(rss "$work/meta.json" "$BIN/plexus")}" > "$work/meta-rss.json"
# With the Kubernetes API: the tests' fake API server over HTTPS (CA + bearer token), in the node
# namespace; plexus reads the pod's annotation and the NAD, and PATCHes network-status.
echo '{"cniVersion":"1.0.0","name":"rail0","type":"plexus-macvlan","master":"nic0","mode":"bridge"}' > "$work/nad-rail0.json"
coproc FAKE { "$BIN/examples/plexus-fake-api" "/run/netns/$node" "$work/kubeconfig" \
  --pod "default/bench/uid-bench/rail0@net1" --nad "default/rail0=$work/nad-rail0.json"; }
read -r _ready <&"${FAKE[0]}"
echo "{\"cniVersion\":\"1.0.0\",\"name\":\"plexus\",\"type\":\"plexus\",\"kubeconfig\":\"$work/kubeconfig\",\"cniDir\":\"$work/meta-cache\",\"binDir\":\"$BIN\"}" > "$work/meta-api.json"
hf meta-api env CNI_COMMAND=ADD CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=bench;K8S_POD_UID=uid-bench" \
  "$HF" -N --runs "$RUNS" --warmup "$WARMUP" --input "$work/meta-api.json" \
  --prepare "$fresh_pod" --export-json "$work/meta-api.json.out" -n plexus "$BIN/plexus"
mv "$work/meta-api.json.out" "$work/meta-api-result.json"
# Daemon mode (issue #16): the same two ADDs, the shim sending each to plexus-daemon over its
# socket; the daemon reads the pod and NAD from its watch caches of the same fake API server,
# journals network-status and PATCHes it after the answer, over a connection it keeps.
daemon_up() {
  ip netns exec "$node" "$BIN/plexus-daemon" --socket "$work/run/daemon.sock" --status-journal "$work/run/network-status" \
    --metrics-address 127.0.0.1:9134 \
    --log-level error "$@" 2>> "$work/daemon.log" &
  daemon_pid=$!
  for _ in $(seq 200); do
    ip netns exec "$node" curl -sf http://127.0.0.1:9134/readyz > /dev/null 2>&1 && [ -S "$work/run/daemon.sock" ] && return 0
    sleep 0.05
  done
  echo "plexus-daemon did not become ready" >&2; cat "$work/daemon.log" >&2; exit 1
}
daemon_down() { kill "$daemon_pid"; wait "$daemon_pid" 2>/dev/null || true; }
with_socket() { sed "s|}\$|,\"daemonSocket\":\"$work/run/daemon.sock\"}|" "$1" > "$2"; }
with_socket "$work/meta.json" "$work/meta-daemon.json"
with_socket "$work/meta-api.json" "$work/meta-api-daemon.json"
daemon_up
hf meta-daemon env CNI_COMMAND=ADD "$HF" -N --runs "$RUNS" --warmup "$WARMUP" --input "$work/meta-daemon.json" \
  --prepare "$fresh_pod" --export-json "$work/meta-daemon-result.json" -n plexus "$BIN/plexus"
daemon_down
daemon_up --kubeconfig "$work/kubeconfig" --node-name bench-node
hf meta-api-daemon env CNI_COMMAND=ADD CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=bench;K8S_POD_UID=uid-bench" \
  "$HF" -N --runs "$RUNS" --warmup "$WARMUP" --input "$work/meta-api-daemon.json" \
  --prepare "$fresh_pod" --export-json "$work/meta-api-daemon-result.json" -n plexus "$BIN/plexus"
echo "{\"daemon\": $(awk '/VmHWM/ {print $2}' /proc/$daemon_pid/status)}" > "$work/meta-daemon-rss.json"
# The direct ADD and the one through the daemon once more, timed in alternation run after run, so
# that a drift of the machine's speed falls on both alike (scripts/bench/interleaved.py).
printf 'CNI_COMMAND=ADD\nCNI_CONTAINERID=bench\nCNI_NETNS=/run/netns/%s\nCNI_IFNAME=net1\nCNI_PATH=%s:%s\n' \
  "$pod" "$BIN" "$REF" > "$work/direct.env"
{ cat "$work/direct.env"; echo "CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=bench;K8S_POD_UID=uid-bench"; } \
  > "$work/api.env"
ip netns exec "$node" python3 scripts/bench/interleaved.py "$work/meta-interleaved.json" "$RUNS" "$fresh_pod" \
  "plexus-macvlan=$work/direct.env:$work/direct.json:$BIN/plexus-macvlan" \
  "plexus-daemon=$work/api.env:$work/meta-api-daemon.json:$BIN/plexus" > /dev/null
daemon_down
# Side by side with Multus thick (multus-shim -> multus-daemon v4.2.3, built by scripts/peers.sh), on
# the same fake API server: one pod with a cluster network (the reference loopback plugin, as a
# conf file both read) and rail0 (plexus-macvlan) from its annotation, through each daemon. Multus's
# daemon reads the pod from its informer, the NAD from the API, execs both delegates, and writes
# network-status (GET + PUT of the pod) before it answers; plexus's runs plexus-macvlan in-process
# and journals network-status, PATCHed after the answer. Both the same runs, fresh pod each.
echo '{"cniVersion": "0.3.1", "name": "lo", "type": "loopback"}' > "$work/lo.conf"
sed "s|}\$|,\"clusterNetwork\":\"$work/lo.conf\"}|" "$work/meta-api-daemon.json" > "$work/meta-thick-plexus.json"
PEERS_BIN=$(bash scripts/peers.sh)
mkdir -p "$work/multus/sa" "$work/multus/run" "$work/multus/net.d" "$work/multus/bin" "$work/multus/cache"
ln -sf "$BIN/plexus-macvlan" "$REF/loopback" "$work/multus/bin/"
cp "$work/lo.conf" "$work/multus/net.d/00-lo.conf"
server=$(awk '/server:/ {print $2}' "$work/kubeconfig"); hostport=${server#https://}
awk '/token:/ {printf "%s", $2}' "$work/kubeconfig" > "$work/multus/sa/token"
awk '/certificate-authority-data:/ {print $2}' "$work/kubeconfig" | base64 -d > "$work/multus/sa/ca.crt"
cat > "$work/multus/daemon.json" << JSON
{"chrootDir": "/", "cniVersion": "0.3.1", "logLevel": "error", "logToStderr": true, "binDir": "$work/multus/bin",
 "cniDir": "$work/multus/cache", "cniConfigDir": "$work/multus/net.d", "multusAutoconfigDir": "$work/multus/net.d",
 "multusConfigFile": "auto", "socketDir": "$work/multus/run", "clusterNetwork": "$work/lo.conf"}
JSON
echo "{\"cniVersion\":\"0.3.1\",\"name\":\"multus-cni-network\",\"type\":\"multus-shim\",\"daemonSocketDir\":\"$work/multus/run\"}" > "$work/multus/shim.json"
# In-cluster configuration, as in its DaemonSet: the token and CA where client-go looks for them (a
# tmpfs in a mount namespace of its own), the API server's address.
ip netns exec "$node" unshare -m --propagation private sh -c "
  mkdir -p /run/secrets && mount -t tmpfs tmpfs /run/secrets && mkdir -p /run/secrets/kubernetes.io/serviceaccount &&
  cp '$work/multus/sa/token' '$work/multus/sa/ca.crt' /run/secrets/kubernetes.io/serviceaccount/ &&
  exec env KUBERNETES_SERVICE_HOST=${hostport%:*} KUBERNETES_SERVICE_PORT=${hostport##*:} MULTUS_NODE_NAME=bench-node \
    '$PEERS_BIN/multus-daemon' -config '$work/multus/daemon.json'" 2> "$work/multus/daemon.log" &
multus_pid=$!
for _ in $(seq 200); do [ -S "$work/multus/run/multus.sock" ] && break; sleep 0.05; done
[ -S "$work/multus/run/multus.sock" ] || { echo "multus-daemon did not serve" >&2; cat "$work/multus/daemon.log" >&2; exit 1; }
fresh_thick="sh -c 'ip -n $pod link del net1 2>/dev/null; rm -rf $work/meta-cache/bench $work/multus/cache/*; true'"
hf meta-thick-multus env CNI_COMMAND=ADD CNI_IFNAME=eth0 CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=bench;K8S_POD_UID=uid-bench" \
  "$HF" -N --runs "$RUNS" --warmup "$WARMUP" --input "$work/multus/shim.json" \
  --prepare "$fresh_thick" --export-json "$work/meta-thick-multus.json" -n multus-thick "$PEERS_BIN/multus-shim"
kill "$multus_pid" 2>/dev/null; wait "$multus_pid" 2>/dev/null || true
daemon_up --kubeconfig "$work/kubeconfig" --node-name bench-node
hf meta-thick-plexus env CNI_COMMAND=ADD CNI_IFNAME=eth0 CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=bench;K8S_POD_UID=uid-bench" \
  "$HF" -N --runs "$RUNS" --warmup "$WARMUP" --input "$work/meta-thick-plexus.json" \
  --prepare "$fresh_thick" --export-json "$work/meta-thick-plexus-result.json" -n plexus-daemon "$BIN/plexus"
daemon_down
hf meta-loopback env CNI_COMMAND=ADD CNI_IFNAME=eth0 "$HF" -N --runs "$RUNS" --warmup "$WARMUP" --input "$work/lo.conf" \
  --export-json "$work/meta-loopback.json" -n loopback "$REF/loopback"
eval "exec ${FAKE[1]}>&-"
wait "$FAKE_PID" 2>/dev/null || true
ip -n "$pod" link del net1 2>/dev/null || true
fi

if want rails; then
echo "== an 8-network pod's CNI ADD through plexus: attachments in parallel vs \"parallel\": false"
# Eight macvlan rails (plexus-macvlan + plexus-ipam, one port each) and eight host-device rails
# (plexus-host-device + plexus-ipam, one device each moved into the pod). One timed command = the
# pod's ADD alone; before each, the previous ADD is undone by plexus's own DEL (outside the timing).
mkdir -p "$work/rails-nads"
for i in 0 1 2 3 4 5 6 7; do
  ip -n "$node" link add "rail$i" mtu 9000 type veth peer name "rail${i}p"
  ip -n "$node" link add "hd$i" mtu 9000 type veth peer name "hd${i}p"
  for l in "rail$i" "rail${i}p" "hd$i" "hd${i}p"; do ip -n "$node" link set "$l" up; done
  for kind in macvlan hostdev; do
    case $kind in
      macvlan) conf="{\"cniVersion\":\"1.0.0\",\"name\":\"m$i\",\"type\":\"plexus-macvlan\",\"master\":\"rail$i\",\"mode\":\"bridge\",\"ipam\":{\"type\":\"plexus-ipam\",\"range\":\"198.18.$((100 + i)).0/24\",\"dataDir\":\"$work/rails-ipam\"}}" ;;
      hostdev) conf="{\"cniVersion\":\"1.0.0\",\"name\":\"h$i\",\"type\":\"plexus-host-device\",\"device\":\"hd$i\",\"dataDir\":\"$work/rails-hd\",\"ipam\":{\"type\":\"plexus-ipam\",\"range\":\"198.18.$((110 + i)).0/24\",\"dataDir\":\"$work/rails-ipam\"}}" ;;
    esac
    printf 'apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata: {name: %s, namespace: default}\nspec:\n  config: '"'"'%s'"'"'\n' \
      "$kind$i" "$conf" > "$work/rails-nads/$kind$i.yaml"
  done
done
for kind in macvlan hostdev; do
  nets=$(printf "$kind%s," 0 1 2 3 4 5 6 7); nets=${nets%,}
  for mode in true false; do
    echo "{\"cniVersion\":\"1.0.0\",\"name\":\"plexus\",\"type\":\"plexus\",\"nadDir\":\"$work/rails-nads\",\"networks\":\"$nets\",\"cniDir\":\"$work/rails-cache\",\"binDir\":\"$BIN\",\"parallel\":$mode}" \
      > "$work/rails-$kind-$mode.json"
  done
  # A failed ADD leaves nothing, so a DEL of either config clears the pod before each run.
  add() { echo "CNI_COMMAND=ADD $BIN/plexus < $work/rails-$kind-$1.json > /dev/null"; }
  del() { echo "CNI_COMMAND=DEL $BIN/plexus < $work/rails-$kind-$1.json > /dev/null"; }
  hf_rounds "rails-$kind" "$(( ${RAILS_RUNS:-100} / ROUNDS ))" "$HF" --warmup 3 -- \
    --prepare "$(del true)" -n parallel "$(add true)" --prepare "$(del false)" -n one-after-another "$(add false)"
  ip netns exec "$node" env CNI_COMMAND=DEL CNI_CONTAINERID=bench CNI_NETNS=/run/netns/$pod CNI_IFNAME=net1 \
    CNI_PATH=$BIN:$REF "$BIN/plexus" < "$work/rails-$kind-true.json" > /dev/null
done
[ "$(ip -n "$pod" -o link show | wc -l)" = 1 ] || { echo "rails: links left in the pod" >&2; ip -n "$pod" link; exit 1; }
fi

if want cluster; then
echo "== a real node: plexus vs Multus + macvlan + whereabouts (scripts/bench/cluster.sh)"
bash scripts/bench/cluster.sh "$work"
fi

if want daemon; then
echo "== plexus-daemon against Multus thick's multus-daemon, 5,000 NADs and 10,000 pods (scripts/bench/daemon-rss.sh)"
bash scripts/bench/daemon-rss.sh "$work"
echo "== plexus-daemon under what tenants may write: 200 NADs of 1.4 MiB, 10,000 requests of distinct unknown types"
NADS=200 PODS=0 NAD_KIB=1434 FLOOD=10000 NAME=daemon-hostile bash scripts/bench/daemon-rss.sh "$work"
echo "== a burst of pods through plexus-daemon in a memory cgroup with the DaemonSet's limit (scripts/bench/daemon-burst.sh)"
bash scripts/bench/daemon-burst.sh "$work" "$BIN"
fi

if want ab && [ -n "${AB_OLD:-}" ]; then
echo "== this build against $AB_OLD on the single-ADD paths, alternated (scripts/bench/ab.sh)"
# AB_OLD: a commit (its shipped build is made in a worktree of its own), or a directory holding
# an earlier shipped build.
old_bin=$AB_OLD
if [ ! -d "$old_bin" ]; then
  git worktree add -f "$work/ab-old" "$AB_OLD" > /dev/null
  old_bin=$(cd "$work/ab-old" && bash scripts/build-release.sh)
fi
bash scripts/bench/ab.sh "$old_bin" "$BIN" "$work" "$RUNS"
echo "{\"old\": \"$(git -C "${old_bin%/target/*}" rev-parse --short HEAD 2> /dev/null || echo "$AB_OLD")\", \"new\": \"$(git rev-parse --short HEAD)\"}" > "$work/ab.json"
[ -d "$work/ab-old" ] && git worktree remove -f "$work/ab-old"
fi

if want soak; then
echo "== soak: 10,000 ADD/DEL cycles through plexus with two delegates, 16 clients (scripts/soak.sh)"
bash scripts/soak.sh > "$work/soak.json"
fi

if want fuzz; then
echo "== fuzz: every target to ${FUZZ_RUNS:=10000000} executions (scripts/fuzz.sh)"
PLEXUS_FUZZ_RUNS=$FUZZ_RUNS PLEXUS_FUZZ_JOBS=${PLEXUS_FUZZ_JOBS:-$(nproc)} bash scripts/fuzz.sh 0 > "$work/fuzz.txt"
fi

echo "== writing BENCHMARKS.md"
# Written aside first: a report that cannot be made (a section missing from a reused BENCH_WORK)
# leaves the previous BENCHMARKS.md as it was.
python3 scripts/bench/report.py "$work" "$RUNS" > "$work/BENCHMARKS.new.md"
# Sections this run did not measure (SECTIONS) keep their previous text, marked with its date.
python3 scripts/bench/merge_report.py "$work/BENCHMARKS.new.md" BENCHMARKS.md > "$work/BENCHMARKS.md"
mv "$work/BENCHMARKS.md" BENCHMARKS.md
cat BENCHMARKS.md
