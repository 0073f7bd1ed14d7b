// etcd 3.6 for the real-node tests (Debian's 3.4 breaks watch-list clients). Built by
// scripts/peers.sh; never committed.
module plexus.local/peers/etcd

go 1.24.0

require (
	go.etcd.io/etcd/server/v3 v3.6.16
	go.etcd.io/etcd/etcdctl/v3 v3.6.16
)

tool (
	go.etcd.io/etcd/server/v3
	go.etcd.io/etcd/etcdctl/v3
)
