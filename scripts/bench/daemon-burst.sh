#!/usr/bin/env bash
# A burst through plexus-daemon in a memory cgroup with the DaemonSet's limit (issue #16): PODS
# pods at once, each with RAILS networks (plexus-macvlan + plexus-ipam, file store; NADs from
# nadDir), sent by as many `plexus` shims to one daemon run with the daemon-mode DaemonSet's
# --max-concurrent and --max-queued. The daemon and every delegate it starts are in the cgroup, as
# in the DaemonSet's container; the shims are not (the kubelet's runtime starts them). Reports the
# cgroup's peak charge (RSS and page cache, what the limit counts) over the ADD burst and over the
# DEL burst, the daemon's own peak RSS, and whether the limit was hit. Figures only: it fails only
# when a request fails or something is left behind.
#
#   bash scripts/bench/daemon-burst.sh OUT_DIR BIN_DIR
set -euo pipefail
out=${1:?usage: daemon-burst.sh OUT_DIR BIN_DIR}
BIN=${2:?usage: daemon-burst.sh OUT_DIR BIN_DIR}
PODS=${PODS:-32}
RAILS=${RAILS:-8}
# The daemon-mode DaemonSet's figures (conf-examples/deploy/daemon/plexus.yaml, rendered from the
# chart): the container's memory limit and the daemon's flags.
manifest="$(dirname "$0")/../../conf-examples/deploy/daemon/plexus.yaml"
limit_mib=$(sed -n 's/.*limits: {memory: \([0-9]*\)Mi}.*/\1/p' "$manifest")
flag() { grep -o -- "--$1=[0-9]*" "$manifest" | tail -1 | cut -d= -f2; }
max_concurrent=$(flag max-concurrent)
max_queued=$(flag max-queued)
[ -n "$limit_mib" ] && [ -n "$max_concurrent" ] && [ -n "$max_queued" ] || {
  echo "daemon-burst.sh: limits or flags not found in $manifest" >&2; exit 1; }

work=$(mktemp -d)
node=plxburst-n$$
cg=""
daemon_pid=""
cleanup() {
  [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  for i in $(seq "$PODS"); do ip netns del "plxburst-p$$-$i" 2>/dev/null || true; done
  ip netns del "$node" 2>/dev/null || true
  [ -n "$cg" ] && rmdir "$cg" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

# The memory cgroup: v2 when it is mounted with the memory controller, else v1's.
if [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers; then
  cg=/sys/fs/cgroup/plexus-burst-$$; mkdir "$cg"
  echo $((limit_mib * 1024 * 1024)) > "$cg/memory.max"
  peak() { cat "$cg/memory.peak"; }
  reset_peak() { echo reset > "$cg/memory.peak" 2>/dev/null || true; }
  hits() { awk '/^(max|oom) / {s += $2} END {print s + 0}' "$cg/memory.events"; }
elif [ -d /sys/fs/cgroup/memory ]; then
  cg=/sys/fs/cgroup/memory/plexus-burst-$$; mkdir "$cg"
  echo $((limit_mib * 1024 * 1024)) > "$cg/memory.limit_in_bytes"
  peak() { cat "$cg/memory.max_usage_in_bytes"; }
  reset_peak() { echo 0 > "$cg/memory.max_usage_in_bytes"; }
  hits() { cat "$cg/memory.failcnt"; }
else
  echo "daemon-burst.sh: no memory cgroup here" >&2; exit 1
fi
usage() { if [ -f "$cg/memory.current" ]; then cat "$cg/memory.current"; else cat "$cg/memory.usage_in_bytes"; fi; }
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }

printf '{"dataRoots": ["%s"]}\n' "$work" > "$work/policy.json"
chmod 600 "$work/policy.json"
export PLEXUS_POLICY="$work/policy.json"
ip netns add "$node"
ip -n "$node" link set lo up
mkdir -p "$work/nads" "$work/run"
nets=""
for r in $(seq 0 $((RAILS - 1))); do
  ip -n "$node" link add "rail$r" mtu 9000 type veth peer name "rail${r}p"
  ip -n "$node" link set "rail$r" up; ip -n "$node" link set "rail${r}p" up
  conf="{\"cniVersion\":\"1.0.0\",\"name\":\"b$r\",\"type\":\"plexus-macvlan\",\"master\":\"rail$r\",\"mode\":\"bridge\",\"ipam\":{\"type\":\"plexus-ipam\",\"range\":\"198.18.$((120 + r)).0/24\",\"dataDir\":\"$work/ipam\"}}"
  printf 'apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata: {name: b%s, namespace: default}\nspec:\n  config: '"'"'%s'"'"'\n' \
    "$r" "$conf" > "$work/nads/b$r.yaml"
  nets="$nets${nets:+,}b$r"
done
echo "{\"cniVersion\":\"1.0.0\",\"name\":\"plexus\",\"type\":\"plexus\",\"nadDir\":\"$work/nads\",\"networks\":\"$nets\",\"cniDir\":\"$work/cache\",\"binDir\":\"$BIN\",\"daemonSocket\":\"$work/run/daemon.sock\"}" > "$work/meta.json"
for i in $(seq "$PODS"); do ip netns add "plxburst-p$$-$i"; done

# The daemon, in the cgroup before it execs (so is every delegate it starts). The page cache is
# dropped first, so the binaries' pages are charged to the cgroup as in a fresh container (a page
# stays charged to the cgroup that first read it).
sync; echo 1 > /proc/sys/vm/drop_caches
sh -c "echo \$\$ > $cg/cgroup.procs && exec ip netns exec $node $BIN/plexus-daemon --socket $work/run/daemon.sock \
  --metrics-address 127.0.0.1:9135 --max-concurrent $max_concurrent --max-queued $max_queued --log-level warn" \
  2> "$work/daemon.log" &
daemon_pid=$!
for _ in $(seq 200); do [ -S "$work/run/daemon.sock" ] && break; sleep 0.05; done
[ -S "$work/run/daemon.sock" ] || { echo "plexus-daemon did not start" >&2; cat "$work/daemon.log" >&2; exit 1; }
sleep 0.5
idle=$(usage)

# burst VERB: every pod's VERB at once, one shim each; the seconds it took.
burst() {
  local verb=$1 start end i failed=0 pids=()
  start=$(date +%s.%N)
  for i in $(seq "$PODS"); do
    ip netns exec "$node" env CNI_COMMAND="$verb" CNI_CONTAINERID="burst$i" CNI_NETNS="/run/netns/plxburst-p$$-$i" \
      CNI_IFNAME=eth0 CNI_PATH="$BIN" "$BIN/plexus" < "$work/meta.json" > "$work/$verb.$i.out" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || failed=$((failed + 1)); done
  end=$(date +%s.%N)
  [ "$failed" = 0 ] || { echo "daemon-burst.sh: $failed ${verb}s failed" >&2; cat "$work/$verb".*.out >&2; exit 1; }
  awk -v s="$start" -v e="$end" 'BEGIN {printf "%.2f", e - s}'
}
fell_back() { grep -l "running the" "$work"/"$1".*.out 2>/dev/null | wc -l; }

reset_peak
add_s=$(burst ADD)
add_peak=$(peak)
for i in $(seq "$PODS"); do
  n=$(ip -n "plxburst-p$$-$i" -o link show | grep -c 'net[0-9]' || true)
  [ "$n" = "$RAILS" ] || { echo "daemon-burst.sh: pod $i has $n of $RAILS interfaces" >&2; exit 1; }
done
after_add=$(usage)
reset_peak
del_s=$(burst DEL)
del_peak=$(peak)
for i in $(seq "$PODS"); do
  n=$(ip -n "plxburst-p$$-$i" -o link show | grep -c 'net[0-9]' || true)
  [ "$n" = 0 ] || { echo "daemon-burst.sh: pod $i keeps $n interfaces after DEL" >&2; exit 1; }
done
left=$(find "$work/cache" -type f 2>/dev/null | wc -l)
[ "$left" = 0 ] || { echo "daemon-burst.sh: $left cache files left after DEL" >&2; exit 1; }
hwm=$(awk '/VmHWM/ {print $2}' "/proc/$daemon_pid/status")

cat > "$out/daemon-burst.json" << JSON
{"pods": $PODS, "rails": $RAILS, "max_concurrent": $max_concurrent, "max_queued": $max_queued,
 "limit_mib": $limit_mib, "idle_mib": $(mib "$idle"), "add_peak_mib": $(mib "$add_peak"),
 "after_add_mib": $(mib "$after_add"), "del_peak_mib": $(mib "$del_peak"),
 "daemon_hwm_mib": $(mib $((hwm * 1024))), "limit_hits": $(hits),
 "add_seconds": $add_s, "del_seconds": $del_s,
 "ran_by_shim": {"add": $(fell_back ADD), "del": $(fell_back DEL)}}
JSON
cat "$out/daemon-burst.json"
