//! plexus-ipam's pools (`poolName`: nv-ipam's IPPool objects) on a real API server: the node
//! claims blocks in the pool's status and gives addresses from them in its own files.

use std::collections::BTreeSet;

use plexus_tests::cluster::{Cluster, Interrupt};
use serde_json::{Value, json};

fn run(c: &Cluster, verb: &str, cid: &str, conf: &Value) -> (bool, Value) {
    let bin = plexus_tests::plugin_bin("plexus-ipam");
    c.ipam_run_on(1, &bin, verb, cid, &format!("default/pod-{cid}"), conf, Interrupt::Fault(""))
}

fn address(r: &Value) -> String {
    r["ips"][0]["address"].as_str().unwrap_or_else(|| panic!("no address: {r}")).to_string()
}

fn pool(c: &Cluster, name: &str) -> Value {
    let (ok, out) = c.kubectl(&["-n", "kube-system", "get", "ippools.nv-ipam.nvidia.com", name, "-o", "json"], None);
    assert!(ok, "{out}");
    serde_json::from_str(&out).unwrap()
}

/// The blocks `status.allocations` gives `node`, as `start-end`.
fn blocks_of(c: &Cluster, name: &str, node: &str) -> Vec<String> {
    pool(c, name)["status"]["allocations"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|e| e["nodeName"] == node)
                .map(|e| format!("{}-{}", e["startIP"].as_str().unwrap(), e["endIP"].as_str().unwrap()))
                .collect()
        })
        .unwrap_or_default()
}

fn block_dirs(c: &Cluster) -> Vec<String> {
    match std::fs::read_dir(c.data().join(".plexus-ipam-pools")) {
        // The node's claim turns (`.turn-NN`, a fixed few) are no block's.
        Ok(d) => d.map(|e| e.unwrap().file_name().into_string().unwrap()).filter(|n| !n.starts_with('.')).collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn a_node_claims_blocks_of_an_nv_ipam_pool_and_gives_addresses_from_them_with_one_api_write_per_block_also_under_concurrent_adds()
 {
    let c = Cluster::up("");
    c.use_ipam_pools();
    let node = c.var("NODE_NAME").to_string();
    c.apply(
        r#"
apiVersion: nv-ipam.nvidia.com/v1alpha1
kind: IPPool
metadata: {name: rail-blocks, namespace: kube-system}
spec:
  subnet: 198.18.200.0/24
  perNodeBlockSize: 8
  gateway: 198.18.200.1
  exclusions: [{startIP: 198.18.200.3, endIP: 198.18.200.4}, {startIP: 198.18.200.20, endIP: 198.18.200.20}]
  perNodeExclusions: [{startIndex: 7, endIndex: 7}]
  routes: [{dst: 198.19.0.0/16}]
---
apiVersion: nv-ipam.nvidia.com/v1alpha1
kind: IPPool
metadata: {name: rack-b, namespace: kube-system}
spec:
  subnet: 198.18.201.0/24
  perNodeBlockSize: 8
  nodeSelector: {nodeSelectorTerms: [{matchExpressions: [{key: rack, operator: In, values: [b]}]}]}
"#,
    );
    // Another node holds the second block already (as nv-ipam's controller would have written it).
    let (ok, out) = c.kubectl(
        &[
            "-n",
            "kube-system",
            "patch",
            "ippools.nv-ipam.nvidia.com",
            "rail-blocks",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status": {"allocations": [{"nodeName": "other-node", "startIP": "198.18.200.9", "endIP": "198.18.200.16"}]}}"#,
        ],
        None,
    );
    assert!(ok, "{out}");
    // A second Node (no kubelet behind it): the pool selects it too.
    c.apply("apiVersion: v1\nkind: Node\nmetadata: {name: pool-peer, labels: {rack: a}}\n");
    let conf = json!({"cniVersion": "1.0.0", "name": "rail0",
        "ipam": {"type": "plexus-ipam", "poolName": "rail-blocks", "nodeName": node}});

    // The node's first claim gives it .1-.8 and pool-peer, which had none, .17-.24 (the other
    // node's .9-.16 passed): one write. Block .1-.8 gives .2 .5 .6 .7 (.1 the gateway, .3-.4
    // excluded, .8 index 7 of every block); when it is full the node claims .25-.32 for itself
    // alone and gives .25 .26 .27 from it.
    let mut got = BTreeSet::new();
    for i in 0..7 {
        let (ok, r) = run(&c, "ADD", &format!("c{i}"), &conf);
        assert!(ok, "ADD {i}: {r}");
        assert_eq!(r["ips"][0]["gateway"], "198.18.200.1", "{r}");
        assert!(
            r["routes"].as_array().unwrap().contains(&json!({"dst": "198.19.0.0/16", "gw": "198.18.200.1"})),
            "{r}"
        );
        got.insert(address(&r));
    }
    let want: BTreeSet<String> = [2, 5, 6, 7, 25, 26, 27].iter().map(|o| format!("198.18.200.{o}/24")).collect();
    assert_eq!(got, want, "no excluded address, no gateway, nothing of the other nodes' blocks");
    // Seven ADDs, two writes: one per block of this node's.
    assert_eq!(blocks_of(&c, "rail-blocks", &node), ["198.18.200.1-198.18.200.8", "198.18.200.25-198.18.200.32"]);
    assert_eq!(blocks_of(&c, "rail-blocks", "pool-peer"), ["198.18.200.17-198.18.200.24"]);
    assert_eq!(blocks_of(&c, "rail-blocks", "other-node"), ["198.18.200.9-198.18.200.16"], "left as it was");
    // An ADD again is answered with the address held.
    let (ok, again) = run(&c, "ADD", "c0", &conf);
    assert!(ok && got.contains(&address(&again)), "{again}");

    // A pool that does not select this node: refused naming the network and the node, nothing
    // claimed, nothing left on the node.
    let rack_b = json!({"cniVersion": "1.0.0", "name": "rail1",
        "ipam": {"type": "plexus-ipam", "poolName": "rack-b", "nodeName": node}});
    let (ok, r) = run(&c, "ADD", "c-rack", &rack_b);
    assert!(!ok && r["code"] == 7, "{r}");
    let msg = r["msg"].as_str().unwrap();
    assert!(msg.contains("network rail1") && msg.contains(&format!("does not select node {node}")), "{msg}");
    assert!(pool(&c, "rack-b")["status"]["allocations"].is_null(), "no block claimed for any node");
    assert!(!block_dirs(&c).iter().any(|d| d.starts_with("rack-b@")), "{:?}", block_dirs(&c));
    // A pool that does not exist: code 7 naming it.
    let none =
        json!({"cniVersion": "1.0.0", "name": "rail2", "ipam": {"type": "plexus-ipam", "poolName": "no-such-pool"}});
    let (ok, r) = run(&c, "ADD", "c-none", &none);
    assert!(!ok && r["code"] == 7 && r["msg"].as_str().unwrap().contains("no IPPool no-such-pool"), "{r}");

    // DEL needs no API server: with the policy's kubeconfig gone, every address is released and
    // the blocks' files go with their last address; a DEL again succeeds.
    let policy_path = c.var("PLEXUS_POLICY").to_string();
    let saved = std::fs::read_to_string(&policy_path).unwrap();
    let mut broken: Value = serde_json::from_str(&saved).unwrap();
    broken["kubernetes"]["kubeconfig"] = json!("/nonexistent/kubeconfig");
    std::fs::write(&policy_path, broken.to_string()).unwrap();
    for i in 0..7 {
        for _ in 0..2 {
            let (ok, r) = run(&c, "DEL", &format!("c{i}"), &conf);
            assert!(ok, "DEL {i}: {r}");
        }
    }
    assert_eq!(block_dirs(&c), Vec::<String>::new(), "no block's files left");
    std::fs::write(&policy_path, saved).unwrap();
    let (ok, out) = c.kubectl(&["delete", "node", "pool-peer"], None);
    assert!(ok, "{out}");

    concurrent_adds_on_one_node_share_its_blocks_and_never_give_an_address_twice(&c, &node);
}

/// (On the cluster of the test above: one cluster's start saved.)
fn concurrent_adds_on_one_node_share_its_blocks_and_never_give_an_address_twice(c: &Cluster, node: &str) {
    c.apply(
        r#"
apiVersion: nv-ipam.nvidia.com/v1alpha1
kind: IPPool
metadata: {name: rail-busy, namespace: kube-system}
spec: {subnet: 198.18.204.0/22, perNodeBlockSize: 16, gateway: 198.18.204.1}
"#,
    );
    let conf = json!({"cniVersion": "1.0.0", "name": "busy",
        "ipam": {"type": "plexus-ipam", "poolName": "rail-busy", "nodeName": node}});
    const N: usize = 60;
    let results: Vec<String> = std::thread::scope(|s| {
        let clients: Vec<_> = (0..12)
            .map(|k| {
                let conf = &conf;
                s.spawn(move || {
                    (k..N)
                        .step_by(12)
                        .map(|i| {
                            let (ok, r) = run(c, "ADD", &format!("b{i}"), conf);
                            assert!(ok, "ADD {i}: {r}");
                            address(&r)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        clients.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let distinct: BTreeSet<&String> = results.iter().collect();
    assert_eq!(distinct.len(), N, "every address given once");
    let blocks = blocks_of(c, "rail-busy", node);
    // 60 addresses fill 4 blocks of 16 (the first holds the gateway): the node's claims take
    // turns, and an ADD that waited for its turn finds the block another one claimed.
    assert_eq!(
        blocks,
        [
            "198.18.204.1-198.18.204.16",
            "198.18.204.17-198.18.204.32",
            "198.18.204.33-198.18.204.48",
            "198.18.204.49-198.18.204.64"
        ]
    );
    for i in 0..N {
        let (ok, r) = run(c, "DEL", &format!("b{i}"), &conf);
        assert!(ok, "DEL {i}: {r}");
    }
    assert!(block_dirs(c).is_empty(), "{:?}", block_dirs(c));
}
