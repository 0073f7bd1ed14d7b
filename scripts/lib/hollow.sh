# Hollow nodes for scripts/cluster.sh (`up --hollow N`), as Kubernetes' kubemark makes them: the
# real node agent — here the real plexus-daemon — against the cluster's one control plane, with
# what needs a machine stood in for (docs/hollow-nodes.md says what is real and what is not).
# Each hollow node K (plexus-hollow-K) has:
# - a Node object kept Ready by kwok (one process for all of them; its node lease), which also
#   keeps its pods' status: a pod is Ready once the kubelet stand-in's ADD succeeded and deleted
#   once its DEL ran (the stages below wait for the stand-in's annotations);
# - a network namespace ($NODE1_NETNS-hK): hk0 on the management bridge (198.18.224.0/20, the
#   apiserver reached through node 1's k8s0) and eight RoCE ports ens1f0np0..ens8f0np0 (veth
#   pairs, MTU 9000, their peers r1..r8 in the same namespace), made ConnectX functions by a fake
#   sysfs of its own;
# - plexus-daemon in that namespace under the node's name (its UTS name too), daemon mode with
#   its watch caches, in-process delegates, the DRA driver (the stand-in registers it as the
#   kubelet's plugin watcher does) and its metrics on hk0's address, port 9134;
# - plexus's conflist (the meta-plugin through the daemon; the cluster network a bridge with
#   host-local, as the real node's bootstrap network) and node policy (its data and the
#   kubernetes store's credentials), under $state/hollow/K;
# or, with the stack `multus` (`up --hollow-stack multus`, the peers side by side), in place of
# plexus-daemon and its files: Multus thick's multus-daemon in that namespace as its DaemonSet
# runs it (in-cluster credentials of its ServiceAccount, MULTUS_NODE_NAME, "multusConfigFile":
# "auto" around the same cluster network), the multus-shim conflist, and the reference plugins
# and whereabouts (its Lease, its ServiceAccount's kubeconfig in a flat file) as its delegates;
# with the stack `nodeslice`, the same and whereabouts' node-slice controller (one for the
# cluster), whereabouts on each node knowing its node by NODENAME;
# and one kubelet stand-in (plexus-test-hollow-kubelet) serves every hollow node: a pod watch
# per node, a sandbox namespace and the CNI ADD and DEL through the `plexus` shim for its pods.
# The plexus binaries are the shipped build (scripts/build-release.sh) unless PLEXUS_HOLLOW_BIN
# names a directory holding them, and the stand-in is built with them unless
# PLEXUS_HOLLOW_KUBELET names it.

HOLLOW_NET=198.18.224.0/20
HOLLOW_PORTS="ens1f0np0 ens2f0np0 ens3f0np0 ens4f0np0 ens5f0np0 ens6f0np0 ens7f0np0 ens8f0np0"
hollow=$state/hollow
# The kubelet stand-in's sandbox namespaces: this prefix, then the pod's UID.
HOLLOW_SANDBOX_PREFIX=plxsb${slot:-d}-

hollow_name() { echo "plexus-hollow-$1"; }
hollow_netns() { echo "$NODE1_NETNS-h$1"; }
# The management address of hollow node K: 198.18.224.(K+1) onwards (node 1 is .1).
hollow_addr() { echo "198.18.$((224 + ($1 + 1) / 256)).$((($1 + 1) % 256))"; }

# hollow_start NAME CMD...: a process of the hollow nodes' (detached, its PID kept for `down`).
hollow_start() {
  local name=$1
  shift
  setsid "$@" >> "$hollow/log/$name.log" 2>&1 < /dev/null &
  echo $! > "$hollow/pids/$name"
}

# hollow_up N STACK: N hollow nodes on the control plane `up` started, each with STACK's node
# agent: plexus (plexus-daemon), multus (multus-daemon, the reference plugins, whereabouts) or
# nodeslice (multus's, with whereabouts' node slices).
hollow_up() {
  local n=$1 stack=$2 k bin kubelet kwok
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 1000 ] || { log "--hollow: 1 to 1000"; exit 2; }
  case $stack in plexus | multus | nodeslice) ;; *) log "--hollow-stack: plexus, multus or nodeslice"; exit 2 ;; esac
  mkdir -p "$hollow"/{pids,log,bin}
  echo "$n" > "$hollow/nodes"
  echo "$stack" > "$hollow/stack"
  kwok=$(bash scripts/peers.sh kwok)/kwok
  bin=${PLEXUS_HOLLOW_BIN:-} kubelet=${PLEXUS_HOLLOW_KUBELET:-}
  if [ -z "$bin" ] || [ -z "$kubelet" ]; then
    source scripts/lib/shipped.sh
    local built
    built=$(bash scripts/build-release.sh "${SHIPPED_BUILD[@]}" --bin plexus-test-hollow-kubelet)
    bin=${bin:-$built} kubelet=${kubelet:-$built/plexus-test-hollow-kubelet}
  fi
  cp "$PEERS_BIN"/{bridge,host-local,loopback} "$hollow/bin/"
  cp "$kubelet" "$hollow/plexus-test-hollow-kubelet"
  if [ "$stack" = plexus ]; then
    cp "$bin"/{plexus,plexus-daemon,plexus-macvlan,plexus-host-device,plexus-ipam} "$hollow/bin/"
    log "hollow nodes: plexus's service account and RBAC (the chart's), its token"
    "$PEERS_BIN/helm" template plexus deploy/helm/plexus --namespace kube-system --set mode=daemon \
      --set dra.enabled=true --set ipamKubernetesStore.enabled=true --set ipamPools.enabled=true \
      --show-only templates/serviceaccount.yaml --show-only templates/rbac.yaml \
      --show-only templates/rbac-ipam-kubernetes.yaml --show-only templates/rbac-ipam-pools.yaml |
      in_node "${kubectl[@]}" apply -f - > /dev/null
    kubeconfig "$hollow/plexus.kubeconfig" \
      "$(in_node "${kubectl[@]}" -n kube-system create token plexus --duration 48h)"
  else
    [ "$stack" = nodeslice ] && bash scripts/peers.sh nodeslice > /dev/null
    cp "$PEERS_BIN"/{multus-shim,macvlan,whereabouts} "$hollow/bin/"
    hollow_multus_credentials
  fi

  log "hollow nodes: the management segment"
  # Node 1's k8s0 joins the fabric's management bridge (with one real node it is not on one) and
  # gets an address of the hollow nodes' segment.
  ip -n "$FABRIC_NETNS" link show mgmt > /dev/null 2>&1 || {
    ip -n "$FABRIC_NETNS" link add mgmt type bridge
    ip -n "$FABRIC_NETNS" link set mgmt up
  }
  ip -n "$FABRIC_NETNS" link set k8s0 master mgmt
  ip -n "$NODE1_NETNS" addr add "198.18.224.1/20" dev k8s0

  log "hollow nodes: $n namespaces, ports, sysfs, Node objects"
  for k in $(seq "$n"); do hollow_node "$k" "$stack"; done
  for k in $(seq "$n"); do hollow_node_object "$k"; done | in_node "${kubectl[@]}" apply -f - > /dev/null

  log "hollow nodes: kwok"
  hollow_kwok_config > "$hollow/kwok.yaml"
  mkdir -p "$hollow/kwok-home"
  hollow_start kwok env HOME="$hollow/kwok-home" ip netns exec "$NODE1_NETNS" "$kwok" \
    --config "$hollow/kwok.yaml" --kubeconfig "$state/admin.kubeconfig" \
    --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake --node-lease-duration-seconds 40 \
    --cidr 198.19.0.0/17
  wait_log=$hollow/log/kwok.log wait_for "hollow nodes Ready" 120 hollow_nodes_ready "$n"
  if [ "$stack" = nodeslice ]; then
    log "hollow nodes: whereabouts' node-slice controller"
    hollow_start nodeslice-controller env WHEREABOUTS_NAMESPACE=kube-system ip netns exec "$NODE1_NETNS" \
      "$(bash scripts/peers.sh nodeslice)/whereabouts-node-slice-controller" -kubeconfig "$hollow/whereabouts.kubeconfig"
  fi

  log "hollow nodes: $(hollow_agent_name) on each"
  for k in $(seq "$n"); do hollow_agent "$k"; done
  hollow_kubelet_config "$n" "$stack" > "$hollow/kubelet.json"
  # In node 1's network namespace (the apiserver's address) but the host's mount namespace, where
  # the sandboxes' namespaces it makes are mounted (`ip netns exec` would give it a mount
  # namespace of its own, whose mounts the daemons would not see).
  hollow_start kubelet nsenter --net="/run/netns/$NODE1_NETNS" "$hollow/plexus-test-hollow-kubelet" "$hollow/kubelet.json"
  for k in $(seq "$n"); do
    wait_log=$hollow/log/daemon-$k.log wait_for "$(hollow_agent_name) on $(hollow_name "$k")" 60 hollow_agent_ready "$k"
  done
}

# The node agent of the hollow nodes' stack, by name.
hollow_agent_name() {
  case $(cat "$hollow/stack") in plexus) echo plexus-daemon ;; *) echo multus-daemon ;; esac
}

# hollow_agent K: node K's agent started (its PID in pids/daemon-K, its log log/daemon-K.log).
hollow_agent() {
  case $(cat "$hollow/stack") in plexus) hollow_daemon "$1" ;; *) hollow_multus "$1" ;; esac
}

# hollow_agent_ready K: node K's agent serves: plexus-daemon's /readyz (caches synced, slice
# published, registered by the stand-in), multus-daemon's socket.
hollow_agent_ready() {
  case $(cat "$hollow/stack") in
    plexus) in_node busybox wget -q -O /dev/null "http://$(hollow_addr "$1"):9134/readyz" 2> /dev/null ;;
    *) [ -S "$hollow/$1/run/multus/multus.sock" ] ;;
  esac
}

# hollow_multus_credentials: Multus thick's and whereabouts' ServiceAccounts and RBAC (their own
# manifests'), multus-daemon's in-cluster token and CA (bound where client-go looks for them in
# each multus-daemon's mount namespace) and whereabouts' flat config with its kubeconfig.
hollow_multus_credentials() {
  log "hollow nodes: Multus thick's and whereabouts' service accounts and RBAC (their manifests'), tokens"
  {
    python3 scripts/bench/benchtool.py rbac-docs "$PEERS_BIN/../share/multus/deployments/multus-daemonset-thick.yml"
    echo
    python3 scripts/bench/benchtool.py rbac-docs "$PEERS_BIN/../share/whereabouts/doc/crds/daemonset-install.yaml"
  } | in_node "${kubectl[@]}" apply -f - > /dev/null
  mkdir -p "$hollow/multus-sa"
  in_node "${kubectl[@]}" -n kube-system create token multus --duration 48h > "$hollow/multus-sa/token"
  cp "$state/pki/ca.crt" "$hollow/multus-sa/ca.crt"
  kubeconfig "$hollow/whereabouts.kubeconfig" \
    "$(in_node "${kubectl[@]}" -n kube-system create token whereabouts --duration 48h)"
  printf '{"datastore": "kubernetes", "kubernetes": {"kubeconfig": "%s"}, "log_level": "error"}\n' \
    "$hollow/whereabouts.kubeconfig" > "$hollow/whereabouts.conf"
  # The mount point of the in-cluster credentials (empty on the host; removed by `down` if made here).
  if [ ! -d "$SA_DIR" ]; then
    mkdir -p "$SA_DIR"
    touch "$hollow/made-sa-dir"
  fi
}

hollow_nodes_ready() {
  local ready
  ready=$(in_node "${kubectl[@]}" get nodes -l plexus.dev/hollow=true \
    -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c '^True$')
  [ "$ready" = "$1" ]
}

# hollow_node K STACK: node K's namespace, ports, fake sysfs, files.
hollow_node() {
  local k=$1 stack=$2 ns dir addr i batch cluster
  ns=$(hollow_netns "$k") dir=$hollow/$k addr=$(hollow_addr "$k")
  mkdir -p "$dir"/{net.d,data,devinfo,run,cni,host-local,kubelet,cdi,dev}
  chmod 700 "$dir"
  ip netns add "$ns"
  ip -n "$ns" link add hk0 type veth peer name "h$k" netns "$FABRIC_NETNS"
  ip -n "$FABRIC_NETNS" link set "h$k" master mgmt up
  batch="link set lo up
addr add $addr/20 dev hk0
link set hk0 up
route add default dev hk0"
  for i in $(seq 8); do
    batch+="
link add ens${i}f0np0 mtu 9000 type veth peer name r$i mtu 9000
link set ens${i}f0np0 up
link set r$i up"
  done
  echo "$batch" | ip -n "$ns" -batch -
  # shellcheck disable=SC2086
  roce_sysfs "$dir/sys" $HOLLOW_PORTS
  # The cluster network: a bridge with host-local, as the real node's bootstrap network.
  cluster=$(
    cat << EOF
{"cniVersion": "1.0.0", "name": "cluster", "plugins": [
     {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
      "ipam": {"type": "host-local", "ranges": [[{"subnet": "198.19.128.0/24"}]], "dataDir": "$dir/host-local"}},
     {"type": "loopback"}]}
EOF
  )
  if [ "$stack" != plexus ]; then
    mkdir -p "$dir"/{multus-net.d,multus-cache,run/multus}
    echo "$cluster" > "$dir/multus-net.d/10-cluster.conflist"
    cat > "$dir/multus.json" << EOF
{"chrootDir": "/", "cniVersion": "0.3.1", "logLevel": "error", "logToStderr": true,
 "cniConfigDir": "$dir/multus-net.d", "multusAutoconfigDir": "$dir/multus-net.d", "multusConfigFile": "auto",
 "socketDir": "$dir/run/multus", "binDir": "$hollow/bin", "cniDir": "$dir/multus-cache"}
EOF
    # What multus-daemon's "auto" writes beside the cluster network (the shim's socket, the cluster
    # network), as the conflist the runtime runs.
    cat > "$dir/net.d/00-multus.conflist" << EOF
{"cniVersion": "0.3.1", "name": "multus-cni-network", "plugins": [{"type": "multus-shim",
  "daemonSocketDir": "$dir/run/multus", "clusterNetwork": "$dir/multus-net.d/10-cluster.conflist"}]}
EOF
    return
  fi
  printf '{"dataRoots": ["%s"], "deviceInfoDir": "%s", "kubernetes": {"kubeconfig": "%s", "namespace": "kube-system"}}\n' \
    "$dir/data" "$dir/devinfo" "$hollow/plexus.kubeconfig" > "$dir/policy.json"
  chmod 600 "$dir/policy.json"
  cat > "$dir/net.d/00-plexus.conflist" << EOF
{"cniVersion": "1.1.0", "name": "plexus", "plugins": [
  {"type": "plexus", "kubeconfig": "$hollow/plexus.kubeconfig", "binDir": "$hollow/bin",
   "daemonSocket": "$dir/run/daemon.sock", "draClaimsDir": "$dir/run/dra-claims", "cniDir": "$dir/cni",
   "delegates": [$cluster]}]}
EOF
}

# hollow_node_object K: node K's Node (kwok manages it by its annotation; tainted, so that only
# pods meant for hollow nodes go there).
hollow_node_object() {
  cat << EOF
apiVersion: v1
kind: Node
metadata:
  name: $(hollow_name "$1")
  annotations: {kwok.x-k8s.io/node: fake}
  labels: {kubernetes.io/hostname: $(hollow_name "$1"), kubernetes.io/os: linux, type: kwok, plexus.dev/hollow: "true"}
spec:
  taints: [{key: plexus.dev/hollow, value: "true", effect: NoSchedule}]
status:
  addresses: [{type: InternalIP, address: $(hollow_addr "$1")}, {type: Hostname, address: $(hollow_name "$1")}]
  allocatable: {cpu: "64", memory: 512Gi, pods: "110"}
  capacity: {cpu: "64", memory: 512Gi, pods: "110"}
---
EOF
}

# hollow_daemon K: plexus-daemon on node K, as the chart's daemon mode with DRA runs it.
hollow_daemon() {
  local k=$1 dir=$hollow/$1 name ports
  name=$(hollow_name "$k") ports=${HOLLOW_PORTS// /,}
  hollow_start "daemon-$k" env PLEXUS_POLICY="$dir/policy.json" \
    ip netns exec "$(hollow_netns "$k")" unshare --uts -- sh -c 'echo "$0" > /proc/sys/kernel/hostname && exec "$@"' "$name" \
    "$hollow/bin/plexus-daemon" --node-name "$name" --kubeconfig "$hollow/plexus.kubeconfig" \
    --socket "$dir/run/daemon.sock" --status-journal "$dir/run/network-status" \
    --metrics-address "$(hollow_addr "$k"):9134" --sysfs-root "$dir/sys" \
    --dra --dra-shared-ports "$ports" --kubelet-dir "$dir/kubelet" --cdi-dir "$dir/cdi" \
    --dev-root "$dir/dev" --dra-claims-dir "$dir/run/dra-claims"
}

# Where client-go's in-cluster configuration reads the ServiceAccount's token and CA.
SA_DIR=/run/secrets/kubernetes.io/serviceaccount

# hollow_multus K: Multus thick's multus-daemon on node K, as its DaemonSet runs it: in the node's
# network namespace, its ServiceAccount's token and CA bound at $SA_DIR in a mount namespace of
# its own (slave to the host's: the sandboxes' namespaces the stand-in mounts reach it), the API
# server's address in KUBERNETES_SERVICE_HOST, the node's name in MULTUS_NODE_NAME (its pod
# informer then lists and watches only the node's pods). With node slices, also NODENAME, which
# its delegates inherit: whereabouts' node name (on a real node, the host's /etc/hostname in
# multus-daemon's chroot).
hollow_multus() {
  local k=$1 name nodename=()
  name=$(hollow_name "$k")
  [ "$(cat "$hollow/stack")" = nodeslice ] && nodename=(NODENAME="$name")
  hollow_start "daemon-$k" ip netns exec "$(hollow_netns "$k")" unshare -m --propagation slave -- \
    sh -c 'mount --bind "$0" "$1" && shift && exec "$@"' "$hollow/multus-sa" "$SA_DIR" \
    env KUBERNETES_SERVICE_HOST="$API_ADDR" KUBERNETES_SERVICE_PORT=6443 MULTUS_NODE_NAME="$name" \
    "${nodename[@]}" "$PEERS_BIN/multus-daemon" -config "$hollow/$k/multus.json"
}

# hollow_kubelet_config N STACK: the stand-in's config (plexus's nodes also have the DRA plugin
# registry, and the node policy in the runtime's environment).
hollow_kubelet_config() {
  local k sep="" extra=""
  printf '{"kubeconfig": "%s", "timings": "%s", "netnsPrefix": "%s", "nodes": [\n' \
    "$state/admin.kubeconfig" "$hollow/cni-timings.jsonl" "$HOLLOW_SANDBOX_PREFIX"
  for k in $(seq "$1"); do
    [ "$2" = plexus ] && extra=$(printf ', "registry": "%s", "env": {"PLEXUS_POLICY": "%s"}' \
      "$hollow/$k/kubelet/plugins_registry" "$hollow/$k/policy.json")
    printf '%s{"name": "%s", "netns": "%s", "confFile": "%s", "binDir": "%s"%s}\n' \
      "$sep" "$(hollow_name "$k")" "$(hollow_netns "$k")" "$(ls "$hollow/$k"/net.d/00-*.conflist)" "$hollow/bin" "$extra"
    sep=,
  done
  echo ']}'
}

# kwok's stages (kwok's own "fast" node and pod stages and its node heartbeat with a lease),
# with two changes: a pod becomes Ready only once the stand-in's ADD succeeded
# (plexus.dev/hollow-sandbox), and a deleted pod goes only once its DEL ran
# (plexus.dev/hollow-released), as a kubelet's pods do.
# The node conditions kwok writes (its own template): Ready, the others not under pressure.
kwok_node_conditions() {
  cat << 'EOF'
      {{ $now := Now }}
      {{ $lastTransitionTime := or .metadata.creationTimestamp $now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $lastTransitionTime | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
EOF
}

hollow_kwok_config() {
  cat << 'EOF'
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: node-initialize}
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - {key: '.status.conditions.[] | select( .type == "Ready" ) | .status', operator: NotIn, values: ['True']}
  next:
    statusTemplate: |
EOF
  kwok_node_conditions
  cat << 'EOF'
      addresses:
      {{ YAML .status.addresses 1 }}
      allocatable:
      {{ YAML .status.allocatable 1 }}
      capacity:
      {{ YAML .status.capacity 1 }}
      nodeInfo:
        architecture: amd64
        containerRuntimeVersion: plexus-hollow
        kernelVersion: plexus-hollow
        kubeProxyVersion: plexus-hollow
        kubeletVersion: plexus-hollow
        operatingSystem: linux
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: node-heartbeat-with-lease}
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - {key: '.status.phase', operator: In, values: [Running]}
    - {key: '.status.conditions.[] | select( .type == "Ready" ) | .status', operator: In, values: ['True']}
  delay: {durationMilliseconds: 600000, jitterDurationMilliseconds: 610000}
  next:
    statusTemplate: |
EOF
  kwok_node_conditions
  cat << 'EOF'
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: pod-ready}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: DoesNotExist}
    - {key: '.metadata.annotations["plexus.dev/hollow-sandbox"]', operator: Exists}
    - {key: '.status.phase', operator: In, values: [Pending]}
    - {key: '.status.conditions.[] | select( .type == "Ready" ) | .status', operator: NotIn, values: ['True']}
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - {lastTransitionTime: {{ $now | Quote }}, status: "True", type: Initialized}
      - {lastTransitionTime: {{ $now | Quote }}, status: "True", type: Ready}
      - {lastTransitionTime: {{ $now | Quote }}, status: "True", type: ContainersReady}
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        restartCount: 0
        state: {running: {startedAt: {{ $now | Quote }}}}
      {{ end }}
      {{ $podIPs := PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
      {{ with $podIPs }}
      podIP: {{ index . 0 | Quote }}
      podIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      phase: Running
      startTime: {{ $now | Quote }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: pod-delete}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: Exists}
    - {key: '.metadata.annotations["plexus.dev/hollow-released"]', operator: Exists}
  next:
    delete: true
EOF
}

# hollow_stop SECONDS PIDFILE...: the process groups these files name (each started by
# hollow_start, a session of its own) sent SIGTERM, waited for up to SECONDS, then SIGKILLed.
hollow_stop() {
  local wait=$1 f alive
  shift
  for f in "$@"; do
    [ -f "$f" ] && { kill -TERM -- "-$(cat "$f")" 2> /dev/null || true; }
  done
  for _ in $(seq $((wait * 10))); do
    alive=0
    for f in "$@"; do
      [ -f "$f" ] && kill -0 -- "-$(cat "$f")" 2> /dev/null && alive=1
    done
    [ "$alive" = 0 ] && return 0
    sleep 0.1
  done
  for f in "$@"; do
    [ -f "$f" ] && { kill -KILL -- "-$(cat "$f")" 2> /dev/null || true; }
  done
}

# hollow_down: every process, namespace and file of the hollow nodes (`down` calls it first).
hollow_down() {
  local ns
  hollow_stop 2 "$hollow"/pids/*
  if [ -f "$hollow/made-sa-dir" ]; then
    rmdir "$SA_DIR" "$(dirname "$SA_DIR")" "$(dirname "$(dirname "$SA_DIR")")" 2> /dev/null || true
  fi
  for ns in $(ip netns list | awk -v h="$NODE1_NETNS-h" -v s="$HOLLOW_SANDBOX_PREFIX" \
    'index($1, h) == 1 || index($1, s) == 1 {print $1}'); do
    ip netns del "$ns" 2> /dev/null || true
  done
  rm -rf "$hollow"
}

# hollow_keys N STACK: what `up` prints about the hollow nodes.
hollow_keys() {
  cat << EOF2
HOLLOW_NODES=$1
HOLLOW_STACK=$2
HOLLOW_DIR=$hollow
HOLLOW_TIMINGS=$hollow/cni-timings.jsonl
HOLLOW_SANDBOX_PREFIX=$HOLLOW_SANDBOX_PREFIX
EOF2
  for k in $(seq "$1"); do
    printf 'HOLLOW_NETNS_%s=%s\nHOLLOW_NAME_%s=%s\nHOLLOW_METRICS_%s=%s\n' "$k" "$(hollow_netns "$k")" \
      "$k" "$(hollow_name "$k")" "$k" "http://$(hollow_addr "$k"):9134"
  done
}

# hollow_restart K: node K's agent stopped (SIGTERM, waited for) and started again on the running
# cluster; prints the milliseconds from its start to ready (hollow_agent_ready).
hollow_restart() {
  local k=$1 t0
  [ -f "$hollow/pids/daemon-$k" ] || { log "hollow node $k has no agent"; exit 2; }
  hollow_stop 30 "$hollow/pids/daemon-$k"
  # multus-daemon's socket outlives a stopped daemon: only a new one says it is ready.
  rm -f "$hollow/$k/run/multus/multus.sock"
  t0=$(date +%s%N)
  hollow_agent "$k"
  for _ in $(seq 3000); do
    if hollow_agent_ready "$k"; then
      echo $((($(date +%s%N) - t0) / 1000000))
      return 0
    fi
    sleep 0.01
  done
  log "$(hollow_agent_name) on $(hollow_name "$k") not ready after 30 s"
  return 1
}
