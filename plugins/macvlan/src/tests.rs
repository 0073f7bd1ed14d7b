//! plexus-macvlan's steps on the recording fake kernel (`plexus_net::fake`): what ADD and DEL
//! send, in which order, and what ADD undoes when any one step fails. No root and no kernel here:
//! the IPAM delegate is a real process (a script), the kernel a fake; `tests/tests/macvlan.rs`
//! runs the same code on real namespaces.

use std::path::Path;

use plexus_net::fake::{FakeKernel, FakeNamespace, FakeSocket};
use plexus_node::policy::Policy;
use plexus_plugin::testing;
use serde_json::{Value, json};

use super::*;

/// A node with a RoCE port and an empty pod, on the fake kernel.
struct Rig {
    kernel: FakeKernel,
    node: FakeSocket,
    pod_sock: FakeSocket,
    pod: Netns,
    master: Link,
    dir: tempfile::TempDir,
}

impl Rig {
    fn new() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let pod_path = dir.path().join("pod");
        std::fs::write(&pod_path, "").unwrap();
        let kernel = FakeKernel::new();
        let node = kernel.namespace("node", &dir.path().join("node"));
        let pod_sock = kernel.namespace("pod", &pod_path);
        let master = kernel.add_link(&node, "ens1f0np0", "veth", 9000);
        testing::fake_ipam(dir.path(), "198.18.0.5/24", "198.18.0.1");
        Rig { kernel, node, pod_sock, pod: Netns::open(&pod_path).unwrap(), master, dir }
    }

    fn request(&self, command: &str, config: &Value) -> Request {
        let pod = self.pod.path().display().to_string();
        let bin = self.dir.path().display().to_string();
        let vars = [
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", pod.as_str()),
            ("CNI_IFNAME", "net1"),
            ("CNI_PATH", bin.as_str()),
        ];
        testing::request(&vars, config, Policy::default())
    }

    fn add(&self, config: &Value) -> Result<CniResult, Error> {
        let req = self.request("ADD", config);
        let conf = MacvlanConf::load(&req)?;
        let spec = conf.new_macvlan(&self.master, None, &self.pod)?;
        let add = Add {
            req: &req,
            conf: &conf,
            pod: &self.pod,
            master_sock: &self.node,
            pod_sock: &self.pod_sock,
            master: &self.master,
            device_info: None,
            gid_wait: Duration::ZERO,
        };
        configure::runtime()?.block_on(add.run(&spec))
    }

    fn del(&self, config: &Value) -> Result<(), Error> {
        let req = self.request("DEL", config);
        let conf = MacvlanConf::load(&req)?;
        configure::runtime()?.block_on(remove_attachment(&self.pod_sock, &conf, &req.env))
    }

    fn ipam_calls(&self) -> Vec<String> {
        testing::ipam_calls(self.dir.path())
    }

    fn pod_state(&self) -> FakeNamespace {
        self.kernel.snapshot().into_iter().find(|n| n.name == "pod").unwrap()
    }
}

fn config(extra: Value) -> Value {
    let mut c = json!({"cniVersion": "1.0.0", "name": "roce", "type": "plexus-macvlan", "master": "ens1f0np0",
        "ipam": {"type": "fake-ipam"}});
    c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    c
}

#[test]
fn add_creates_in_the_pod_under_a_temporary_name_then_renames_addresses_ups_and_routes_in_that_order() {
    let rig = Rig::new();
    let result = rig.add(&config(json!({}))).unwrap();
    let temp = own_temp_name(&rig.request("ADD", &config(json!({}))).env);
    let pod = rig.pod.path().display().to_string();
    let index = rig.pod_state().links[0].index;
    assert_eq!(
        rig.kernel.log(),
        vec![
            format!("node: add macvlan {temp} on #{} mode bridge netns {pod}", rig.master.index),
            format!("pod: get link {temp}"),
            format!("pod: set link #{index} name net1 ipv4-conf"),
            format!("pod: add address 198.18.0.5/24 to #{index} nodad"),
            format!("pod: set link #{index} up"),
            "pod: add route 198.19.0.0/16 table 254".to_string(),
        ]
    );
    let state = rig.pod_state();
    let link = &state.links[0];
    assert_eq!((link.name.as_str(), link.mtu, link.parent, link.up), ("net1", 9000, Some(rig.master.index), true));
    assert_eq!(state.routes[0].gw.map(|g| g.to_string()).as_deref(), Some("198.18.0.1"), "the IPAM gateway");
    assert_eq!(rig.ipam_calls(), vec!["ADD c1 net1"]);
    assert_eq!(result.ips[0].address.to_string(), "198.18.0.5/24");
    assert_eq!((result.interfaces[0].name.as_str(), result.ips[0].interface), ("net1", Some(0)));
}

#[test]
fn multi_rail_puts_the_routes_in_the_rails_table_with_a_source_rule() {
    let rig = Rig::new();
    rig.add(&config(json!({"multiRail": true}))).unwrap();
    let log = rig.kernel.log();
    let tail: Vec<&str> = log.iter().skip(4).map(String::as_str).collect();
    assert_eq!(
        tail[1..],
        [
            "pod: add route 198.18.0.0/24 table 101",
            "pod: add route 198.19.0.0/16 table 101",
            "pod: add rule from 198.18.0.5/32 lookup 101",
        ]
    );
    assert_eq!(rig.pod_state().rules.len(), 1);
}

/// Every step of a successful ADD made to fail in turn: the ADD fails with that step's error and
/// node, pod and IPAM are left as they were.
fn every_failed_step_is_undone(extra: Value) -> usize {
    let steps = {
        let rig = Rig::new();
        rig.add(&config(extra.clone())).unwrap();
        rig.kernel.verbs()
    };
    for k in 1..=steps {
        let rig = Rig::new();
        let before = rig.kernel.snapshot();
        rig.kernel.fail_at(k);
        let err = rig.add(&config(extra.clone())).expect_err(&format!("step {k} fails the ADD"));
        let failed = rig.kernel.log()[k - 1].clone();
        assert!(err.details.is_empty() || !err.details.contains("rollback failed"), "step {k}: {err:?}");
        assert!(err.msg.contains("Input/output error"), "step {k} ({failed}): the cause is reported: {err:?}");
        assert_eq!(rig.kernel.snapshot(), before, "step {k} ({failed}) left something: {:?}", rig.kernel.log());
        let calls = rig.ipam_calls();
        assert_eq!(calls, vec!["ADD c1 net1", "DEL c1 net1"], "step {k} ({failed}): the address is released");
    }
    steps
}

#[test]
fn a_failure_at_any_step_of_add_leaves_node_pod_and_ipam_as_before() {
    assert_eq!(every_failed_step_is_undone(json!({})), 6);
}

#[test]
fn a_failure_at_any_step_of_a_multi_rail_add_also_removes_its_rules() {
    assert_eq!(every_failed_step_is_undone(json!({"multiRail": true})), 8);
}

#[test]
fn an_undo_that_fails_is_reported_and_the_others_still_run() {
    let rig = Rig::new();
    // Step 3 is the rename; step 4, the first undo, deletes the macvlan.
    rig.kernel.fail_at(3);
    rig.kernel.fail_at(4);
    let err = rig.add(&config(json!({}))).unwrap_err();
    assert!(err.msg.starts_with("rename plx"), "{err:?}");
    assert!(err.details.contains("rollback failed: delete macvlan plx"), "{err:?}");
    assert_eq!(rig.ipam_calls(), vec!["ADD c1 net1", "DEL c1 net1"], "IPAM is released all the same");
}

#[test]
fn a_name_taken_in_the_pod_fails_as_the_spec_says_and_the_pods_own_link_stays() {
    let rig = Rig::new();
    let own = rig.kernel.add_link(&rig.pod_sock, "net1", "veth", 1500);
    let err = rig.add(&config(json!({}))).unwrap_err();
    assert_eq!(err.code, code::IFNAME_TAKEN, "{err:?}");
    assert_eq!(rig.pod_state().links, vec![own], "only the pod's own net1 is left");
    assert_eq!(rig.ipam_calls(), vec!["ADD c1 net1", "DEL c1 net1"]);
}

#[test]
fn l2_only_renames_and_ups_in_one_request_and_calls_no_ipam() {
    let rig = Rig::new();
    let mut c = config(json!({}));
    c.as_object_mut().unwrap().remove("ipam");
    rig.add(&c).unwrap();
    let index = rig.pod_state().links[0].index;
    assert_eq!(rig.kernel.log()[2], format!("pod: set link #{index} name net1 ipv4-conf up"));
    assert_eq!(rig.kernel.verbs(), 3);
    assert!(rig.ipam_calls().is_empty());
}

#[test]
fn del_removes_the_macvlan_and_the_one_a_killed_add_left_under_its_temporary_name() {
    let rig = Rig::new();
    rig.add(&config(json!({"multiRail": true}))).unwrap();
    // A killed ADD of the same attachment left its macvlan under the temporary name.
    let temp = own_temp_name(&rig.request("DEL", &config(json!({}))).env);
    let leftover =
        NewMacvlan { name: &temp, ..MacvlanConf::default().new_macvlan(&rig.master, None, &rig.pod).unwrap() };
    configure::runtime().unwrap().block_on(rig.node.add_macvlan(&leftover)).unwrap();
    rig.del(&config(json!({"multiRail": true}))).unwrap();
    let state = rig.pod_state();
    assert!(state.links.is_empty() && state.rules.is_empty() && state.routes.is_empty(), "{state:?}");
}

#[test]
fn del_leaves_a_link_of_another_kind_and_succeeds_when_nothing_is_there() {
    let rig = Rig::new();
    let own = rig.kernel.add_link(&rig.pod_sock, "net1", "veth", 1500);
    rig.del(&config(json!({}))).unwrap();
    assert_eq!(rig.pod_state().links, vec![own]);
    let empty = Rig::new();
    empty.del(&config(json!({}))).unwrap();
    assert!(!Path::new(&empty.dir.path().join("ipam.log")).exists(), "the kernel part alone: no IPAM here");
}
