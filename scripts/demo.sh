#!/usr/bin/env bash
# The main job, on a fresh machine (as root): build plexus, then give a pod-like network namespace
# a RoCE-style secondary interface through the `plexus` meta-plugin — a macvlan on a veth that
# stands in for a ConnectX port (MTU 9000), its address from plexus-ipam's file store, the
# NetworkAttachmentDefinition read from a file. Prints the result and the interface as `ip` shows
# it, then DELs and removes everything it made.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "demo.sh: run as root (it creates network namespaces)" >&2; exit 1; }
source scripts/lib/packages.sh
need_packages iproute2   # build-release.sh installs what the build needs (protoc)

# PLEXUS_DEMO_BIN: binaries built already (scripts/arm64-check.sh runs the demo on the arm64 build).
if [ -n "${PLEXUS_DEMO_BIN:-}" ]; then
  BIN=$PLEXUS_DEMO_BIN
else
  # The shipped code with the release profile's semantics, unoptimised (release-unoptimized,
  # Cargo.toml): the demo shows what plexus does, and its build takes a minute or so where the
  # shipped profile's fat-LTO links take over four (PLEXUS_PROFILE=release builds that).
  profile=${PLEXUS_PROFILE:-release-unoptimized}
  echo "== building plexus, plexus-macvlan and plexus-ipam (scripts/build-release.sh, profile $profile: what the demo runs)"
  BIN=$(PLEXUS_PROFILE=$profile bash scripts/build-release.sh -p plexus -p plexus-macvlan -p plexus-ipam)
fi

work=$(mktemp -d)
node=plexus-demo-node-$$ pod=plexus-demo-pod-$$
cleanup() { ip netns del "$pod" 2>/dev/null || true; ip netns del "$node" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

echo "== a node namespace with a 'RoCE port' (veth, MTU 9000) and a pod namespace"
ip netns add "$node"; ip netns add "$pod"
ip -n "$node" link add ens1f0 mtu 9000 type veth peer name ens1f0-peer
ip -n "$node" link set ens1f0 up; ip -n "$node" link set ens1f0-peer up

mkdir -p "$work/nads"
cat > "$work/nads/rail0.yaml" <<YAML
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata:
  name: rail0
  namespace: default
spec:
  config: |
    {"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "ens1f0", "mode": "bridge",
     "ipam": {"type": "plexus-ipam", "range": "198.18.100.0/24", "gateway": "198.18.100.1",
              "dataDir": "$work/ipam"}}
YAML
# The node policy (root-owned, 0600): the IPAM store lives in this demo's temp dir, so that dir is
# a data root. Without a policy file only plexus's default data directories are allowed.
cat > "$work/policy.json" <<JSON
{"dataRoots": ["$work"], "maxAttachments": 8}
JSON
chmod 600 "$work/policy.json"
export PLEXUS_POLICY="$work/policy.json"
cat > "$work/plexus.conf" <<JSON
{"cniVersion": "1.0.0", "name": "plexus", "type": "plexus",
 "nadDir": "$work/nads", "networks": "rail0", "cniDir": "$work/cache", "binDir": "$BIN"}
JSON
cni() {
  ip netns exec "$node" env CNI_COMMAND="$1" CNI_CONTAINERID=demo CNI_NETNS="/run/netns/$pod" \
    CNI_IFNAME=eth0 CNI_PATH="$BIN" "$BIN/plexus" < "$work/plexus.conf"
}
echo "== ADD through plexus (NAD rail0 from a file: plexus-macvlan + plexus-ipam)"
cni ADD
echo "== the pod's secondary interface"
ip -n "$pod" -d addr show net1
echo "== DEL"
cni DEL
echo "interfaces left in the pod: $(ip -n "$pod" -o link show | awk -F': ' '{print $2}' | tr '\n' ' ')"
# (the store removes a range's directory with its last reservation)
echo "addresses held in the IPAM store: $(find "$work/ipam" -path '*/ips/*' -type f 2> /dev/null | wc -l)"
