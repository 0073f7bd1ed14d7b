// crictl, to drive the kubelet's runtime by hand in tests. Built by scripts/peers.sh.
module plexus.local/peers/cri-tools

go 1.24.0

require sigs.k8s.io/cri-tools v1.34.0

tool sigs.k8s.io/cri-tools/cmd/crictl
