// Multus v4 (thin: multus; thick: multus-daemon + multus-shim), the meta-plugin plexus is
// measured against. Built by scripts/peers.sh.
module plexus.local/peers/multus

go 1.24.0

require gopkg.in/k8snetworkplumbingwg/multus-cni.v4 v4.2.3

tool (
	gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus
	gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-daemon
	gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-shim
)
