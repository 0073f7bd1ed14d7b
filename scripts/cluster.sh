#!/usr/bin/env bash
# A real Kubernetes for plexus's tests, one node or several: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, containerd (CRI) and kubelet, built from their Go modules
# (scripts/peers.sh), all inside network namespaces of their own with veth "RoCE ports". Nothing touches the host's
# interfaces; images are built locally (no registry).
#
#   bash scripts/cluster.sh up     # prints KEY=value lines once the node is Ready
#   bash scripts/cluster.sh up --nodes N
#                                  # N nodes (1-9), each its own network and mount namespace,
#                                  # containerd and kubelet, joined to node 1's control plane; the
#                                  # fabric namespace bridges their k8s0 (mgmt) and each rail's
#                                  # ports (rail1..rail8, MTU 9000). Node K prints NODE_NETNS_K,
#                                  # NODE_NAME_K, NODE_STATE_K (its files; bound over the state
#                                  # dir's paths inside its mount namespace, so one set of paths
#                                  # — the chart's — serves every node)
#   bash scripts/cluster.sh up --hollow N [--nodes K] [--hollow-stack plexus|multus|nodeslice]
#                                  # N hollow nodes (scripts/lib/hollow.sh; docs/hollow-nodes.md):
#                                  # Node objects kept by kwok, each its own network namespace
#                                  # with eight ports and a fake sysfs, the real plexus-daemon (or,
#                                  # with --hollow-stack multus, Multus thick's multus-daemon with
#                                  # the reference plugins and whereabouts; nodeslice: the same,
#                                  # whereabouts in its node-slice mode), and one kubelet
#                                  # stand-in for all of them making the CNI calls; on the control
#                                  # plane alone, or beside K real nodes
#   bash scripts/cluster.sh hollow-restart K
#                                  # hollow node K's daemon (plexus-daemon or multus-daemon)
#                                  # restarted; prints the ms from its start to ready
#   bash scripts/cluster.sh down   # removes every process, namespace, mount and file `up` made
#   PLEXUS_CLUSTER_SYSFS=DIR bash scripts/cluster.sh up
#                                  # the CNI plugins read sysfs from DIR (PLEXUS_SYSFS_ROOT)
#   PLEXUS_CLUSTER_NRI=1 bash scripts/cluster.sh up
#                                  # containerd with NRI on, its socket $state/nri/nri.sock
#                                  # (for dranet: scripts/bench/dra.sh)
#   bash scripts/cluster.sh stop|start|restart|kill DAEMON [--node K]
#                                  # one daemon (etcd, kube-apiserver, kube-controller-manager,
#                                  # kube-scheduler, containerd, kubelet; node K's containerd or
#                                  # kubelet with --node K) stopped (SIGTERM, waited for), killed
#                                  # (SIGKILL: a node lost) or started again with the same flags;
#                                  # `start` waits until it answers. Pods and their shims keep
#                                  # running meanwhile. The kubelet takes extra flags from
#                                  # kubelet-flags in its node's files, one per line, when it starts.
#
# Pitfalls met, and what this script does about them:
# - kube-apiserver refuses a loopback advertise address, and this kernel has no dummy links: the
#   node namespace gets a veth (k8s0, 198.18.250.1/24) whose peer sits in a fabric namespace.
# - No systemd, cgroup v1 hierarchies (v2 only as /sys/fs/cgroup/unified): the kubelet uses the
#   cgroupfs driver and failCgroupV1: false; cgroupsPerQOS and node-allocatable enforcement off.
# - The root mount is private here: containerd and the kubelet share one mount namespace of their
#   own with shared propagation (kept at $state/mnt), so the host's mounts are not changed; it must
#   be one namespace for both, or containerd never sees the kubelet's volume mounts (service
#   account tokens arrive empty). /dev/kmsg must exist for the kubelet's OOM watcher (it does).
# - Sandbox image: a busybox-static rootfs whose PID 1 waits for signals and reaps children,
#   imported into containerd; the kubelet's image GC never removes it (threshold 100 %).
# - containerd calls CNI STATUS for configs of cniVersion >= 1.1.0; the bootstrap cluster network
#   is a 1.0.0 bridge conflist, replaced when plexus is installed.
# - Service and pod addresses come from 198.18.0.0/15 (never a private range).
# - The kubelet gives every sandbox oom_score_adj -998, which this sandbox may not set (runc:
#   "can't get final child's PID from pipe"): containerd's restrict_oom_score_adj clamps it.
# - kubectl logs/exec reach the kubelet by the node's InternalIP (no DNS for the node name).
# - Not everything of the kubelet follows --root-dir: its serving certificate (--cert-dir) and
#   the device manager's socket and checkpoint (/var/lib/kubelet/device-plugins, bound to the
#   state dir in the node's mount namespace) would otherwise land on the host.
# - Containers run by this containerd use a runc root of their own, so `down` finds and ends
#   exactly them. Its shims are in sessions of their own: stopping containerd leaves pods running.
# - containerd logs at debug level: "begin cni setup" and "cni result" carry each sandbox's CNI
#   ADD time (scripts/bench-cluster.sh reads them). The apiserver's audit log records, at Metadata
#   level, only the requests of the CNI plugins' service accounts (plexus, multus, whereabouts),
#   to count API requests per pod.
# - Eight RoCE ports (ens1f0np0 .. ens8f0np0, MTU 9000): an 8-rail GPU node.
# - DRA: containerd reads CDI specs from the state dir's cdi/; the consumable-capacity feature
#   gate is on (FEATURE_GATES).
# - Several clusters may be up at once (PLEXUS_CLUSTER_SLOT): the kubelet keeps pod logs in the state
#   dir (its log GC removes the directories of pods it does not know, another kubelet's too) and
#   containerd runs without NRI (its default socket is one per machine); PLEXUS_CLUSTER_NRI=1
#   turns it on with its socket and plugin dirs in the state dir.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/packages.sh
source scripts/lib/roce-sysfs.sh
top=$(pwd)

# PLEXUS_CLUSTER_SLOT=N: one of several clusters up at once (the tests run three), each with a
# state dir and namespaces of its own; everything else is inside those namespaces.
slot=${PLEXUS_CLUSTER_SLOT:-}
state=${PLEXUS_CLUSTER_DIR:-/var/lib/plexus-cluster${slot:+-$slot}}
NODE_NETNS=plexus-k8s-node${slot:+-$slot}
FABRIC_NETNS=plexus-k8s-fabric${slot:+-$slot}
NODE_NAME=plexus-node
ADDR=198.18.250.1
# The apiserver's address (node 1's); ADDR, NODE_NETNS, NODE_NAME, POD_CIDR and nodedir describe
# the node being worked on (node_ctx), node 1 unless `up --nodes N` adds more.
API_ADDR=$ADDR
NODE1_NETNS=$NODE_NETNS
nodedir=$state
NODES=1
# Alpha features the tests use: DRA consumable capacity (plexus's shared RoCE ports, several
# claims on one device), on in every component that reads it.
FEATURE_GATES=DRAConsumableCapacity=true
SERVICE_CIDR=198.19.250.0/24
POD_CIDR=198.19.251.0/24

# node_ctx K: the globals above for node K. Node 1 is today's node (its files at the top of the
# state dir); node K > 1 has its own network and mount namespace and its files in
# $state/node-K, bound over the same paths of the state dir inside its mount namespace — so one
# set of paths (the chart's, the configs') serves every node.
node_ctx() {
  if [ "$1" = 1 ]; then
    NODE_NETNS=$NODE1_NETNS NODE_NAME=plexus-node ADDR=$API_ADDR POD_CIDR=198.19.251.0/24 nodedir=$state
  else
    NODE_NETNS=$NODE1_NETNS-n$1 NODE_NAME=plexus-node-$1 ADDR=198.18.250.$1 POD_CIDR=198.19.$((250 + $1)).0/24
    nodedir=$state/node-$1
  fi
}
# The state dir's entries a node has its own of (bound in node K's mount namespace).
NODE_DIRS="bin net.d containerd kubelet data devinfo run cdi dra-claims runc manifests pod-logs host-local nri"
TEST_IMAGE=localhost/plexus-busybox:test
PAUSE_IMAGE=localhost/plexus-pause:test
# Made when a cluster made the host's /var/lib/kubelet/device-plugins (shared by all of them).
made_kubelet_dir=/run/plexus-cluster-made-var-lib-kubelet
# Hollow nodes (`up --hollow N`): scripts/lib/hollow.sh.
source scripts/lib/hollow.sh

log() { echo "cluster.sh: $*" >&2; }
in_node() { ip netns exec "$NODE_NETNS" "$@"; }

# start NAME CMD...: a daemon in the node's network namespace and the node's mount namespace
# (one for all daemons: the kubelet's volume mounts must be seen by containerd), detached from
# our stdout/stderr, its PID recorded for `down`.
start() {
  local name=$1
  shift
  # nsenter, not `ip netns exec`: that remounts /sys, which hides the cgroup mounts the kubelet
  # needs (/sys/fs/cgroup/*). Node K > 1's daemons (and the CNI plugins containerd runs) have a
  # UTS namespace whose host name is the node's: plugins name their node after their host.
  local uts=()
  [ "$nodedir" = "$state" ] || uts=(unshare --uts -- sh -c 'echo "$0" > /proc/sys/kernel/hostname && exec "$@"' "$NODE_NAME")
  setsid nsenter --net="/run/netns/$NODE_NETNS" --mount="$nodedir/mnt" -- "${uts[@]}" "$@" \
    >> "$nodedir/log/$name.log" 2>&1 < /dev/null &
  echo $! > "$nodedir/pids/$name"
}

# wait_for NAME SECONDS CMD...: until CMD succeeds, asked five times a second; when it does not,
# the end of NAME's log (or of the file $wait_log names) is shown.
wait_for() {
  local what=$1 tries=$(($2 * 5))
  shift 2
  for _ in $(seq "$tries"); do
    "$@" > /dev/null 2>&1 && return 0
    sleep 0.2
  done
  log "$what did not come up; its log:"
  tail -20 "${wait_log:-$nodedir/log/$what.log}" >&2 || true
  return 1
}

# daemon NAME: start one of the node's daemons with its flags and wait until it answers.
daemon() {
  case $1 in
    etcd)
      start etcd "$PEERS_BIN/etcd" --data-dir "$state/etcd" --listen-client-urls http://127.0.0.1:2379 \
        --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 --log-level error
      wait_for etcd 60 in_node "$PEERS_BIN/etcdctl" --endpoints http://127.0.0.1:2379 endpoint health
      ;;
    kube-apiserver)
      start kube-apiserver "$PEERS_BIN/kube-apiserver" --etcd-servers http://127.0.0.1:2379 \
        --advertise-address "$API_ADDR" --secure-port 6443 --tls-cert-file "$state/pki/apiserver.crt" \
        --tls-private-key-file "$state/pki/apiserver.key" --client-ca-file "$state/pki/ca.crt" \
        --token-auth-file "$state/pki/tokens.csv" --service-account-issuer https://kubernetes.default.svc \
        --service-account-key-file "$state/pki/sa.pub" --service-account-signing-key-file "$state/pki/sa.key" \
        --service-cluster-ip-range "$SERVICE_CIDR" --authorization-mode Node,RBAC \
        --enable-admission-plugins NodeRestriction --allow-privileged=true \
        --kubelet-preferred-address-types InternalIP --kubelet-client-certificate "$state/pki/kubelet-client.crt" \
        --kubelet-client-key "$state/pki/kubelet-client.key" \
        --audit-policy-file "$state/audit-policy.yaml" --audit-log-path "$state/log/audit.log" \
        --audit-log-maxsize 4096 --audit-log-mode blocking --feature-gates "$FEATURE_GATES"
      wait_for kube-apiserver 120 in_node "$PEERS_BIN/kubectl" --kubeconfig "$state/admin.kubeconfig" get --raw /readyz
      ;;
    kube-controller-manager)
      start kube-controller-manager "$PEERS_BIN/kube-controller-manager" --kubeconfig "$state/admin.kubeconfig" \
        --authentication-kubeconfig "$state/admin.kubeconfig" --authorization-kubeconfig "$state/admin.kubeconfig" \
        --root-ca-file "$state/pki/ca.crt" --service-account-private-key-file "$state/pki/sa.key" \
        --use-service-account-credentials --leader-elect=false --controllers '*,-nodeipam' \
        --feature-gates "$FEATURE_GATES"
      ;;
    kube-scheduler)
      start kube-scheduler "$PEERS_BIN/kube-scheduler" --kubeconfig "$state/admin.kubeconfig" \
        --authentication-kubeconfig "$state/admin.kubeconfig" --authorization-kubeconfig "$state/admin.kubeconfig" \
        --leader-elect=false --feature-gates "$FEATURE_GATES"
      ;;
    containerd)
      local sysfs=()
      [ -s "$state/sysfs-root" ] && sysfs=(PLEXUS_SYSFS_ROOT="$(cat "$state/sysfs-root")")
      start containerd env PATH="$PEERS_BIN:$PATH" PLEXUS_POLICY="$state/policy.json" "${sysfs[@]}" \
        "$PEERS_BIN/containerd" --config "$nodedir/containerd.toml"
      wait_for containerd 60 in_node "$PEERS_BIN/ctr" -a "$nodedir/containerd.sock" version
      ;;
    kubelet)
      local extra=()
      # Extra kubelet flags a test asks for (e.g. a feature gate), one per line.
      [ -s "$nodedir/kubelet-flags" ] && mapfile -t extra < "$nodedir/kubelet-flags"
      start kubelet "$PEERS_BIN/kubelet" --config "$nodedir/kubelet.yaml" --kubeconfig "$nodedir/kubelet.kubeconfig" \
        --hostname-override "$NODE_NAME" --node-ip "$ADDR" --root-dir "$state/kubelet" \
        --cert-dir "$state/kubelet/pki" "${extra[@]}"
      wait_for kubelet 120 in_node busybox wget -q -O /dev/null http://127.0.0.1:10248/healthz
      ;;
    *)
      log "no daemon $1"
      return 2
      ;;
  esac
}

# halt NAME [SIGNAL]: SIGTERM (or SIGNAL) to a daemon's session, waited for (SIGKILL after 30 s).
halt() {
  local f=$nodedir/pids/$1 pid
  [ -f "$f" ] || { log "$1 is not running"; return 1; }
  pid=$(cat "$f")
  kill "-${2:-TERM}" -- "-$pid" 2> /dev/null || true
  for _ in $(seq 300); do
    kill -0 "$pid" 2> /dev/null || break
    sleep 0.1
  done
  kill -KILL -- "-$pid" 2> /dev/null || true
  rm -f "$f"
}

down() {
  local f pid alive root c ns
  hollow_down
  # The other nodes' daemons first (they are each node's kubelet and containerd), then node 1's.
  for f in "$state"/node-*/pids/kubelet "$state"/node-*/pids/containerd \
    "$state"/pids/{kubelet,containerd,kube-scheduler,kube-controller-manager,kube-apiserver,etcd}; do
    if [ -f "$f" ]; then
      pid=$(cat "$f")
      # The recorded PID is setsid's child chain's leader: end its whole session.
      kill -TERM -- "-$pid" 2> /dev/null || kill -TERM "$pid" 2> /dev/null || true
    fi
  done
  # A second for them to end, then whatever is left is killed.
  for _ in $(seq 10); do
    alive=0
    for f in "$state"/pids/* "$state"/node-*/pids/*; do
      [ -f "$f" ] && kill -0 -- "-$(cat "$f")" 2> /dev/null && alive=1
    done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for f in "$state"/pids/* "$state"/node-*/pids/*; do
    [ -f "$f" ] && { kill -KILL -- "-$(cat "$f")" 2> /dev/null || true; }
  done
  # Containers and shims started by this containerd live in their own sessions.
  # (containerd puts each of its namespaces under the runc root: $state/runc/k8s.io; node K's is
  # $state/node-K/runc/k8s.io.)
  for root in "$state"/runc/*/ "$state"/node-*/runc/*/; do
    [ -d "$root" ] || continue
    for c in $(runc --root "$root" list -q 2> /dev/null); do
      runc --root "$root" kill "$c" KILL 2> /dev/null || true
      runc --root "$root" delete --force "$c" 2> /dev/null || true
    done
  done
  pkill -KILL -f "containerd-shim-runc-v2 .*-address $state/" 2> /dev/null || true
  for ns in "$NODE1_NETNS" $(ip netns list | awk -v p="$NODE1_NETNS-n" 'index($1, p) == 1 {print $1}'); do
    ip netns del "$ns" 2> /dev/null || true
  done
  ip netns del "$FABRIC_NETNS" 2> /dev/null || true
  # The host's mount point for the device manager's directory goes with the last cluster (each
  # makes its namespaces before it needs the directory).
  if [ -f "$made_kubelet_dir" ] && ! ip netns list | grep -q '^plexus-k8s-node'; then
    rmdir /var/lib/kubelet/device-plugins /var/lib/kubelet 2> /dev/null || true
    rm -f "$made_kubelet_dir"
  fi
  if [ -d "$state" ]; then
    { grep -E " $state[/ ]" /proc/mounts || true; } | awk '{print $2}' | sort -r | while read -r m; do umount -l "$m" 2> /dev/null || true; done
    rm -rf "$state"
  fi
}

# The cluster's keys are ECDSA P-256 (Kubernetes takes them for its serving and client
# certificates and signs service-account tokens with ES256): four keys a cluster, each made in a
# millisecond where an RSA key took a tenth of a CPU second or more.
certs() {
  local d=$state/pki ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1)
  mkdir -p "$d"
  openssl req -x509 "${ec[@]}" -nodes -days 2 -subj /CN=plexus-test-ca \
    -keyout "$d/ca.key" -out "$d/ca.crt" 2> /dev/null
  openssl req "${ec[@]}" -nodes -subj /CN=kube-apiserver -keyout "$d/apiserver.key" \
    -out "$d/apiserver.csr" 2> /dev/null
  printf 'subjectAltName=IP:127.0.0.1,IP:%s,IP:%s,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:localhost\n' \
    "$API_ADDR" "${SERVICE_CIDR%.0/24}.1" > "$d/san.ext"
  openssl x509 -req -in "$d/apiserver.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 2 \
    -extfile "$d/san.ext" -out "$d/apiserver.crt" 2> /dev/null
  # The apiserver's client certificate towards the kubelet (logs, exec).
  openssl req "${ec[@]}" -nodes -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" \
    -keyout "$d/kubelet-client.key" -out "$d/kubelet-client.csr" 2> /dev/null
  openssl x509 -req -in "$d/kubelet-client.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 2 \
    -out "$d/kubelet-client.crt" 2> /dev/null
  openssl ecparam -name prime256v1 -genkey -noout -out "$d/sa.key" 2> /dev/null
  openssl ec -in "$d/sa.key" -pubout -out "$d/sa.pub" 2> /dev/null
  ADMIN_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  echo "$ADMIN_TOKEN,admin,admin,system:masters" > "$d/tokens.csv"
  local k token
  for k in $(seq "$NODES"); do
    node_ctx "$k"
    token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    echo "$token,system:node:$NODE_NAME,node,system:nodes" >> "$d/tokens.csv"
    mkdir -p "$nodedir"
    kubeconfig "$nodedir/kubelet.kubeconfig" "$token"
  done
  node_ctx 1
  chmod 600 "$d"/*.key "$d/tokens.csv"
}

kubeconfig() { # FILE TOKEN
  cat > "$1" << EOF
apiVersion: v1
kind: Config
clusters:
- name: plexus
  cluster: {server: "https://$API_ADDR:6443", certificate-authority: "$state/pki/ca.crt"}
users:
- name: user
  user: {token: "$2"}
contexts:
- name: plexus
  context: {cluster: plexus, user: user}
current-context: plexus
EOF
  chmod 600 "$1"
}

# images: the sandbox and test images imported into the current node's containerd. Made from the
# machine's busybox once for all clusters: kept in $PLEXUS_CLUSTER_IMAGES (default
# /var/cache/plexus-cluster-images) under a key of the busybox binary and of how they are made,
# each set made in a staging dir of this state dir's name beside it and renamed into place whole
# (clusters coming up at once may both make it; one rename wins; a staging dir a failed `up` left
# is removed by the next in its slot).
images() {
  local img dir key
  key=$({ sha256sum < /bin/busybox; declare -f build_images; echo "$PAUSE_IMAGE $TEST_IMAGE"; } | sha256sum | cut -c1-16)
  dir=${PLEXUS_CLUSTER_IMAGES:-/var/cache/plexus-cluster-images}/$key
  if [ ! -f "$dir/test.tar" ]; then
    local new=${dir%/*}/.new-${state##*/}
    rm -rf "$new"
    mkdir -p "$new"
    build_images "$new"
    mv -T "$new" "$dir" 2> /dev/null || rm -rf "$new"
  fi
  for img in pause test; do
    in_node "$PEERS_BIN/ctr" -a "$nodedir/containerd.sock" -n k8s.io images import "$dir/$img.tar" > /dev/null
  done
}

# build_images DIR: pause.tar and test.tar (docker archives) into DIR.
build_images() {
  local r=$state/rootfs out=$1
  mkdir -p "$r/bin" "$r/dev" "$r/proc" "$r/sys" "$r/etc"
  cp /bin/busybox "$r/bin/busybox"
  for t in sh sleep cat ip ls echo env wget true trap grep sed tr head; do ln -sf busybox "$r/bin/$t"; done
  tar -C "$r" -cf "$state/rootfs.tar" .
  local store=(--root "$state/podman/root" --runroot "$state/podman/run" --storage-driver vfs)
  # The sandbox image: PID 1 waits for signals and reaps its children, like pause.
  podman "${store[@]}" import -q --change 'CMD ["/bin/sh", "-c", "trap \"exit 0\" TERM INT; while :; do sleep 3600 & wait; done"]' \
    "$state/rootfs.tar" "$PAUSE_IMAGE" > /dev/null
  podman "${store[@]}" import -q --change 'CMD ["/bin/sh"]' "$state/rootfs.tar" "$TEST_IMAGE" > /dev/null
  podman "${store[@]}" save -q --format docker-archive -o "$out/pause.tar" "$PAUSE_IMAGE" > /dev/null
  podman "${store[@]}" save -q --format docker-archive -o "$out/test.tar" "$TEST_IMAGE" > /dev/null
  rm -rf "$state/podman" "$state/rootfs" "$state/rootfs.tar"
}

up() {
  [ "$(id -u)" = 0 ] || { log "run as root"; exit 1; }
  local hollow_nodes=0 nodes="" hollow_stack=plexus
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) nodes=${2:?--nodes N}; shift 2 ;;
      --hollow) hollow_nodes=${2:?--hollow N}; shift 2 ;;
      --hollow-stack) hollow_stack=${2:?--hollow-stack plexus, multus or nodeslice}; shift 2 ;;
      *) log "up: unknown argument $1"; exit 2 ;;
    esac
  done
  # Hollow nodes alone: the control plane without a real node (its namespace is node 1's).
  NODES=${nodes:-$([ "$hollow_nodes" = 0 ] && echo 1 || echo 0)}
  [[ "$NODES" =~ ^[0-9]$ ]] && { [ "$NODES" -ge 1 ] || [ "$hollow_nodes" != 0 ]; } ||
    { log "--nodes: 1 to 9 (0 only with --hollow)"; exit 2; }
  need_packages runc podman busybox-static openssl iproute2 util-linux
  PEERS_BIN=$(bash scripts/peers.sh)
  down
  mkdir -p "$state"/{pids,log,net.d,bin,etcd,containerd,kubelet,cdi}
  chmod 700 "$state"
  echo "$NODES" > "$state/nodes"
  # Each node's mount namespace, kept at $state/mnt (node K: $state/node-K/mnt; their parent mount
  # must be private), with shared propagation inside: the host's mounts are never changed.
  mount --bind "$state" "$state"
  mount --make-private "$state"
  ip netns add "$FABRIC_NETNS"
  for k in $(seq "$((NODES > 0 ? NODES : 1))"); do node_namespaces "$k"; done
  node_ctx 1

  echo "$PEERS_BIN" > "$state/peers-bin"
  # A fake sysfs for the CNI plugins (PLEXUS_SYSFS_ROOT), when the caller gives one: this kernel
  # has no PCI NICs and no RDMA, so device-info and RoCE GID tables come from a tree the test made.
  printf '%s' "${PLEXUS_CLUSTER_SYSFS:-}" > "$state/sysfs-root"
  certs
  # Audit: only the CNI plugins' service accounts, at Metadata level (who, what, when). The log is
  # rotated at 4 GiB, not the API server's 100 MB: scripts/bench/scale.sh counts a burst's requests
  # by the log's lines, and whereabouts' Lease at 32 hollow nodes wrote more than 100 MB in one.
  cat > "$state/audit-policy.yaml" << EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  users:
  - system:serviceaccount:kube-system:plexus
  - system:serviceaccount:kube-system:multus
  - system:serviceaccount:kube-system:whereabouts
- level: None
EOF
  kubeconfig "$state/admin.kubeconfig" "$ADMIN_TOKEN"

  log "etcd"
  daemon etcd

  log "kube-apiserver"
  daemon kube-apiserver
  # No kube-proxy: the kubernetes service's address (what in-cluster clients get in
  # KUBERNETES_SERVICE_HOST) is translated to the apiserver in the node namespace, as kube-proxy would.
  in_node iptables -t nat -A OUTPUT -d "${SERVICE_CIDR%.0/24}.1" -p tcp --dport 443 -j DNAT --to-destination "$API_ADDR:6443"

  log "kube-controller-manager, kube-scheduler"
  daemon kube-controller-manager
  daemon kube-scheduler

  for k in $(seq "$NODES"); do
    node_ctx "$k"
    node_up
  done
  node_ctx 1
  kubectl=("$PEERS_BIN/kubectl" --kubeconfig "$state/admin.kubeconfig")
  # Pods need their namespace's service account, which the controller-manager creates.
  wait_for kube-controller-manager 60 in_node "${kubectl[@]}" -n default get serviceaccount default

  log "CRDs: NetworkAttachmentDefinition, whereabouts' and nv-ipam's IPPool"
  in_node "${kubectl[@]}" apply -f deploy/helm/plexus/crds/network-attachment-definitions.yaml > /dev/null
  in_node "${kubectl[@]}" apply -f conf-examples/deploy/nv-ipam/ippools-crd.yaml > /dev/null
  wb=$PEERS_BIN/../share/whereabouts
  for crd in "$wb"/doc/crds/whereabouts.cni.cncf.io_*.yaml; do
    in_node "${kubectl[@]}" apply -f "$crd" > /dev/null
  done
  [ "$hollow_nodes" = 0 ] || hollow_up "$hollow_nodes" "$hollow_stack"

  cat << EOF
KUBECONFIG=$state/admin.kubeconfig
NODE_NETNS=$NODE_NETNS
FABRIC_NETNS=$FABRIC_NETNS
NODE_NAME=$NODE_NAME
CNI_BIN_DIR=$state/bin
CNI_CONF_DIR=$state/net.d
PLEXUS_POLICY=$state/policy.json
PLEXUS_DATA_DIR=$state/data
CLUSTER_NETWORK=$state/net.d/10-bootstrap.conflist
TEST_IMAGE=$TEST_IMAGE
PEERS_BIN=$PEERS_BIN
EOF
  for k in $(seq 2 "$NODES"); do
    node_ctx "$k"
    printf 'NODE_NETNS_%s=%s\nNODE_NAME_%s=%s\nNODE_STATE_%s=%s\n' "$k" "$NODE_NETNS" "$k" "$NODE_NAME" "$k" "$nodedir"
  done
  [ "$hollow_nodes" = 0 ] || hollow_keys "$hollow_nodes" "$hollow_stack"
}

# node_namespaces K: node K's network namespace (k8s0 on the management segment, its eight RoCE
# ports) and mount namespace. With more than one node, the fabric namespace joins them: a bridge
# `mgmt` for every node's k8s0, and a bridge per rail (MTU 9000) for every node's port of that rail.
node_namespaces() {
  local k=$1 port i peer d
  node_ctx "$k"
  log "network namespace $NODE_NETNS (node $NODE_NAME)"
  mkdir -p "$nodedir"/{pids,log}
  touch "$nodedir/mnt"
  unshare --mount="$nodedir/mnt" --propagation shared true
  ip netns add "$NODE_NETNS"
  ip -n "$NODE_NETNS" link set lo up
  peer=k8s0
  [ "$k" = 1 ] || peer=n$k-k8s0
  ip -n "$NODE_NETNS" link add k8s0 type veth peer name "$peer" netns "$FABRIC_NETNS"
  ip -n "$NODE_NETNS" addr add "$ADDR/24" dev k8s0
  ip -n "$NODE_NETNS" link set k8s0 up
  ip -n "$FABRIC_NETNS" link set "$peer" up
  ip -n "$NODE_NETNS" route add default dev k8s0
  if [ "$NODES" -gt 1 ]; then
    ip -n "$FABRIC_NETNS" link show mgmt > /dev/null 2>&1 || {
      ip -n "$FABRIC_NETNS" link add mgmt type bridge
      ip -n "$FABRIC_NETNS" link set mgmt up
    }
    ip -n "$FABRIC_NETNS" link set "$peer" master mgmt
  fi
  for i in $(seq 8); do
    port=ens${i}f0np0 peer=ens${i}f0np0
    [ "$k" = 1 ] || peer=n${k}r$i
    ip -n "$NODE_NETNS" link add "$port" mtu 9000 type veth peer name "$peer" netns "$FABRIC_NETNS" mtu 9000
    ip -n "$NODE_NETNS" link set "$port" up
    ip -n "$FABRIC_NETNS" link set "$peer" up
    if [ "$NODES" -gt 1 ]; then
      ip -n "$FABRIC_NETNS" link show "rail$i" > /dev/null 2>&1 || {
        ip -n "$FABRIC_NETNS" link add "rail$i" mtu 9000 type bridge
        ip -n "$FABRIC_NETNS" link set "rail$i" up
      }
      ip -n "$FABRIC_NETNS" link set "$peer" master "rail$i"
    fi
  done
  if [ "$k" != 1 ]; then
    # Node K's own entries of the state dir, bound over node 1's paths in its mount namespace.
    for d in $NODE_DIRS; do
      mkdir -p "$state/$d" "$nodedir/$d"
      nsenter --mount="$nodedir/mnt" mount --bind "$nodedir/$d" "$state/$d"
    done
  fi
}

# node_up: the current node's containerd (with the images) and kubelet, until the node is Ready.
node_up() {
  log "containerd ($NODE_NAME)"
  nri_config() {
    if [ "${PLEXUS_CLUSTER_NRI:-}" = 1 ]; then
      mkdir -p "$state/nri/plugins" "$state/nri/conf.d"
      printf '  disable = false\n  socket_path = "%s"\n  plugin_path = "%s"\n  plugin_config_path = "%s"' \
        "$state/nri/nri.sock" "$state/nri/plugins" "$state/nri/conf.d"
    else
      printf '  disable = true'
    fi
  }
  cp "$PEERS_BIN"/{loopback,bridge,host-local} "$nodedir/bin/"
  cat > "$nodedir/containerd.toml" << EOF
version = 3
root = "$state/containerd/root"
state = "$state/containerd/state"
[grpc]
  address = "$nodedir/containerd.sock"
[debug]
  level = "debug"
[ttrpc]
  address = "$nodedir/containerd-ttrpc.sock"
[plugins.'io.containerd.nri.v1.nri']
$(nri_config)
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_cdi = true
  cdi_spec_dirs = ["$state/cdi"]
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dir = "$state/bin"
  conf_dir = "$state/net.d"
  max_conf_num = 1
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "$PAUSE_IMAGE"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = "/usr/bin/runc"
  Root = "$state/runc"
EOF
  # The bootstrap cluster network (replaced when plexus is installed): a bridge on the pod range.
  cat > "$nodedir/net.d/10-bootstrap.conflist" << EOF
{"cniVersion": "1.0.0", "name": "bootstrap", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "dataDir": "$state/host-local"}},
  {"type": "loopback"}]}
EOF
  # plexus's node policy for this node: no allow-lists; its data and device-info files under the
  # cluster's state dir.
  printf '{"dataRoots": ["%s"], "deviceInfoDir": "%s"}\n' "$state/data" "$state/devinfo" > "$state/policy.json"
  chmod 600 "$state/policy.json"
  mkdir -p "$nodedir/data"
  daemon containerd
  images

  log "kubelet ($NODE_NAME)"
  # The kubelet's device manager keeps its socket and checkpoint at a fixed path, not under
  # --root-dir: in the node's mount namespace /var/lib/kubelet/device-plugins is
  # $state/kubelet/device-plugins (device plugins register there). The mount point is made on the
  # host only when missing, and removed by `down` then.
  if [ ! -d /var/lib/kubelet/device-plugins ]; then
    mkdir -p /var/lib/kubelet/device-plugins
    touch "$made_kubelet_dir"
  fi
  mkdir -p "$nodedir/kubelet/device-plugins"
  nsenter --mount="$nodedir/mnt" mount --bind "$nodedir/kubelet/device-plugins" /var/lib/kubelet/device-plugins
  cat > "$nodedir/kubelet.yaml" << EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$nodedir/containerd.sock
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
imageGCHighThresholdPercent: 100
evictionHard: {"memory.available": "0%", "nodefs.available": "0%", "imagefs.available": "0%"}
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}, x509: {clientCAFile: "$state/pki/ca.crt"}}
authorization: {mode: AlwaysAllow}
clusterDomain: cluster.local
podCIDR: $POD_CIDR
staticPodPath: "$state/manifests"
podLogsDir: "$state/pod-logs"
featureGates: {DRAConsumableCapacity: true}
EOF
  mkdir -p "$nodedir/manifests"
  daemon kubelet
  [ "$nodedir" = "$state" ] || in_node iptables -t nat -A OUTPUT -d "${SERVICE_CIDR%.0/24}.1" -p tcp --dport 443 \
    -j DNAT --to-destination "$API_ADDR:6443"
  wait_for kubelet 180 in_node "$PEERS_BIN/kubectl" --kubeconfig "$state/admin.kubeconfig" wait \
    --for=condition=Ready "node/$NODE_NAME" --timeout=1s
}

# For stop/start/restart/kill DAEMON [--node K]: the peers `up` used, and node K's context.
of_up() {
  [ -f "$state/peers-bin" ] || { log "no cluster is up"; exit 1; }
  PEERS_BIN=$(cat "$state/peers-bin")
  NODES=$(cat "$state/nodes")
  local k=1
  [ "${1:-}" = --node ] && k=${2:?--node K}
  [[ "$k" =~ ^[1-9]$ ]] && { [ "$k" = 1 ] || [ "$k" -le "$NODES" ]; } || { log "--node $k: the cluster has $NODES node(s)"; exit 2; }
  node_ctx "$k"
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  stop) of_up "${@:3}"; halt "${2:?daemon name}" ;;
  kill) of_up "${@:3}"; halt "${2:?daemon name}" KILL ;;
  start) of_up "${@:3}"; daemon "${2:?daemon name}" ;;
  restart) of_up "${@:3}"; halt "${2:?daemon name}"; daemon "$2" ;;
  hollow-restart) of_up; hollow_restart "${2:?hollow node}" ;;
  *)
    echo "usage: bash scripts/cluster.sh up [--nodes N] [--hollow N]|down|stop|start|restart|kill DAEMON [--node K]" >&2
    exit 2
    ;;
esac
