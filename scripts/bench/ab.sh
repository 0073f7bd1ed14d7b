#!/usr/bin/env bash
# Two builds of plexus side by side on the single-ADD paths, each pair timed in alternation run
# after run (scripts/bench/interleaved.py), so that a drift of the machine falls on both alike: what
# a change costs, as a ratio in one run. In a node and a pod namespace of its own:
#   macvlan-l2       plexus-macvlan, L2 only
#   macvlan-static   plexus-macvlan with the reference static IPAM (a delegate process)
#   ipam             plexus-ipam, file store with one resident attachment
#   meta             plexus with a plexus-macvlan NAD from nadDir
#   daemon           the plexus shim and plexus-daemon (each build its own daemon, delegates in-process)
#   daemon-del8      the DEL of an 8-network pod through each build's daemon (attachments DEL'd in
#                    parallel); the pod is ADDed again before every run, untimed, in a pod
#                    namespace of each build's own
# Writes OUT/ab-<case>.json; figures only. What a meta config key costs: the same build on both
# sides, AB_NEW_META_KEYS the keys the new side's meta and daemon configs get besides (@SCRATCH@
# in them: a directory whose file "bench" is removed before every run).
#
#   bash scripts/bench/ab.sh OLD_BIN_DIR NEW_BIN_DIR OUT_DIR [RUNS]
#   AB_NEW_META_KEYS='"writeMultusCache": true, "multusCacheDir": "@SCRATCH@"' bash scripts/bench/ab.sh BIN BIN OUT
set -euo pipefail
cd "$(dirname "$0")/../.."
old=${1:?usage: ab.sh OLD_BIN_DIR NEW_BIN_DIR OUT_DIR [RUNS]} new=${2:?} out=${3:?} RUNS=${4:-300}
mkdir -p "$out"
REF=/usr/lib/cni
work=$(mktemp -d)
node=plxab-n$$ pod=plxab-p$$
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; wait "$p" 2> /dev/null || true; done
  ip netns del "$pod" 2> /dev/null || true; ip netns del "$node" 2> /dev/null || true
  ip netns del "$pod-old" 2> /dev/null || true; ip netns del "$pod-new" 2> /dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
# Both builds run from copies made now: how long ago a binary's file was written showed in its
# times (the same binaries against a fresh copy of themselves: the copy 4-14 % faster).
mkdir -p "$work/old-bin" "$work/new-bin"
for b in plexus plexus-macvlan plexus-ipam plexus-daemon; do
  cp "$old/$b" "$work/old-bin/"; cp "$new/$b" "$work/new-bin/"
done
old=$work/old-bin new=$work/new-bin
sync
ip netns add "$node"; ip netns add "$pod"
ip -n "$node" link set lo up; ip -n "$pod" link set lo up
ip -n "$node" link add nic0 mtu 9000 type veth peer name nic0p
ip -n "$node" link set nic0 up; ip -n "$node" link set nic0p up
printf '{"dataRoots": ["%s"]}\n' "$work" > "$work/policy.json"
chmod 600 "$work/policy.json"
export PLEXUS_POLICY="$work/policy.json"

# env_for BUILD: the CNI environment of one build's runs.
env_for() {
  printf 'CNI_COMMAND=ADD\nCNI_CONTAINERID=bench\nCNI_NETNS=/run/netns/%s\nCNI_IFNAME=net1\nCNI_PATH=%s:%s\nPLEXUS_POLICY=%s\n' \
    "$pod" "$1" "$REF" "$work/policy.json" > "$work/$2.env"
}
env_for "$old" old; env_for "$new" new
pair() { # CASE PREPARE OLD_CONFIG NEW_CONFIG [BINARY]
  local case=$1 prepare=$2 old_conf=$3 new_conf=$4 binary=$5
  ip netns exec "$node" python3 scripts/bench/interleaved.py "$out/ab-$case.json" "$RUNS" "$prepare" \
    "old=$work/old.env:$old_conf:$old/$binary" "new=$work/new.env:$new_conf:$new/$binary" >&2
}
unlink="ip -n $pod link del net1 2> /dev/null; true"

echo '{"cniVersion":"1.0.0","name":"bench","type":"plexus-macvlan","master":"nic0","mode":"bridge"}' > "$work/l2.json"
pair macvlan-l2 "$unlink" "$work/l2.json" "$work/l2.json" plexus-macvlan

cat > "$work/static.json" << JSON
{"cniVersion":"1.0.0","name":"bench","type":"plexus-macvlan","master":"nic0","mode":"bridge",
 "ipam":{"type":"static","addresses":[{"address":"198.18.0.10/24","gateway":"198.18.0.1"}],"routes":[{"dst":"198.19.0.0/16"}]}}
JSON
pair macvlan-static "$unlink" "$work/static.json" "$work/static.json" plexus-macvlan

for b in old new; do
  echo "{\"cniVersion\":\"1.0.0\",\"name\":\"bench\",\"ipam\":{\"type\":\"plexus-ipam\",\"range\":\"198.18.0.0/24\",\"dataDir\":\"$work/ipam-$b\",\"nodeName\":\"bench\"}}" \
    > "$work/ipam-$b.json"
  bin=$old; [ $b = new ] && bin=$new
  # A resident attachment: the store holds other pods' addresses, as on a node.
  ip netns exec "$node" env CNI_COMMAND=ADD CNI_CONTAINERID=resident CNI_NETNS="/run/netns/$pod" CNI_IFNAME=net1 \
    CNI_PATH="$bin" "$bin/plexus-ipam" < "$work/ipam-$b.json" > /dev/null
done
del_ipam="for b in old new; do d=\$( [ \$b = old ] && echo $old || echo $new ); CNI_COMMAND=DEL CNI_CONTAINERID=bench CNI_NETNS=/run/netns/$pod CNI_IFNAME=net1 CNI_PATH=\$d \$d/plexus-ipam < $work/ipam-\$b.json; done"
pair ipam "$del_ipam" "$work/ipam-old.json" "$work/ipam-new.json" plexus-ipam

mkdir -p "$work/nads"
cat > "$work/nads/rail0.yaml" << YAML
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: rail0, namespace: default}
spec:
  config: '{"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic0", "mode": "bridge"}'
YAML
for b in old new; do
  bin=$old extra=""
  if [ $b = new ]; then bin=$new; extra=${AB_NEW_META_KEYS:+,${AB_NEW_META_KEYS//@SCRATCH@/$work/scratch}}; fi
  echo "{\"cniVersion\":\"1.0.0\",\"name\":\"plexus\",\"type\":\"plexus\",\"nadDir\":\"$work/nads\",\"networks\":\"rail0\",\"cniDir\":\"$work/cache-$b\",\"binDir\":\"$bin\"$extra}" \
    > "$work/meta-$b.json"
done
unlink_meta="ip -n $pod link del net1 2> /dev/null; rm -f $work/cache-old/bench $work/cache-new/bench $work/scratch/bench; true"
pair meta "$unlink_meta" "$work/meta-old.json" "$work/meta-new.json" plexus

port=9140
for b in old new; do
  bin=$old; [ $b = new ] && bin=$new
  ip netns exec "$node" env PLEXUS_POLICY="$work/policy.json" "$bin/plexus-daemon" --socket "$work/run-$b/daemon.sock" \
    --status-journal "$work/run-$b/network-status" --metrics-address "127.0.0.1:$port" --log-level error \
    2>> "$work/daemon-$b.log" &
  pids+=($!)
  for _ in $(seq 200); do [ -S "$work/run-$b/daemon.sock" ] && break; sleep 0.05; done
  [ -S "$work/run-$b/daemon.sock" ] || { echo "ab.sh: the $b daemon did not start" >&2; cat "$work/daemon-$b.log" >&2; exit 1; }
  sed "s|}\$|,\"daemonSocket\":\"$work/run-$b/daemon.sock\"}|" "$work/meta-$b.json" > "$work/meta-daemon-$b.json"
  port=$((port + 1))
done
pair daemon "$unlink_meta" "$work/meta-daemon-old.json" "$work/meta-daemon-new.json" plexus

# daemon-del8: rail0..rail7 from nadDir, one pod namespace per build; before each run, whichever
# build's pod was deleted is added again (untimed), so every timed DEL finds 8 attachments.
for i in $(seq 1 7); do
  sed "s/rail0/rail$i/" "$work/nads/rail0.yaml" > "$work/nads/rail$i.yaml"
done
for b in old new; do
  bin=$old; [ $b = new ] && bin=$new
  ip netns add "$pod-$b"; ip -n "$pod-$b" link set lo up
  sed 's|"networks":"rail0"|"networks":"rail0,rail1,rail2,rail3,rail4,rail5,rail6,rail7"|' "$work/meta-daemon-$b.json" \
    > "$work/meta8-$b.json"
  for verb in ADD DEL; do
    printf 'CNI_COMMAND=%s\nCNI_CONTAINERID=bench8\nCNI_NETNS=/run/netns/%s\nCNI_IFNAME=eth0\nCNI_PATH=%s:%s\nPLEXUS_POLICY=%s\n' \
      "$verb" "$pod-$b" "$bin" "$REF" "$work/policy.json" > "$work/$verb-8-$b.env"
  done
done
readd8="for b in old new; do [ -e $work/cache-\$b/bench8 ] && continue; d=\$( [ \$b = old ] && echo $old || echo $new ); \
  env \$(cat $work/ADD-8-\$b.env) \$d/plexus < $work/meta8-\$b.json > /dev/null && ip -n $pod-\$b link show net8 > /dev/null || exit 1; done"
ip netns exec "$node" python3 scripts/bench/interleaved.py "$out/ab-daemon-del8.json" "$RUNS" "$readd8" \
  "old=$work/DEL-8-old.env:$work/meta8-old.json:$old/plexus" "new=$work/DEL-8-new.env:$work/meta8-new.json:$new/plexus" >&2
