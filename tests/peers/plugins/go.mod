// The current reference plugins (macvlan, host-device, static, host-local, tuning, sbr, loopback,
// bridge), beside Debian's 1.1.1. Built by scripts/peers.sh.
module plexus.local/peers/plugins

go 1.24.0

require github.com/containernetworking/plugins v1.9.1

tool (
	github.com/containernetworking/plugins/plugins/main/macvlan
	github.com/containernetworking/plugins/plugins/main/host-device
	github.com/containernetworking/plugins/plugins/main/bridge
	github.com/containernetworking/plugins/plugins/main/loopback
	github.com/containernetworking/plugins/plugins/ipam/host-local
	github.com/containernetworking/plugins/plugins/ipam/static
	github.com/containernetworking/plugins/plugins/meta/tuning
	github.com/containernetworking/plugins/plugins/meta/sbr
)
