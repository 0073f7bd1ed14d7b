// whereabouts v0.9 (its Kubernetes store), the IPAM plexus-ipam is measured against. A consumer
// module carrying whereabouts' own replace of gogo/protobuf. Built by scripts/peers.sh.
module plexus.local/peers/whereabouts

go 1.24.0

require github.com/k8snetworkplumbingwg/whereabouts v0.9.2

replace github.com/gogo/protobuf => github.com/gogo/protobuf v1.3.2

tool github.com/k8snetworkplumbingwg/whereabouts/cmd
