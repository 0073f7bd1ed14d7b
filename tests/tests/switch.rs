//! Switching a running node between Multus and plexus, both ways, as docs/migrating.md does it:
//! pods attached by the stack before keep their interfaces and addresses, new pods never get an
//! address an earlier pod holds, and deleting the earlier pods through the other stack releases
//! everything (whereabouts' allocations and reservations, host devices, Multus's cache). On the
//! real node of `scripts/cluster.sh` ([`plexus_tests::cluster`]), with Multus v4 thin or thick
//! (multus-daemon in its DaemonSet, `scripts/cluster-multus-thick.sh`), the reference macvlan and
//! host-device and whereabouts on its Kubernetes objects.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use plexus_tests::cluster::{Cluster, wait_until};

/// Multus thin as its users run it: its binary and the reference plugins and whereabouts in the
/// CNI bin dir, its config first in the conf dir (the admin's kubeconfig: a test shortcut for
/// its ServiceAccount's), its delegate cache in the node's data dir.
fn install_multus_thin(c: &Cluster) -> PathBuf {
    let peers = Path::new(c.var("PEERS_BIN"));
    for bin in ["multus", "macvlan", "host-device", "whereabouts"] {
        std::fs::copy(peers.join(bin), Path::new(c.var("CNI_BIN_DIR")).join(bin)).unwrap();
    }
    c.data().join("multus")
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Multus {
    Thin,
    Thick,
}

/// Multus of `kind` on the node with the reference plugins and whereabouts, its config first in
/// the conf dir; returns its cache directory.
fn install_multus(c: &Cluster, kind: Multus) -> PathBuf {
    let dir = install_multus_thin(c);
    start_multus(c, kind);
    dir
}

/// Multus's config first in the conf dir, containerd running it. Thick: multus-daemon's DaemonSet,
/// which writes its shim's config itself, around the node's cluster network.
fn start_multus(c: &Cluster, kind: Multus) {
    match kind {
        Multus::Thin => use_stack(c, "multus"),
        Multus::Thick => {
            let out = c
                .script("cluster-multus-thick.sh")
                .envs(c.vars())
                .env("MULTUS_MASTER_CNI", Path::new(c.var("CLUSTER_NETWORK")).file_name().unwrap())
                .output()
                .unwrap();
            assert!(out.status.success(), "cluster-multus-thick.sh:\n{}", String::from_utf8_lossy(&out.stderr));
            wait_until("containerd runs Multus thick's config", Duration::from_secs(30), || {
                c.crictl(&["info"]).1.contains("multus-shim")
            });
        }
    }
}

/// Multus's config gone from the conf dir (thick: its DaemonSet deleted, whose daemon removes
/// it), containerd running plexus's.
fn remove_multus(c: &Cluster, kind: Multus) {
    if kind == Multus::Thick {
        let out = c.script("cluster-multus-thick.sh").arg("--uninstall").envs(c.vars()).output().unwrap();
        assert!(out.status.success(), "cluster-multus-thick.sh --uninstall:\n{}", String::from_utf8_lossy(&out.stderr));
    }
    use_stack(c, "plexus");
}

/// Which meta-plugin containerd runs: Multus's config is written first in the conf dir (it sorts
/// before plexus's `00-plexus.conflist`), or removed; waits until containerd took it.
fn use_stack(c: &Cluster, stack: &str) {
    let conf_dir = Path::new(c.var("CNI_CONF_DIR"));
    let want = if stack == "multus" {
        let conf = serde_json::json!({"cniVersion": "1.0.0", "name": "multus-cni-network", "type": "multus",
            "kubeconfig": c.var("KUBECONFIG"), "cniDir": c.data().join("multus"), "binDir": c.var("CNI_BIN_DIR"),
            "clusterNetwork": c.var("CLUSTER_NETWORK"), "logFile": c.state().join("log/multus.log"),
            "logLevel": "verbose"});
        std::fs::write(conf_dir.join(".00-multus.conf.new"), conf.to_string()).unwrap();
        std::fs::rename(conf_dir.join(".00-multus.conf.new"), conf_dir.join("00-multus.conf")).unwrap();
        "multus-cni-network"
    } else {
        let _ = std::fs::remove_file(conf_dir.join("00-multus.conf"));
        "\"Name\": \"plexus\""
    };
    wait_until(&format!("containerd runs the {stack} config"), Duration::from_secs(30), || {
        c.crictl(&["info"]).1.contains(want)
    });
}

fn whereabouts_nad(c: &Cluster, name: &str, plugin: &str, range: &str) -> String {
    let flat = c.whereabouts_flat_conf();
    let ipam =
        format!(r#""ipam": {{"type": "whereabouts", "range": "{range}", "configuration_path": "{}"}}"#, flat.display());
    c.nad("default", name, &format!(r#"{{"cniVersion": "1.0.0", {plugin}, {ipam}}}"#))
}

/// The container IDs holding addresses of an IPPool.
fn holders(c: &Cluster, pool: &str) -> BTreeSet<String> {
    c.pool_entries(pool).values().map(|e| e["id"].as_str().unwrap_or_default().to_string()).collect()
}

/// The cluster network's addresses in use (the bootstrap conflist's host-local store).
fn cluster_addresses(c: &Cluster) -> usize {
    let dir = c.state().join("host-local/bootstrap");
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<std::net::IpAddr>().is_ok())
        .count()
}

/// The node's links and addresses without IPv6 link-local ones: the reference host-device gives
/// a device back down (it restores its name only), so the kernel has not made its link-local
/// address again.
fn global((links, addrs): (BTreeSet<String>, BTreeSet<String>)) -> (BTreeSet<String>, BTreeSet<String>) {
    (links, addrs.into_iter().filter(|a| !a.contains("\"fe80:")).collect())
}

/// The files Multus keeps (its delegate caches and libcni's results), relative to its directory.
fn multus_files(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for sub in ["", "results"] {
        for e in std::fs::read_dir(dir.join(sub)).into_iter().flatten().flatten() {
            if e.file_type().unwrap().is_file() {
                found.push(format!("{sub}/{}", e.file_name().to_string_lossy()));
            }
        }
    }
    found
}

/// On a failure: what plexus, Multus and containerd said last (the cluster's logs go with it).
struct Logs<'a>(&'a Cluster, Instant);

impl Logs<'_> {
    fn phase(&self, what: &str) {
        eprintln!("{:>6.1} s  {what}", self.1.elapsed().as_secs_f64());
    }
}

impl Drop for Logs<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for (log, filter) in [("plexus.log", ""), ("multus.log", ""), ("containerd.log", "cni")] {
            let text = std::fs::read_to_string(self.0.state().join("log").join(log)).unwrap_or_default();
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| l.contains(filter))
                .map(|l| &l[..l.char_indices().nth(600).map_or(l.len(), |(i, _)| i)])
                .collect();
            eprintln!("--- {log} ends:\n{}", lines[lines.len().saturating_sub(40)..].join("\n"));
        }
    }
}

#[test]
fn a_node_switched_from_multus_thin_to_plexus_keeps_multus_pods_and_plexus_deletes_them_leaving_nothing() {
    multus_to_plexus(Multus::Thin);
}

#[test]
fn a_node_switched_from_multus_thick_to_plexus_keeps_multus_pods_and_plexus_deletes_them_leaving_nothing() {
    multus_to_plexus(Multus::Thick);
}

fn multus_to_plexus(kind: Multus) {
    let c = Cluster::bare(None);
    let logs = Logs(&c, Instant::now());
    let before = c.node_state();
    let cluster_before = cluster_addresses(&c);

    // Multus: a pod on a macvlan with whereabouts, one on a host device too.
    let multus_dir = install_multus(&c, kind);
    logs.phase(&format!("Multus {kind:?} installed"));
    c.apply(
        &(whereabouts_nad(
            &c,
            "w-rail",
            r#""type": "macvlan", "master": "ens1f0np0", "mode": "bridge""#,
            "198.18.178.0/24",
        ) + &whereabouts_nad(&c, "w-dev", r#""type": "host-device", "device": "ens2f0np0""#, "198.18.179.0/24")
            + &c.pod("default", "m1", "w-rail")
            + &c.pod("default", "m2", "w-rail,w-dev")),
    );
    c.wait_ready("default", "pod/m1", "120s");
    c.wait_ready("default", "pod/m2", "60s");
    let m1 = c.pod_addrs("default", "m1");
    let m2 = c.pod_addrs("default", "m2");
    assert_eq!((m1.len(), m2.len()), (1, 2), "{m1:?} {m2:?}");
    let multus_era = holders(&c, "198.18.178.0-24");
    assert_eq!(multus_era.len(), 2, "{multus_era:?}");
    assert_eq!(c.reservation_names().len(), 3);
    assert_eq!(
        multus_files(&multus_dir).len(),
        2 + 5,
        "a cache per pod, libcni's result per delegate, the cluster network's included: {:?}",
        multus_files(&multus_dir)
    );
    assert!(!c.node_state().0.contains("ens2f0np0"), "the host device is in m2");
    logs.phase("two pods on Multus");
    // The switch: plexus installed (its DaemonSet), told where Multus's cache is, plexus-ipam on
    // whereabouts' objects; then Multus removed (thin: its config; thick: its DaemonSet).
    c.install(&format!(r#""multusCacheDir": "{}""#, multus_dir.display()), false, "manifests");
    c.use_kubernetes_ipam_store();
    remove_multus(&c, kind);
    logs.phase("plexus installed, Multus removed");

    // The running pods keep their interfaces and addresses; new pods on the same pool get others.
    let store = r#""ipam": {"type": "plexus-ipam", "range": "198.18.178.0/24", "store": "kubernetes"}"#;
    c.apply(
        &(c.nad(
            "default",
            "p-rail",
            &format!(r#"{{"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "ens1f0np0", {store}}}"#),
        ) + &c.pod("default", "p1", "p-rail")
            + &c.pod("default", "p2", "p-rail")),
    );
    c.wait_ready("default", "pod/p1", "120s");
    c.wait_ready("default", "pod/p2", "60s");
    assert_eq!(c.pod_addrs("default", "m1"), m1);
    assert_eq!(c.pod_addrs("default", "m2"), m2);
    let taken: BTreeSet<String> =
        m1.iter().chain(&m2).map(|a| a.split_whitespace().nth(1).unwrap().to_string()).collect();
    for p in ["p1", "p2"] {
        for a in c.pod_addrs("default", p) {
            let addr = a.split_whitespace().nth(1).unwrap().to_string();
            assert!(!taken.contains(&addr), "{p} got {addr}, which a Multus-era pod holds");
        }
    }
    assert_eq!(holders(&c, "198.18.178.0-24").len(), 4);

    logs.phase("two pods on plexus beside them");
    // The Multus-era pods deleted through plexus: everything Multus's stack held is released.
    c.delete("default", &["pod/m1", "pod/m2"]);
    logs.phase("the Multus-era pods deleted");
    wait_until("the host device back on the node", Duration::from_secs(30), || c.node_state().0.contains("ens2f0np0"));
    wait_until("Multus-era addresses released", Duration::from_secs(30), || {
        c.pool_entries("198.18.178.0-24").len() == 2 && c.pool_entries("198.18.179.0-24").is_empty()
    });
    let left = holders(&c, "198.18.178.0-24");
    assert!(left.is_disjoint(&multus_era), "Multus-era allocations left: {left:?}");
    assert_eq!(left.len(), 2, "p1's and p2's");
    assert!(c.pool_entries("198.18.179.0-24").is_empty());
    assert_eq!(c.reservation_names().len(), 2, "p1's and p2's: {:?}", c.reservation_names());
    assert_eq!(multus_files(&multus_dir), Vec::<String>::new(), "Multus's cache removed");
    // The cluster network too, from the conflist as Multus ran it (Multus v4.2.3's own DEL runs a
    // copy without the bridge's IPAM ranges, and fails).
    assert_eq!(cluster_addresses(&c), cluster_before + 2, "p1's and p2's cluster addresses only");
    c.delete("default", &["pod/p1", "pod/p2"]);
    logs.phase("the plexus pods deleted");
    wait_until("every address released", Duration::from_secs(30), || {
        c.pool_entries("198.18.178.0-24").is_empty() && c.reservation_names().is_empty()
    });
    assert_eq!(global(c.node_state()), global(before), "the node's links and addresses as before the first pod");
}

/// A plexus NAD's config with plexus-ipam on whereabouts' objects.
fn plexus_nad(c: &Cluster, name: &str, plugin: &str, range: &str) -> String {
    let ipam = format!(r#""ipam": {{"type": "plexus-ipam", "range": "{range}", "store": "kubernetes"}}"#);
    let data = c.data().join("hd");
    let data = if plugin.contains("plexus-host-device") {
        format!(r#", "dataDir": "{}""#, data.display())
    } else {
        String::new()
    };
    c.nad("default", name, &format!(r#"{{"cniVersion": "1.0.0", {plugin}{data}, {ipam}}}"#))
}

#[test]
fn a_node_switched_back_to_multus_thin_deletes_plexus_pods_from_the_cache_plexus_wrote_for_it() {
    plexus_to_multus(Multus::Thin);
}

#[test]
fn a_node_switched_back_to_multus_thick_deletes_plexus_pods_from_the_cache_plexus_wrote_for_it() {
    plexus_to_multus(Multus::Thick);
}

fn plexus_to_multus(kind: Multus) {
    let c = Cluster::bare(None);
    let logs = Logs(&c, Instant::now());
    let multus_dir = install_multus_thin(&c);
    let before = c.node_state();
    // plexus writes Multus's cache beside its own while a rollback may come.
    c.install(
        &format!(r#""multusCacheDir": "{}", "writeMultusCache": true"#, multus_dir.display()),
        false,
        "manifests",
    );
    c.use_kubernetes_ipam_store();

    // plexus: a pod on a macvlan, one on a host device too, plexus-ipam on whereabouts' objects.
    c.apply(
        &(plexus_nad(&c, "rail", r#""type": "plexus-macvlan", "master": "ens1f0np0""#, "198.18.178.0/24")
            + &plexus_nad(&c, "dev", r#""type": "plexus-host-device", "device": "ens2f0np0""#, "198.18.179.0/24")
            + &c.pod("default", "q1", "rail")
            + &c.pod("default", "q2", "rail,dev")),
    );
    c.wait_ready("default", "pod/q1", "120s");
    c.wait_ready("default", "pod/q2", "60s");
    let q: BTreeSet<String> = ["q1", "q2"]
        .iter()
        .flat_map(|p| c.pod_addrs("default", p))
        .map(|a| a.split_whitespace().nth(1).unwrap().to_string())
        .collect();
    assert_eq!(q.len(), 3, "{q:?}");
    assert_eq!(c.reservation_names().len(), 3);
    assert_eq!(multus_files(&multus_dir).len(), 2, "a cache per pod, for Multus");
    logs.phase("two pods on plexus");

    // The rollback: the NADs back to the reference plugins and whereabouts on the same ranges,
    // Multus's config first in the conf dir again.
    c.apply(
        &(whereabouts_nad(
            &c,
            "rail",
            r#""type": "macvlan", "master": "ens1f0np0", "mode": "bridge""#,
            "198.18.178.0/24",
        ) + &whereabouts_nad(&c, "dev", r#""type": "host-device", "device": "ens2f0np0""#, "198.18.179.0/24")),
    );
    start_multus(&c, kind);
    logs.phase(&format!("Multus {kind:?} back, the NADs the reference plugins'"));

    // A new pod on Multus gets an address plexus's pods do not hold; theirs keep theirs.
    c.apply(&c.pod("default", "m1", "rail"));
    c.wait_ready("default", "pod/m1", "120s");
    let m1 = c.pod_addrs("default", "m1");
    assert!(m1.iter().all(|a| !q.contains(a.split_whitespace().nth(1).unwrap())), "{m1:?} against {q:?}");
    assert_eq!(holders(&c, "198.18.178.0-24").len(), 3);

    // plexus's pods deleted through Multus, from the caches plexus wrote for it (the pods are gone
    // from the API by then: grace period 0): everything released, the host device back.
    let cluster_before = cluster_addresses(&c);
    c.delete("default", &["pod/q1", "pod/q2"]);
    logs.phase("plexus's pods deleted through Multus");
    wait_until("the host device back on the node", Duration::from_secs(30), || c.node_state().0.contains("ens2f0np0"));
    wait_until("plexus-era addresses released", Duration::from_secs(30), || {
        c.pool_entries("198.18.178.0-24").len() == 1 && c.pool_entries("198.18.179.0-24").is_empty()
    });
    assert_eq!(c.reservation_names().len(), 1, "m1's: {:?}", c.reservation_names());
    assert_eq!(cluster_addresses(&c), cluster_before - 2, "q1's and q2's cluster addresses released");
    assert_eq!(multus_files(&multus_dir).len(), 1 + 2, "m1's cache and results only: {:?}", multus_files(&multus_dir));
    c.delete("default", &["pod/m1"]);
    wait_until("every address released", Duration::from_secs(30), || {
        c.pool_entries("198.18.178.0-24").is_empty() && c.reservation_names().is_empty()
    });
    assert_eq!(global(c.node_state()), global(before), "the node's links and addresses as before the first pod");
    assert!(c.data_names("hd").is_empty(), "plexus-host-device's DEL (run by Multus) removed its state");
    // What Multus does not know stays: plexus's own cache of those pods, which docs/migrating.md
    // removes once the last plexus-era pod is gone.
    assert_eq!(c.data_names("meta").len(), 2, "{:?}", c.data_names("meta"));
}
