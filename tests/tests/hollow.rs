//! Hollow nodes (`cluster.sh up --hollow N`, docs/hollow-nodes.md): eight nodes on one control
//! plane, each running the real plexus-daemon with its ports on a fake sysfs, and the kubelet
//! stand-in running their pods' CNI ADD and DEL through the `plexus` shim. The small version of
//! the scale benchmark (scripts/bench/scale.sh): pods on two rails whose ranges every node
//! allocates from (plexus-ipam's Kubernetes store), churned on all nodes at once, and at every
//! look no address held twice, every address of a pod the store's entry for it, and nothing left
//! in the store once the pods are gone.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use plexus_tests::cluster::{Cluster, wait_until};
use serde_json::Value;

const NODES: u32 = 8;
const PER_NODE: u32 = 3;
const NS: &str = "churn";
/// The two rails: their NAD's name, the node's port, the range (62 addresses for 24 pods, so
/// that nodes meet on the same offsets) and its IPPool.
const RAILS: [(&str, &str, &str, &str); 2] = [
    ("rail1", "ens1f0np0", "198.18.120.0/26", "198.18.120.0-26"),
    ("rail2", "ens2f0np0", "198.18.120.64/26", "198.18.120.64-26"),
];

fn nads() -> String {
    let mut yaml = format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n---\n");
    for (name, port, range, _) in RAILS {
        let config = format!(
            r#"{{"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "{port}", "mode": "bridge", "ipam": {{"type": "plexus-ipam", "range": "{range}", "store": "kubernetes"}}}}"#
        );
        yaml += &format!(
            "apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata: {{name: {name}, namespace: {NS}}}\nspec:\n  config: '{config}'\n---\n"
        );
    }
    yaml
}

/// Pod `name` on hollow node `k`, on both rails.
fn pod(c: &Cluster, name: &str, k: u32) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {NS}\n  annotations: {{k8s.v1.cni.cncf.io/networks: \"rail1,rail2\"}}\nspec:\n  nodeName: {}\n  tolerations: [{{key: plexus.dev/hollow, operator: Exists}}]\n  containers: [{{name: c, image: busybox}}]\n---\n",
        c.var(&format!("HOLLOW_NAME_{k}"))
    )
}

/// The namespace's pods as the API has them: name → (Ready and not being deleted, network-status).
/// A pod being deleted may have been released already (its DEL ran, kwok has yet to remove it):
/// its address may be a new pod's.
fn pods(c: &Cluster) -> BTreeMap<String, (bool, Option<Vec<Value>>)> {
    c.kubectl_items(&["-n", NS, "get", "pods"])
        .iter()
        .map(|p| {
            let ready = p["metadata"]["deletionTimestamp"].is_null()
                && p["status"]["conditions"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
            let status = p["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"]
                .as_str()
                .map(|s| serde_json::from_str::<Value>(s).unwrap().as_array().unwrap().clone());
            (p["metadata"]["name"].as_str().unwrap().to_string(), (ready, status))
        })
        .collect()
}

/// Each pool's entries: (pool, offset) → the pod the entry names.
fn store(c: &Cluster) -> BTreeMap<(&'static str, u32), String> {
    let mut held = BTreeMap::new();
    for (_, _, _, pool) in RAILS {
        for (offset, entry) in c.pool_entries(pool) {
            held.insert((pool, offset.parse().unwrap()), entry["podref"].as_str().unwrap_or_default().to_string());
        }
    }
    held
}

/// One look at the cluster: every Ready pod with its network-status has one address on each rail,
/// no address is any other Ready pod's, and the store's entry at that address names the pod (the
/// store read after the pods, so an entry a pod reported is there unless the pod went meanwhile).
/// The addresses seen.
fn look(c: &Cluster) -> usize {
    let before = pods(c);
    let held = store(c);
    let now = pods(c);
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for (name, (ready, status)) in &before {
        if !ready {
            continue;
        }
        // plexus-daemon journals a pod's network-status and writes it in the background: a pod
        // may be Ready (its ADD answered) a moment before. The rounds' last looks wait for it.
        let Some(status) = status else { continue };
        for (rail, _, range, pool) in RAILS {
            let net = format!("{NS}/{rail}");
            let entry = status.iter().find(|s| s["name"] == net.as_str()).unwrap_or_else(|| panic!("{name}: no {net}"));
            let ips = entry["ips"].as_array().unwrap();
            assert_eq!(ips.len(), 1, "{name} on {rail}: {ips:?}");
            let ip: std::net::Ipv4Addr = ips[0].as_str().unwrap().parse().unwrap();
            if let Some(other) = seen.insert(ip.to_string(), name.clone()) {
                panic!("{ip} is held by {other} and {name} at once");
            }
            let base: std::net::Ipv4Addr = range.split('/').next().unwrap().parse().unwrap();
            let offset = u32::from(ip) - u32::from(base);
            let still_here = now.get(name).is_some_and(|(r, _)| *r);
            if still_here {
                assert_eq!(
                    held.get(&(pool, offset)).map(String::as_str),
                    Some(format!("{NS}/{name}").as_str()),
                    "{name}'s {ip} on {rail}: the store's entry"
                );
            }
        }
    }
    seen.len()
}

#[test]
fn pods_churned_on_eight_hollow_nodes_at_once_never_share_an_address_and_leave_nothing_in_the_store() {
    let c = Cluster::hollow(NODES, Path::new(env!("CARGO_BIN_EXE_plexus-test-hollow-kubelet")));
    c.apply(&nads());
    // Every node's pods at once.
    let mut live: Vec<(String, u32)> =
        (1..=NODES).flat_map(|k| (0..PER_NODE).map(move |j| (format!("n{k}-{j}"), k))).collect();
    c.apply(&live.iter().map(|(name, k)| pod(&c, name, *k)).collect::<String>());
    let wait_all_ready = |names: &[(String, u32)]| {
        wait_until("every pod Ready with its network-status", Duration::from_secs(300), || {
            let p = pods(&c);
            names.iter().all(|(n, _)| p.get(n).is_some_and(|(ready, status)| *ready && status.is_some()))
        })
    };
    wait_all_ready(&live);
    assert_eq!(look(&c), 2 * live.len(), "every pod an address on each rail");
    // Three rounds: every other pod deleted and as many new ones created on the same nodes, at
    // once, looked at while they come and go.
    for round in 1..=3 {
        let (going, staying): (Vec<_>, Vec<_>) =
            live.into_iter().enumerate().partition(|(i, _)| i % 2 == (round % 2) as usize);
        let going: Vec<(String, u32)> = going.into_iter().map(|(_, p)| p).collect();
        let new: Vec<(String, u32)> = going.iter().map(|(n, k)| (format!("r{round}-{n}"), *k)).collect();
        let mut args = vec!["-n", NS, "delete", "pod", "--wait=false"];
        args.extend(going.iter().map(|(n, _)| n.as_str()));
        let (ok, out) = c.kubectl(&args, None);
        assert!(ok, "{out}");
        c.apply(&new.iter().map(|(name, k)| pod(&c, name, *k)).collect::<String>());
        live = staying.into_iter().map(|(_, p)| p).chain(new).collect();
        for _ in 0..5 {
            look(&c);
        }
        wait_all_ready(&live);
        wait_until("the deleted pods gone", Duration::from_secs(300), || {
            let p = pods(&c);
            going.iter().all(|(n, _)| !p.contains_key(n))
        });
        assert_eq!(look(&c), 2 * live.len(), "round {round}");
        let held = store(&c);
        assert_eq!(held.len(), 2 * live.len(), "the store holds the live pods' addresses only: {held:?}");
    }
    // All gone: nothing left in the pools, and no reservation.
    let (ok, out) = c.kubectl(&["-n", NS, "delete", "pods", "--all", "--wait=true", "--timeout=300s"], None);
    assert!(ok, "{out}");
    assert_eq!(store(&c), BTreeMap::new(), "no entry outlives its pod");
    let (ok, out) = c.kubectl(
        &["-n", "kube-system", "get", "overlappingrangeipreservations.whereabouts.cni.cncf.io", "-o", "name"],
        None,
    );
    assert!(ok, "{out}");
    assert_eq!(out.trim(), "", "no reservation outlives its pod");
    // The stand-in's own record: every pod's ADD and DEL ran through the shim.
    let timings = std::fs::read_to_string(c.var("HOLLOW_TIMINGS")).unwrap();
    let ok_adds: BTreeSet<String> = timings
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|t| t["verb"] == "ADD" && t["error"].as_str().unwrap_or_default().is_empty())
        .map(|t| t["pod"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(ok_adds.len() >= (NODES * PER_NODE) as usize, "{} pods' ADDs succeeded", ok_adds.len());
}
