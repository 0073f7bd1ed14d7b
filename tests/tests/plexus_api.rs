//! The plexus meta-plugin against a fake Kubernetes API server (HTTPS, CA and bearer token from a
//! generated kubeconfig): selection from the pod annotation, NADs from the API, network-status
//! PATCH, DEL with the API or the cache gone, rollback, timeouts, namespace isolation.

use std::time::{Duration, Instant};

use plexus_tests::fake_api::{FakeApi, Fault};
use plexus_tests::{DataDir, Lab, Outcome, PluginRun, REFERENCE_CNI_DIR, plugin_bin};
use serde_json::{Value, json};

const POD_ARGS: &str =
    "IgnoreUnknown=1;K8S_POD_NAMESPACE=ml;K8S_POD_NAME=trainer-0;K8S_POD_UID=uid-1;K8S_POD_INFRA_CONTAINER_ID=pod1";

struct Cluster {
    lab: Lab,
    api: FakeApi,
    dir: tempfile::TempDir,
    ipam: DataDir,
}

fn bin_dir() -> String {
    plugin_bin("plexus").parent().unwrap().display().to_string()
}

impl Cluster {
    fn new(annotation: &str) -> Cluster {
        let lab = Lab::new();
        lab.add_nic("nic0", 9000);
        lab.add_nic("nic1", 9000);
        let api = FakeApi::start_in(&lab.node);
        let c = Cluster { lab, api, dir: tempfile::tempdir().unwrap(), ipam: DataDir::new("ipam") };
        let ipam = |range: &str| json!({"type": "plexus-ipam", "range": range, "dataDir": c.ipam_dir()});
        c.api.add_nad(
            "ml",
            "rail0",
            &json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic0", "ipam": ipam("198.18.30.0/24")}),
            json!({}),
        );
        c.api.add_nad(
            "ml",
            "rail1",
            &json!({"cniVersion": "1.0.0", "plugins": [{"type": "plexus-macvlan", "master": "nic1", "ipam": ipam("198.18.31.0/24")},
                                                      {"type": "tuning", "promisc": true}]}),
            json!({}),
        );
        c.api.add_pod("ml", "trainer-0", "uid-1", json!({"k8s.v1.cni.cncf.io/networks": annotation}));
        c
    }

    fn ipam_dir(&self) -> String {
        self.ipam.path().display().to_string()
    }

    fn conf(&self) -> Value {
        json!({"cniVersion": "1.1.0", "name": "plexus", "type": "plexus", "kubeconfig": self.api.kubeconfig(),
               "cniDir": self.dir.path().join("cache"), "binDir": bin_dir(), "apiTimeout": 1.0})
    }

    /// [`Cluster::conf`] with a kubeconfig that reads its token from the API's token file.
    fn token_file_conf(&self) -> Value {
        let kc = self.dir.path().join("kubeconfig-tokenfile");
        self.api.write_kubeconfig(&kc, true);
        let mut conf = self.conf();
        conf["kubeconfig"] = json!(kc);
        conf
    }

    fn run(&self, verb: &str, c: &Value) -> Outcome {
        PluginRun::new(plugin_bin("plexus"), verb)
            .attachment("pod1", &self.lab.pod.path(), "eth0", &format!("{}:{REFERENCE_CNI_DIR}", bin_dir()))
            .env("CNI_ARGS", POD_ARGS)
            .stdin(c)
            .in_netns(&self.lab.node)
            .run()
    }

    fn held(&self) -> usize {
        std::fs::read_dir(self.ipam.path().join("default/ips")).map(|d| d.count()).unwrap_or(0)
    }

    fn pod_links(&self) -> Vec<String> {
        self.lab.pod.links().into_iter().map(|l| l.ifname).collect()
    }

    /// The events recorded about pod ml/trainer-0 (of its UID), as `type reason: note`, sorted
    /// (they are written at once).
    fn told(&self) -> Vec<String> {
        let mut told: Vec<String> = self
            .api
            .events()
            .iter()
            .map(|e| {
                assert_eq!(
                    (e["regarding"]["kind"].as_str(), e["regarding"]["name"].as_str(), e["regarding"]["uid"].as_str()),
                    (Some("Pod"), Some("trainer-0"), Some("uid-1")),
                    "{e}"
                );
                assert_eq!(
                    (e["reportingController"].as_str(), e["metadata"]["namespace"].as_str()),
                    (Some("plexus"), Some("ml"))
                );
                format!(
                    "{} {}: {}",
                    e["type"].as_str().unwrap(),
                    e["reason"].as_str().unwrap(),
                    e["note"].as_str().unwrap()
                )
            })
            .collect();
        told.sort();
        told
    }
}

#[test]
fn the_pod_annotation_attaches_two_networks_and_network_status_is_patched() {
    let c = Cluster::new(r#"[{"name":"rail0"},{"name":"rail1","namespace":"ml","interface":"roce1"}]"#);
    let r = c.run("ADD", &c.conf()).result();
    let names: Vec<&str> = r["interfaces"].as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["net1", "roce1"]);
    assert_eq!(c.lab.pod.addrs("net1")[0].cidr(), "198.18.30.1/24");
    assert_eq!(c.lab.pod.addrs("roce1")[0].cidr(), "198.18.31.1/24");
    let patches = c.api.patches();
    assert_eq!(patches.len(), 1, "{patches:?}");
    assert_eq!(patches[0].0, "/api/v1/namespaces/ml/pods/trainer-0");
    assert_eq!(patches[0].1["metadata"]["uid"], "uid-1", "the PATCH names the pod the runtime named");
    let text = patches[0].1["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"].as_str().unwrap();
    let status: Value = serde_json::from_str(text).unwrap();
    let mac0 = c.lab.pod.link("net1").unwrap().address;
    assert_eq!(
        status[0],
        json!({"name": "ml/rail0", "interface": "net1", "ips": ["198.18.30.1"], "mac": mac0, "mtu": 9000})
    );
    assert_eq!(status[1]["name"], "ml/rail1");
    assert_eq!(status[1]["interface"], "roce1");
    assert_eq!(status[1]["ips"], json!(["198.18.31.1"]));
    // The fake applied the merge patch: the pod carries the annotation now.
    let pod = c.api.pod("ml", "trainer-0").unwrap();
    assert_eq!(pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"], text);
    assert_eq!(
        pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"],
        r#"[{"name":"rail0"},{"name":"rail1","namespace":"ml","interface":"roce1"}]"#,
        "the merge patch keeps the other annotations"
    );
    // The pod is told, as Multus tells it: one AddedInterface per interface.
    assert_eq!(
        c.told(),
        [
            "Normal AddedInterface: Add net1 [198.18.30.1/24] from ml/rail0",
            "Normal AddedInterface: Add roce1 [198.18.31.1/24] from ml/rail1"
        ]
    );
    assert!(c.run("DEL", &c.conf()).success());
    assert_eq!((c.pod_links(), c.held()), (vec!["lo".to_string()], 0));
    assert_eq!(c.told().len(), 2, "a DEL that released everything says nothing");
}

#[test]
fn del_uses_the_cache_when_the_api_is_down_and_the_api_when_the_cache_is_gone_or_corrupt() {
    let c = Cluster::new("rail0,rail1");
    let conf = c.conf();
    // API down (every request fails after the ADD): the cache carries DEL.
    assert!(c.run("ADD", &conf).success());
    c.api.fault(Fault { method: "GET", path_contains: "/".into(), status: Some(500), delay: None, times: usize::MAX });
    assert!(c.run("DEL", &conf).success());
    assert_eq!((c.pod_links(), c.held()), (vec!["lo".to_string()], 0));
    c.api.clear_faults();
    // Cache removed: rebuilt from the pod annotation and the NADs.
    assert!(c.run("ADD", &conf).success());
    std::fs::remove_file(c.dir.path().join("cache/pod1")).unwrap();
    assert!(c.run("DEL", &conf).success());
    assert_eq!((c.pod_links(), c.held()), (vec!["lo".to_string()], 0));
    // Cache corrupt: the API, not a silent no-op.
    assert!(c.run("ADD", &conf).success());
    std::fs::write(c.dir.path().join("cache/pod1"), b"\x00garbage").unwrap();
    assert!(c.run("DEL", &conf).success());
    assert_eq!((c.pod_links(), c.held()), (vec!["lo".to_string()], 0));
    // Both gone: DEL still succeeds (and does not hang).
    c.api.remove_pod("ml", "trainer-0");
    let t = Instant::now();
    assert!(c.run("DEL", &conf).success());
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_failing_second_delegate_rolls_back_the_first_and_no_status_is_written() {
    let c = Cluster::new("rail0,broken");
    c.api.add_nad(
        "ml",
        "broken",
        &json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "gone0"}),
        json!({}),
    );
    let (code, msg, _) = c.run("ADD", &c.conf()).error();
    assert_eq!(code, 7);
    assert!(msg.contains("[ml/trainer-0] adding network ml/broken (net2)"), "{msg}");
    assert_eq!((c.pod_links(), c.held()), (vec!["lo".to_string()], 0));
    assert!(c.api.patches().is_empty());
    let told = c.told();
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(
        told[0].starts_with("Warning FailedAddInterface: [ml/trainer-0] adding network ml/broken (net2)"),
        "{told:?}"
    );
}

#[test]
fn a_del_that_cannot_release_an_attachment_warns_the_pod_naming_the_network() {
    let c = Cluster::new("rail0,stuck");
    c.api.add_nad(
        "ml",
        "stuck",
        &json!({"cniVersion": "1.0.0", "type": "plexus-test-plugin", "panicOn": "DEL"}),
        json!({}),
    );
    assert!(c.run("ADD", &c.conf()).success());
    let (code, msg, _) = c.run("DEL", &c.conf()).error();
    assert_eq!(code, 999, "{msg}");
    let told = c.told();
    assert_eq!(told.len(), 3, "{told:?}");
    assert!(told[2].starts_with("Warning FailedDeleteInterface: DEL failed for 1 attachment(s)"), "{told:?}");
    assert!(told[2].contains("ml/stuck"), "{told:?}");
    assert_eq!(c.pod_links(), ["lo"], "the attachment that could be released was");
}

#[test]
fn a_slow_or_failing_api_is_code_11_within_the_deadline() {
    let c = Cluster::new("rail0");
    c.api.fault(Fault {
        method: "GET",
        path_contains: "/pods/".into(),
        status: None,
        delay: Some(Duration::from_secs(4)),
        times: 1,
    });
    let t = Instant::now();
    let (code, msg, _) = c.run("ADD", &c.conf()).error();
    assert_eq!(code, 11, "{msg}");
    assert!(msg.contains("no answer within 1s"), "{msg}");
    assert!(t.elapsed() < Duration::from_secs(3), "took {:?}", t.elapsed());
    assert_eq!(c.pod_links(), ["lo"]);
    c.api.clear_faults();
    c.api.fault(Fault {
        method: "GET",
        path_contains: "/network-attachment-definitions/".into(),
        status: Some(500),
        delay: None,
        times: usize::MAX,
    });
    let (code, msg, _) = c.run("ADD", &c.conf()).error();
    assert_eq!(code, 11, "{msg}");
    assert!(msg.contains("after 3 attempts"), "{msg}");
    // A transient 500 is retried and the ADD succeeds.
    c.api.clear_faults();
    c.api.fault(Fault { method: "GET", path_contains: "/pods/".into(), status: Some(500), delay: None, times: 1 });
    assert!(c.run("ADD", &c.conf()).success());
}

#[test]
fn network_status_for_a_pod_that_is_gone_is_not_an_error_but_a_conflict_is() {
    let c = Cluster::new("rail0");
    c.api.fault(Fault { method: "PATCH", path_contains: "/pods/".into(), status: Some(404), delay: None, times: 1 });
    assert!(c.run("ADD", &c.conf()).success());
    assert!(c.run("DEL", &c.conf()).success());
    c.api.fault(Fault { method: "PATCH", path_contains: "/pods/".into(), status: Some(409), delay: None, times: 1 });
    let (code, msg, _) = c.run("ADD", &c.conf()).error();
    assert_eq!(code, 11, "{msg}");
    assert!(msg.starts_with("set network-status"), "{msg}");
    assert_eq!((c.pod_links(), c.held()), (vec!["lo".to_string()], 0), "rolled back");
}

#[test]
fn namespace_isolation_and_missing_nads_are_refused_by_name() {
    let c = Cluster::new("other/rail0");
    let mut conf = c.conf();
    conf["namespaceIsolation"] = json!(true);
    let (code, msg, _) = c.run("ADD", &conf).error();
    assert_eq!(code, 7);
    assert!(
        msg.starts_with("namespace isolation: pod ml/trainer-0 may not use network-attachment-definition other/rail0"),
        "{msg}"
    );
    conf["globalNamespaces"] = json!("other");
    let (code, msg, _) = c.run("ADD", &conf).error();
    assert_eq!((code, msg.as_str()), (7, "cannot find a network-attachment-definition (rail0) in namespace (other)"));
    // Each refusal told to the pod.
    let told = c.told();
    assert_eq!(told.len(), 2, "{told:?}");
    assert_eq!(
        told[0],
        "Warning FailedAddInterface: cannot find a network-attachment-definition (rail0) in namespace (other)"
    );
    assert!(told[1].starts_with("Warning FailedAddInterface: namespace isolation: pod ml/trainer-0"), "{told:?}");
}

#[test]
fn a_rotated_token_in_a_token_file_is_picked_up_by_the_next_call() {
    let mut c = Cluster::new("rail0");
    let conf = c.token_file_conf();
    assert!(c.run("ADD", &conf).success());
    assert!(c.run("DEL", &conf).success());
    c.api.rotate_token("rotated-token");
    assert!(c.run("ADD", &conf).success(), "the new token is read on the next invocation");
    assert_eq!(c.api.patches().len(), 2, "both ADDs wrote network-status with their token");
}

/// When plexus's DaemonSet rolls, the token file holds the deleted pod's token, void, until the
/// next pod's installer replaces it: an ADD meanwhile waits for it instead of failing (the
/// rollout test on a real node saw one such ADD fail with 401).
#[test]
fn a_token_void_until_the_installer_replaces_it_is_waited_for_and_the_add_succeeds() {
    let mut c = Cluster::new("rail0");
    let conf = c.token_file_conf();
    c.api.revoke_token("next-pods-token");
    let token_file = c.api.token_file();
    let installer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        let temp = token_file.with_extension("new");
        std::fs::write(&temp, "next-pods-token").unwrap();
        std::fs::rename(&temp, &token_file).unwrap();
    });
    let started = Instant::now();
    let add = c.run("ADD", &conf);
    installer.join().unwrap();
    assert!(add.success(), "{add:?}");
    assert!(started.elapsed() >= Duration::from_millis(1500), "it waited for the new token");
    assert_eq!(c.held(), 1);
    assert!(c.run("DEL", &conf).success());
    assert_eq!(c.held(), 0);
    // A token nobody replaces: code 11 after the wait, naming the 401 and the file, nothing left.
    c.api.revoke_token("never-written");
    let started = Instant::now();
    let (code, msg, _) = c.run("ADD", &conf).error();
    let waited = started.elapsed();
    assert_eq!(code, 11, "{msg}");
    assert!(msg.contains("401") && msg.contains("was not replaced within 20s"), "{msg}");
    assert!(msg.contains(&c.api.token_file().display().to_string()), "{msg}");
    assert!(waited >= Duration::from_secs(20) && waited < Duration::from_secs(40), "{waited:?}");
    assert_eq!((c.held(), c.pod_links()), (0, vec!["lo".to_string()]));
}

#[test]
fn the_default_network_annotation_replaces_the_cluster_network_for_that_pod() {
    let c = Cluster::new("rail1");
    // The cluster network is kube-system/cluster (nic0); the pod asks for kube-system/alt (nic1)
    // as its default network.
    let ipam = |range: &str| json!({"type": "plexus-ipam", "range": range, "dataDir": c.ipam_dir()});
    c.api.add_nad(
        "kube-system",
        "cluster",
        &json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic0", "ipam": ipam("198.18.32.0/24")}),
        json!({}),
    );
    c.api.add_nad(
        "kube-system",
        "alt",
        &json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic1", "ipam": ipam("198.18.33.0/24")}),
        json!({}),
    );
    c.api.add_pod(
        "ml",
        "trainer-0",
        "uid-1",
        json!({"k8s.v1.cni.cncf.io/networks": "rail0", "v1.multus-cni.io/default-network": "alt"}),
    );
    let mut conf = c.conf();
    conf["clusterNetwork"] = json!("cluster");
    let r = c.run("ADD", &conf).result();
    assert_eq!(r["ips"][0]["address"], "198.18.33.1/24", "the runtime gets the replacement's result");
    assert_eq!(c.lab.pod.addrs("eth0")[0].cidr(), "198.18.33.1/24");
    assert_eq!(c.lab.pod.addrs("net1")[0].cidr(), "198.18.30.1/24");
    let text = c.api.patches()[0].1["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"].clone();
    let status: Value = serde_json::from_str(text.as_str().unwrap()).unwrap();
    assert_eq!((status[0]["name"].as_str(), status[0]["default"].as_bool()), (Some("kube-system/alt"), Some(true)));
    assert!(c.run("DEL", &conf).success());
    assert_eq!((c.pod_links(), c.held()), (vec!["lo".to_string()], 0));
    // Two networks in it: refused, naming the annotation.
    c.api.add_pod("ml", "trainer-0", "uid-1", json!({"v1.multus-cni.io/default-network": "alt,cluster"}));
    let (code, msg, _) = c.run("ADD", &conf).error();
    assert_eq!(code, 7);
    assert!(msg.contains("more than one default network is specified: alt,cluster"), "{msg}");
    assert_eq!(c.pod_links(), ["lo"]);
}
