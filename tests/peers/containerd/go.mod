// containerd 2.0 (CRI for the kubelet), its runc shim and ctr. Built by scripts/peers.sh.
module plexus.local/peers/containerd

go 1.24.0

require github.com/containerd/containerd/v2 v2.0.14

tool (
	github.com/containerd/containerd/v2/cmd/containerd
	github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
	github.com/containerd/containerd/v2/cmd/ctr
)
