//! plexus-host-device's ADD on the recording fake kernel (`plexus_net::fake`): the one move into
//! the pod and what follows it, in order, and what ADD undoes when any one step fails — the device
//! back on the node as it was, the state file gone, the address released. No root and no kernel:
//! the IPAM delegate is a real process (a script), sysfs an empty directory (no PCI, no RDMA),
//! the kernel a fake; `tests/tests/host_device.rs` runs the same code on real namespaces.

use plexus_net::fake::{FakeKernel, FakeNamespace, FakeSocket};
use plexus_node::policy::Policy;
use plexus_plugin::testing;
use serde_json::{Value, json};

use super::*;

/// A node with a RoCE port (addressed, up) and an empty pod, on the fake kernel.
struct Rig {
    kernel: FakeKernel,
    node_sock: FakeSocket,
    pod_sock: FakeSocket,
    node: Netns,
    pod: Netns,
    port: Link,
    dir: tempfile::TempDir,
}

impl Rig {
    fn new() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        for ns in ["node", "pod"] {
            std::fs::write(dir.path().join(ns), "").unwrap();
        }
        std::fs::create_dir(dir.path().join("sys")).unwrap();
        let kernel = FakeKernel::new();
        let node_sock = kernel.namespace("node", &dir.path().join("node"));
        let pod_sock = kernel.namespace("pod", &dir.path().join("pod"));
        let port = kernel.add_link(&node_sock, "ens2f0np0", "veth", 9000);
        kernel.add_address(&node_sock, port.index, "198.18.9.1/24".parse().unwrap());
        testing::fake_ipam(dir.path(), "198.18.1.5/24", "198.18.1.1");
        Rig {
            kernel,
            node_sock,
            pod_sock,
            node: Netns::open(&dir.path().join("node")).unwrap(),
            pod: Netns::open(&dir.path().join("pod")).unwrap(),
            port,
            dir,
        }
    }

    fn config(&self) -> Value {
        json!({"cniVersion": "1.0.0", "name": "rail", "type": "plexus-host-device", "device": "ens2f0np0",
            "dataDir": self.dir.path().join("state"), "ipam": {"type": "fake-ipam"}})
    }

    fn add(&self) -> Result<CniResult, Error> {
        let pod = self.pod.path().display().to_string();
        let bin = self.dir.path().display().to_string();
        let vars = [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", pod.as_str()),
            ("CNI_IFNAME", "net1"),
            ("CNI_PATH", bin.as_str()),
        ];
        let policy = Policy::parse(json!({"dataRoots": [self.dir.path()]}).to_string().as_bytes()).unwrap();
        let req = testing::request(&vars, &self.config(), policy);
        let conf = HostDeviceConf::load(&req)?;
        let sysfs = Sysfs::new(self.dir.path().join("sys"));
        let add = Add {
            req: &req,
            conf: &conf,
            sysfs: &sysfs,
            pod: &self.pod,
            node: &self.node,
            node_sock: &self.node_sock,
            pod_sock: &self.pod_sock,
            info_file: None,
            gid_wait: Duration::ZERO,
        };
        configure::runtime()?.block_on(async {
            match conf.select(&req, &sysfs, &self.node_sock).await? {
                Selected::Netdev(link) => add.run(&link).await,
                other => panic!("selected {other:?}"),
            }
        })
    }

    /// The state files (the directory's mark left out: a failed ADD removes the directory).
    fn state_files(&self) -> Vec<String> {
        std::fs::read_dir(self.dir.path().join("state"))
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .filter(|n: &String| n != plexus_node::datadir::MARK)
            .collect()
    }

    fn namespace(&self, name: &str) -> FakeNamespace {
        self.kernel.snapshot().into_iter().find(|n| n.name == name).unwrap()
    }
}

#[test]
fn add_marks_the_device_then_moves_it_in_one_request_with_its_host_name_as_alias_then_addresses_ups_and_routes_it() {
    let rig = Rig::new();
    let result = rig.add().unwrap();
    let i = rig.port.index;
    let pod = rig.pod.path().display().to_string();
    let marker = format!("plexus-host-device:ens2f0np0:{}", state::attachment_tag("c1", "net1"));
    assert_eq!(
        rig.kernel.log(),
        vec![
            "node: get link ens2f0np0".to_string(),
            format!("node: list addresses of #{i}"),
            "pod: get link net1".to_string(),
            format!("node: add altname #{i} {marker}"),
            format!("node: set link #{i} netns {pod} name net1 alias ens2f0np0 ipv4-conf"),
            "pod: get link net1".to_string(),
            format!("pod: add address 198.18.1.5/24 to #{i} nodad"),
            format!("pod: set link #{i} up"),
            "pod: add route 198.19.0.0/16 table 254".to_string(),
        ]
    );
    let in_pod = &rig.namespace("pod").links[0];
    // The alias the reference host-device's DEL renames it to; the marker moved with it.
    assert_eq!((in_pod.name.as_str(), in_pod.alias.as_deref(), in_pod.up), ("net1", Some("ens2f0np0"), true));
    assert_eq!(in_pod.alt_names, [marker]);
    assert!(rig.namespace("node").links.is_empty(), "the device left the node");
    assert_eq!(rig.state_files(), vec!["c1=net1"]);
    let saved = state::load(&rig.dir.path().join("state/c1=net1")).unwrap().unwrap();
    assert_eq!(saved.addresses, vec!["198.18.9.1/24".parse::<ipnetwork::IpNetwork>().unwrap()], "its node address");
    assert_eq!(result.interfaces[0].name, "net1");
    assert_eq!(testing::ipam_calls(rig.dir.path()), vec!["ADD c1 net1"]);
}

#[test]
fn a_failure_at_any_step_of_add_puts_the_device_back_on_the_node_as_it_was() {
    let steps = {
        let rig = Rig::new();
        rig.add().unwrap();
        rig.kernel.verbs()
    };
    assert_eq!(steps, 9);
    for k in 1..=steps {
        let rig = Rig::new();
        let before = rig.kernel.snapshot();
        rig.kernel.fail_at(k);
        let err = rig.add().expect_err(&format!("step {k} fails the ADD"));
        let failed = rig.kernel.log()[k - 1].clone();
        assert!(!err.details.contains("rollback failed"), "step {k} ({failed}): {err:?}");
        assert_eq!(rig.kernel.snapshot(), before, "step {k} ({failed}) left something: {:#?}", rig.kernel.log());
        assert!(rig.state_files().is_empty(), "step {k} ({failed}): the state file is gone");
        let calls = testing::ipam_calls(rig.dir.path());
        // The first three steps come before IPAM starts.
        let want: &[&str] = if k <= 3 { &[] } else { &["ADD c1 net1", "DEL c1 net1"] };
        assert_eq!(calls, want, "step {k} ({failed}): IPAM");
    }
}

#[test]
fn a_name_taken_in_the_pod_leaves_the_pods_own_link_and_the_device_on_the_node() {
    let rig = Rig::new();
    let own = rig.kernel.add_link(&rig.pod_sock, "net1", "veth", 1500);
    let before = rig.kernel.snapshot();
    let err = rig.add().unwrap_err();
    assert_eq!(err.code, code::IFNAME_TAKEN, "{err:?}");
    assert_eq!(rig.kernel.snapshot(), before, "the pod's net1 stays the pod's, the device the node's");
    assert_eq!(rig.namespace("pod").links, vec![own]);
    assert!(rig.state_files().is_empty());
    assert!(testing::ipam_calls(rig.dir.path()).is_empty(), "refused before IPAM runs");
}

#[test]
fn a_device_moved_whose_rename_then_failed_is_found_under_its_host_name_and_mac_not_the_pods_own() {
    let rig = Rig::new();
    let rt = configure::runtime().unwrap();
    let host = rt.block_on(HostState::capture(&rig.node_sock, &rig.port, None, "t")).unwrap();
    // The pod has a net1 of its own; the kernel moved the device, then its rename to net1 failed.
    let own = rig.kernel.add_link(&rig.pod_sock, "net1", "veth", 1500);
    let half_moved = LinkChange { netns: Some(&rig.pod), name: Some("net1"), alias: Some("x"), ..Default::default() };
    let err = rt.block_on(rig.node_sock.set_link(rig.port.index, &half_moved)).unwrap_err();
    assert!(err.is_exists());
    let found = rt.block_on(state::find_moved(&rig.pod_sock, "net1", &host)).unwrap().expect("found");
    assert_eq!((found.index, found.name.as_str()), (rig.port.index, "ens2f0np0"));
    assert_ne!(found.index, own.index);
    // Another device of that name in the pod, but not this one's MAC, is not taken.
    let stranger = HostState { mac: Some("02:00:00:00:00:99".into()), ..host };
    assert_eq!(rt.block_on(state::find_moved(&rig.pod_sock, "net1", &stranger)).unwrap(), None);
}

impl Rig {
    /// DEL's kernel part for attachment c1/net1, with the state ADD saved (when there is one).
    fn restore(&self, pod_reachable: bool) -> Result<(), Error> {
        let host = state::load(&self.dir.path().join("state/c1=net1")).unwrap();
        let mark = state::Mark::of("c1", "net1", host.as_ref());
        let pod = pod_reachable.then_some((&self.pod, &self.pod_sock));
        configure::runtime()?.block_on(restore_on(&self.node_sock, &self.node, pod, "net1", &mark, host.as_ref()))
    }
}

#[test]
fn del_moves_the_device_back_then_restores_mtu_mac_addresses_state_and_alias_and_takes_the_marker_off_last() {
    let rig = Rig::new();
    let before = rig.kernel.snapshot();
    rig.add().unwrap();
    let added = rig.kernel.verbs();
    rig.restore(true).unwrap();
    let i = rig.port.index;
    let node = rig.node.path().display().to_string();
    let marker = format!("plexus-host-device:ens2f0np0:{}", state::attachment_tag("c1", "net1"));
    let del: Vec<String> = rig.kernel.log()[added..].to_vec();
    assert_eq!(
        del,
        vec![
            "pod: get link net1".to_string(),
            format!("pod: set link #{i} netns {node} name ens2f0np0"),
            "node: get link ens2f0np0".to_string(),
            format!("node: set link #{i} mtu 9000 mac"),
            format!("node: list addresses of #{i}"),
            format!("node: add address 198.18.9.1/24 to #{i} nodad"),
            format!("node: set link #{i} up"),
            format!("node: set link #{i} alias "),
            format!("node: del altname #{i} {marker}"),
        ]
    );
    assert_eq!(rig.kernel.snapshot(), before, "the node as it was, the pod empty");
    rig.restore(true).unwrap();
    assert_eq!(rig.kernel.snapshot(), before, "a second DEL finds nothing and succeeds");
}

#[test]
fn del_finds_a_device_the_kernel_returned_to_the_node_under_its_pod_name_by_its_marker() {
    let rig = Rig::new();
    let before = rig.kernel.snapshot();
    rig.add().unwrap();
    // The pod's namespace died: the kernel put the device back in the node, still named net1.
    let node = Netns::open(rig.node.path()).unwrap();
    let back = LinkChange { netns: Some(&node), ..Default::default() };
    configure::runtime().unwrap().block_on(rig.pod_sock.set_link(rig.port.index, &back)).unwrap();
    rig.restore(false).unwrap();
    assert_eq!(rig.kernel.snapshot(), before);
}

#[test]
fn del_of_another_attachment_never_takes_this_ones_device() {
    let rig = Rig::new();
    rig.add().unwrap();
    let attached = rig.kernel.snapshot();
    let mark = state::Mark::of("c1", "net3", None);
    configure::runtime()
        .unwrap()
        .block_on(restore_on(&rig.node_sock, &rig.node, Some((&rig.pod, &rig.pod_sock)), "net3", &mark, None))
        .unwrap();
    assert_eq!(rig.kernel.snapshot(), attached, "net1's device stays in the pod, as it was");
}

/// A node upgraded under a running pod: its device was moved by a plexus of state format 1, with
/// the marker as its alias and no alternative name. This build still finds it and puts it back.
#[test]
fn a_device_an_earlier_plexus_moved_with_its_marker_as_alias_is_found_and_put_back() {
    let rig = Rig::new();
    let before = rig.kernel.snapshot();
    let rt = configure::runtime().unwrap();
    let tag = state::attachment_tag("c1", "net1");
    let host =
        HostState { version: 1, ..rt.block_on(HostState::capture(&rig.node_sock, &rig.port, None, &tag)).unwrap() };
    std::fs::create_dir_all(rig.dir.path().join("state")).unwrap();
    state::save(&rig.dir.path().join("state/c1=net1"), &host).unwrap();
    let marker = host.marker();
    let moved = LinkChange { netns: Some(&rig.pod), name: Some("net1"), alias: Some(&marker), ..Default::default() };
    rt.block_on(rig.node_sock.set_link(rig.port.index, &moved)).unwrap();
    rig.restore(true).unwrap();
    assert_eq!(rig.kernel.snapshot(), before, "back on the node as it was, the alias marker gone");
}
