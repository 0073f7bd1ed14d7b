//! The version-skew rule (docs/migrating.md, "Version skew and rollback") held against the real
//! previous release: the newest release CHANGELOG.md lists, built from its commit by the test
//! command (`scripts/previous-release.sh`). On one node, in namespaces, its binaries and this
//! tree's are installed over each other in one plugin directory, as a DaemonSet's rollout and a
//! rollback do, and each release CHECKs, DELs and collects what the other made; both allocate
//! from one pool at once. Nothing may be lost, leaked or held twice, in either order.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use plexus_tests::runner::bin_dir;
use plexus_tests::tenant::Node;
use plexus_tests::{DaemonProcess, DataDir, Outcome, PluginRun, REFERENCE_CNI_DIR, previous_release};
use serde_json::{Value, json};

/// One release's binaries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Release {
    Previous,
    This,
}

use Release::{Previous, This};

impl Release {
    fn bin(self, name: &str) -> PathBuf {
        match self {
            Previous => previous_release().join("bin").join(name),
            This => bin_dir().join(name),
        }
    }
}

/// The binaries plexus installs.
const BINARIES: [&str; 5] = ["plexus", "plexus-macvlan", "plexus-host-device", "plexus-ipam", "plexus-daemon"];

/// A node with a plugin directory that holds one release's binaries or the other's.
struct Skew {
    n: Node,
}

impl Skew {
    fn new() -> Skew {
        let n = Node::new();
        std::fs::create_dir_all(n.path("bin")).unwrap();
        Skew { n }
    }

    /// Install `release`'s binaries (each written beside the old and renamed over it, as the
    /// installer does), or only `only` of them.
    fn install(&self, release: Release, only: &[&str]) {
        let names: Vec<&str> = if only.is_empty() { BINARIES.to_vec() } else { only.to_vec() };
        for b in names {
            let dst = self.n.path("bin").join(b);
            let tmp = self.n.path("bin").join(format!(".{b}.new"));
            std::fs::copy(release.bin(b), &tmp).unwrap();
            std::fs::rename(&tmp, &dst).unwrap();
        }
    }

    fn cni_path(&self) -> String {
        format!("{}:{REFERENCE_CNI_DIR}", self.n.path("bin").display())
    }

    /// `verb` of the installed `plugin` for container `cid` (interface `ifname`) in `pod`.
    fn run(&self, plugin: &str, verb: &str, cid: &str, pod: &Path, ifname: &str, conf: &Value) -> Outcome {
        PluginRun::new(self.n.path("bin").join(plugin), verb)
            .attachment(cid, pod, ifname, &self.cni_path())
            .env("PLEXUS_POLICY", self.n.policy.to_str().unwrap())
            .stdin(conf)
            .in_netns(&self.n.lab.node)
            .run()
    }

    fn ok(&self, what: &str, out: Outcome) -> Value {
        assert!(out.success(), "{what}: {}", out.stdout);
        serde_json::from_str(&out.stdout).unwrap_or(Value::Null)
    }
}

/// `conf` with `prevResult` (CHECK's and DEL's) and the GC's valid attachments.
fn with(conf: &Value, key: &str, v: Value) -> Value {
    let mut c = conf.clone();
    c[key] = v;
    c
}

/// A plexus-macvlan network on nic0 with plexus-ipam on `store` (its `ipam` keys), version 1.1.0
/// (CHECK and GC).
fn macvlan(store: Value) -> Value {
    let mut ipam = json!({"type": "plexus-ipam", "range": "198.18.90.0/24"});
    ipam.as_object_mut().unwrap().extend(store.as_object().unwrap().clone());
    json!({"cniVersion": "1.1.0", "name": "rail0", "type": "plexus-macvlan", "master": "nic0", "ipam": ipam})
}

#[test]
fn a_macvlan_and_its_address_either_release_made_are_checked_collected_and_deleted_by_the_other() {
    let s = Skew::new();
    let etcd = s.n.etcd_store();
    let held_etcd = || etcd.keys("/plexus-test/default/ips/").len();
    let held_file = || s.n.held();
    let pod = s.n.lab.pod.path();
    let stores: [(&str, Value, &dyn Fn() -> usize); 2] =
        [("file", json!({"dataDir": s.n.ipam}), &held_file), ("etcd", json!({"store": "fabric"}), &held_etcd)];
    for (store, keys, held) in stores {
        let conf = macvlan(keys);
        for (adds, then) in [(Previous, This), (This, Previous)] {
            let how = format!("{store}: {adds:?} adds, {then:?} checks, collects and deletes");
            s.install(adds, &[]);
            let result = s.ok(&how, s.run("plexus-macvlan", "ADD", "c1", &pod, "net1", &conf));
            assert_eq!(s.n.lab.pod.addrs("net1").len(), 1, "{how}");
            s.install(then, &[]);
            let c = with(&conf, "prevResult", result);
            s.ok(&how, s.run("plexus-macvlan", "CHECK", "c1", &pod, "net1", &c));
            let valid = json!([{"containerID": "c1", "ifname": "net1"}]);
            s.ok(&how, s.run("plexus-macvlan", "GC", "", &pod, "", &with(&conf, "cni.dev/valid-attachments", valid)));
            assert_eq!(held(), 1, "{how}: a valid attachment is kept");
            s.ok(&how, s.run("plexus-macvlan", "DEL", "c1", &pod, "net1", &c));
            assert_eq!((s.n.pod_links(), held()), (vec!["lo".to_string()], 0), "{how}");
            // And back: the first release's DEL of what is gone succeeds.
            s.install(adds, &[]);
            s.ok(&how, s.run("plexus-macvlan", "DEL", "c1", &pod, "net1", &c));
            // A stale address one made, the other's GC releases.
            s.ok(&how, s.run("plexus-ipam", "ADD", "stale", &pod, "net1", &conf));
            s.install(then, &[]);
            s.ok(&how, s.run("plexus-ipam", "GC", "", &pod, "", &with(&conf, "cni.dev/valid-attachments", json!([]))));
            assert_eq!(held(), 0, "{how}: GC released the stale attachment");
        }
    }
}

#[test]
fn both_releases_allocating_from_one_pool_at_once_never_hold_an_address_twice() {
    let s = Skew::new();
    let etcd = s.n.etcd_store();
    // Each release in a directory of its own, both at once on one store.
    for (release, dir) in [(Previous, "bin-previous"), (This, "bin-this")] {
        std::fs::create_dir_all(s.n.path(dir)).unwrap();
        std::fs::copy(release.bin("plexus-ipam"), s.n.path(dir).join("plexus-ipam")).unwrap();
    }
    let pod = s.n.lab.pod.path();
    for (store, keys) in [("file", json!({"dataDir": s.n.ipam})), ("etcd", json!({"store": "fabric"}))] {
        let mut conf = macvlan(keys)["ipam"].clone();
        conf = json!({"cniVersion": "1.1.0", "name": "rail0", "ipam": conf});
        let run = |dir: &str, verb: &str, cid: &str| {
            PluginRun::new(s.n.path(dir).join("plexus-ipam"), verb)
                .attachment(cid, &pod, "net1", &s.n.path(dir).display().to_string())
                .env("PLEXUS_POLICY", s.n.policy.to_str().unwrap())
                .stdin(&conf)
                .in_netns(&s.n.lab.node)
                .run()
        };
        let addresses: Vec<String> = std::thread::scope(|sc| {
            let workers: Vec<_> = ["bin-previous", "bin-this"]
                .into_iter()
                .map(|dir| {
                    let run = &run;
                    sc.spawn(move || {
                        (0..16)
                            .map(|i| {
                                let out = run(dir, "ADD", &format!("{dir}-{i}"));
                                assert!(out.success(), "{store} {dir} ADD {i}: {}", out.stdout);
                                out.result()["ips"][0]["address"].as_str().unwrap().to_string()
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            workers.into_iter().flat_map(|w| w.join().unwrap()).collect()
        });
        let distinct: std::collections::BTreeSet<&String> = addresses.iter().collect();
        assert_eq!(distinct.len(), 32, "{store}: an address held twice: {addresses:?}");
        // Each release releases what the other allocated.
        for i in 0..16 {
            assert!(run("bin-this", "DEL", &format!("bin-previous-{i}")).success());
            assert!(run("bin-previous", "DEL", &format!("bin-this-{i}")).success());
        }
        let held = if store == "file" { s.n.held() } else { etcd.keys("/plexus-test/default/ips/").len() };
        assert_eq!(held, 0, "{store}: everything released");
        // Both churning at once, as during a rolling change of binaries: a store's domain (and a
        // tenant's directory) goes when its last attachment does and comes back with the next,
        // under the other release's feet; no ADD or DEL of either may fail on it.
        std::thread::scope(|sc| {
            for dir in ["bin-previous", "bin-this"] {
                let run = &run;
                sc.spawn(move || {
                    for i in 0..30 {
                        let cid = format!("churn-{dir}-{i}");
                        let out = run(dir, "ADD", &cid);
                        assert!(out.success(), "{store} {dir} ADD {i} beside the other release: {}", out.stdout);
                        let out = run(dir, "DEL", &cid);
                        assert!(out.success(), "{store} {dir} DEL {i} beside the other release: {}", out.stdout);
                    }
                });
            }
        });
    }
}

#[test]
fn a_device_either_release_moved_comes_back_with_its_name_mtu_alias_and_addresses_whoever_deletes_it() {
    let s = Skew::new();
    let node = &s.n.lab.node;
    node.ip(&["addr", "add", "198.18.91.1/24", "dev", "nic1"]);
    node.ip(&["link", "set", "nic1", "alias", "uplink-b"]);
    let state = DataDir::new("hd-state");
    let conf = json!({"cniVersion": "1.1.0", "name": "port", "type": "plexus-host-device", "device": "nic1",
                      "dataDir": state});
    let pod = s.n.lab.pod.path();
    let settled = || {
        let link = node.link("nic1").expect("nic1 is back on the node");
        let addrs: Vec<String> = node.addrs("nic1").iter().map(|a| a.cidr()).collect();
        (link.mtu, link.ifalias.clone().unwrap_or_default(), addrs)
    };
    let before = settled();
    assert_eq!(before, (9000, "uplink-b".to_string(), vec!["198.18.91.1/24".to_string()]));
    for (moves, returns) in [(Previous, This), (This, Previous)] {
        let how = format!("{moves:?} moves, {returns:?} returns");
        s.install(moves, &[]);
        let result = s.ok(&how, s.run("plexus-host-device", "ADD", "c1", &pod, "net1", &conf));
        assert!(node.link("nic1").is_none() && s.n.pod_links().contains(&"net1".to_string()), "{how}");
        s.install(returns, &[]);
        let c = with(&conf, "prevResult", result);
        s.ok(&how, s.run("plexus-host-device", "CHECK", "c1", &pod, "net1", &c));
        s.ok(&how, s.run("plexus-host-device", "DEL", "c1", &pod, "net1", &c));
        assert_eq!(settled(), before, "{how}: its settings back");
        assert_eq!(s.n.pod_links(), ["lo"], "{how}");
        assert_eq!(std::fs::read_dir(state.path()).map(|d| d.count()).unwrap_or(0), 0, "{how}: no state file left");
        // The first release's DEL of what is back already: nothing to do, and nothing changed.
        s.install(moves, &[]);
        s.ok(&how, s.run("plexus-host-device", "DEL", "c1", &pod, "net1", &c));
        assert_eq!(settled(), before, "{how}");
    }
}

/// The meta config (nadDir, a cache directory) over NADs `rail0` (plexus-macvlan on nic0, an
/// address from the file store) and `rail1` (plexus-macvlan on nic1, L2).
fn meta_over_two_nads(s: &Skew) -> Value {
    s.n.macvlan_nad("rail0", "nic0", "198.18.92.0/24", json!({}));
    s.n.nad("rail1", &json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic1"}));
    json!({"cniVersion": "1.1.0", "name": "plexus", "type": "plexus", "nadDir": s.n.path("nads"),
           "networks": "rail0,rail1", "cniDir": s.n.path("cache"), "binDir": s.n.path("bin")})
}

#[test]
fn a_pod_the_meta_plugin_of_either_release_attached_is_checked_and_deleted_by_the_other_and_by_a_mix() {
    let s = Skew::new();
    let meta = meta_over_two_nads(&s);
    let pod = s.n.lab.pod.path();
    let attached = || {
        let mut links = s.n.pod_links();
        links.sort();
        (links, s.n.held())
    };
    let whole = (vec!["lo".to_string(), "net1".to_string(), "net2".to_string()], 1);
    let none = (vec!["lo".to_string()], 0);
    // Whole releases after each other, and the rollout's moment when the meta-plugin is one
    // release's and its delegates the other's.
    let cases = [
        ("upgrade", Previous, This, &[][..]),
        ("rollback", This, Previous, &[][..]),
        ("meta-plugin replaced first", Previous, This, &["plexus"][..]),
        ("delegates replaced first", Previous, This, &["plexus-macvlan", "plexus-ipam"][..]),
    ];
    for (how, first, then, then_only) in cases {
        s.install(first, &[]);
        s.ok(how, s.run("plexus", "ADD", "pod1", &pod, "eth0", &meta));
        assert_eq!(attached(), whole, "{how}");
        s.install(then, then_only);
        s.ok(how, s.run("plexus", "CHECK", "pod1", &pod, "eth0", &meta));
        s.ok(how, s.run("plexus", "DEL", "pod1", &pod, "eth0", &meta));
        assert_eq!(attached(), none, "{how}");
        assert_eq!(std::fs::read_dir(s.n.path("cache")).map(|d| d.count()).unwrap_or(0), 0, "{how}: cache gone");
        s.ok(how, s.run("plexus", "DEL", "pod1", &pod, "eth0", &meta));
    }
}

#[test]
fn a_network_status_either_releases_daemon_journaled_is_written_by_the_others() {
    let s = Skew::new();
    let api = plexus_tests::fake_api::FakeApi::start_in(&s.n.lab.node);
    let kubeconfig = s.n.path("kubeconfig");
    api.write_kubeconfig(&kubeconfig, true);
    let rail0 = json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic0",
                       "ipam": {"type": "plexus-ipam", "range": "198.18.93.0/24", "dataDir": s.n.ipam}});
    api.add_nad("default", "rail0", &rail0, json!({}));
    api.add_pod("default", "trainer", "uid-trainer", json!({"k8s.v1.cni.cncf.io/networks": "rail0"}));
    std::fs::create_dir_all(s.n.path("run")).unwrap();
    let socket = s.n.path("run/daemon.sock");
    let journal = s.n.path("run/network-status");
    let meta = json!({"cniVersion": "1.1.0", "name": "plexus", "type": "plexus", "kubeconfig": kubeconfig,
                      "cniDir": s.n.path("cache"), "binDir": s.n.path("bin"), "daemonSocket": socket});
    let args = ["--kubeconfig", kubeconfig.to_str().unwrap(), "--node-name", "node-a", "--api-timeout", "0.5"];
    let daemon = |release: Release| {
        let log = s.n.path(&format!("daemon-{release:?}.log"));
        DaemonProcess::start_binary(&s.n.path("bin/plexus-daemon"), &s.n.lab.node.path(), &socket, &log, &args, &[])
    };
    let trainer = |verb: &str| {
        PluginRun::new(s.n.path("bin/plexus"), verb)
            .attachment("pod1", &s.n.lab.pod.path(), "eth0", &s.cni_path())
            .env("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=trainer;K8S_POD_UID=uid-trainer")
            .env("PLEXUS_POLICY", s.n.policy.to_str().unwrap())
            .stdin(&meta)
            .in_netns(&s.n.lab.node)
            .run()
    };
    let status = || {
        let pod = api.pod("default", "trainer")?;
        pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"].as_str().map(String::from)
    };
    for (journals, writes) in [(Previous, This), (This, Previous)] {
        let how = format!("{journals:?} journals, {writes:?} writes");
        api.remove_pod("default", "trainer");
        api.add_pod("default", "trainer", "uid-trainer", json!({"k8s.v1.cni.cncf.io/networks": "rail0"}));
        s.install(journals, &[]);
        let mut first = daemon(journals);
        // The API server takes no network-status PATCH while the first daemon runs.
        api.refuse_status_patches("trainer");
        s.ok(&how, trainer("ADD"));
        assert_eq!(std::fs::read_dir(&journal).unwrap().count(), 1, "{how}: journaled");
        first.kill();
        api.clear_faults();
        assert!(status().is_none(), "{how}");
        s.install(writes, &[]);
        let _second = daemon(writes);
        let deadline = Instant::now() + Duration::from_secs(10);
        while status().is_none() || std::fs::read_dir(&journal).map(|d| d.count()).unwrap_or(0) > 0 {
            assert!(Instant::now() < deadline, "{how}: the journaled status was not written");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(status().unwrap().contains("198.18.93."), "{how}: {:?}", status());
        s.ok(&how, trainer("DEL"));
        assert_eq!((s.n.pod_links(), s.n.held()), (vec!["lo".to_string()], 0), "{how}");
    }
}
