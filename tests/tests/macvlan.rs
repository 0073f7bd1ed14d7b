//! plexus-macvlan in real namespaces: veth "NICs" with MTU 9000 in a node namespace stand in for
//! ConnectX ports; every plugin process runs inside that node namespace.

use std::path::Path;

use plexus_tests::{
    Lab, Netns, Outcome, PluginRun, REFERENCE_CNI_DIR, gid_slot, plugin_bin, reference_plugin, write_policy,
};
use serde_json::{Value, json};

const PLUGIN: &str = "plexus-macvlan";

fn conf(version: &str, extra: Value) -> Value {
    let mut c = json!({"cniVersion": version, "name": "rail0", "type": PLUGIN, "master": "nic0"});
    c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    c
}

fn static_ipam() -> Value {
    json!({"type": "static",
           "addresses": [{"address": "198.18.0.10/24", "gateway": "198.18.0.1"}, {"address": "2001:db8:0:1::10/64"}],
           "routes": [{"dst": "198.19.0.0/16"}, {"dst": "2001:db8:ff::/48", "gw": "2001:db8:0:1::fe"}]})
}

fn run(lab: &Lab, bin: &Path, verb: &str, pod: &Netns, ifname: &str, c: &Value) -> Outcome {
    PluginRun::new(bin, verb)
        .attachment("ctr1", &pod.path(), ifname, REFERENCE_CNI_DIR)
        .stdin(c)
        .in_netns(&lab.node)
        .run()
}

fn ours(lab: &Lab, verb: &str, c: &Value) -> Outcome {
    run(lab, &plugin_bin(PLUGIN), verb, &lab.pod, "net1", c)
}

/// [`ours`] under the node policy `policy` (a file written in `dir`).
fn ours_under(lab: &Lab, dir: &Path, policy: Value, verb: &str, c: &Value) -> Outcome {
    let mut policy = policy;
    policy["dataRoots"] = json!([std::env::temp_dir()]);
    let file = write_policy(dir, "policy.json", &policy);
    PluginRun::new(plugin_bin(PLUGIN), verb)
        .attachment("ctr1", &lab.pod.path(), "net1", REFERENCE_CNI_DIR)
        .env("PLEXUS_POLICY", file.to_str().unwrap())
        .stdin(c)
        .in_netns(&lab.node)
        .run()
}

fn lab() -> Lab {
    let lab = Lab::new();
    lab.add_nic("nic0", 9000);
    lab
}

/// Nothing of ours in the pod: only `lo`, and only the kernel's default rules.
fn assert_pod_clean(pod: &Netns) {
    let links: Vec<String> = pod.links().into_iter().map(|l| l.ifname).collect();
    assert_eq!(links, ["lo"], "links left in the pod");
    let rules: Vec<String> = pod.rules().into_iter().map(|r| r.table).collect();
    assert_eq!(rules, ["local", "main", "default", "local", "main"], "rules left in the pod");
}

#[test]
fn add_creates_a_macvlan_in_every_mode_on_the_master_with_its_mtu() {
    let lab = lab();
    let dir = tempfile::tempdir().unwrap();
    // passthru takes the parent over: only where the policy names it (trust_boundary.rs).
    let all_modes = json!({"allow": {"macvlanModes": ["bridge", "private", "vepa", "passthru"]}});
    for mode in ["bridge", "private", "vepa", "passthru"] {
        let out = ours_under(&lab, dir.path(), all_modes.clone(), "ADD", &conf("1.1.0", json!({"mode": mode})));
        let r = out.result();
        let link = lab.pod.link("net1").expect("net1 in the pod");
        assert_eq!(link.kind(), Some("macvlan"));
        assert_eq!(link.macvlan_mode(), Some(mode));
        assert_eq!(link.mtu, 9000, "the parent's MTU by default");
        assert!(link.is_up());
        assert_eq!(lab.pod.sysctl("net.ipv4.conf.net1.arp_notify"), "1", "set before the link went up");
        assert_eq!(r["interfaces"][0]["mac"], link.address);
        assert_eq!(r["interfaces"][0]["mtu"], 9000);
        assert_eq!(r["interfaces"][0]["sandbox"], lab.pod.path().to_str().unwrap());
        assert!(r.get("ips").is_none(), "L2-only: no addresses");
        assert!(ours(&lab, "DEL", &conf("1.1.0", json!({"mode": mode}))).success());
        assert_pod_clean(&lab.pod);
    }
}

#[test]
fn add_with_reference_static_ipam_at_each_version() {
    let lab = lab();
    for version in ["0.3.1", "0.4.0", "1.0.0"] {
        let c = conf(version, json!({"ipam": static_ipam()}));
        let r = ours(&lab, "ADD", &c).result();
        assert_eq!(r["cniVersion"], version);
        assert_eq!(r["ips"][0]["address"], "198.18.0.10/24");
        assert_eq!(r["ips"][0]["interface"], 0);
        let addrs: Vec<String> = lab.pod.addrs("net1").iter().map(|a| a.cidr()).collect();
        assert_eq!(addrs, ["198.18.0.10/24", "2001:db8:0:1::10/64"], "{version}");
        let routes = lab.pod.routes();
        assert!(
            routes.iter().any(|r| r.dst == "198.19.0.0/16" && r.gateway.as_deref() == Some("198.18.0.1")),
            "{routes:?}"
        );
        assert!(routes.iter().any(|r| r.dst == "2001:db8:ff::/48" && r.gateway.as_deref() == Some("2001:db8:0:1::fe")));
        assert!(ours(&lab, "DEL", &c).success());
        assert_pod_clean(&lab.pod);
    }
    // 1.1.0: Debian's static (libcni 1.1.2) stops at 1.0.0, so L2-only here.
    let r = ours(&lab, "ADD", &conf("1.1.0", json!({}))).result();
    assert_eq!(r["cniVersion"], "1.1.0");
}

#[test]
fn ipv6_addresses_are_usable_at_once_without_dad_and_dad_true_waits_for_it() {
    let lab = lab();
    let r = ours(&lab, "ADD", &conf("1.0.0", json!({"ipam": static_ipam()})));
    assert!(r.success());
    let flags = lab.node.ip(&["-n", lab.pod.name(), "-6", "addr", "show", "dev", "net1", "scope", "global"]);
    assert!(flags.contains("nodad") && !flags.contains("tentative"), "{flags}");
    assert!(ours(&lab, "DEL", &conf("1.0.0", json!({"ipam": static_ipam()}))).success());
    let c = conf("1.0.0", json!({"ipam": static_ipam(), "dad": true}));
    assert!(ours(&lab, "ADD", &c).success());
    let flags = lab.node.ip(&["-n", lab.pod.name(), "-6", "addr", "show", "dev", "net1", "scope", "global"]);
    assert!(!flags.contains("nodad") && !flags.contains("tentative"), "DAD ran and finished: {flags}");
}

#[test]
fn same_config_as_reference_macvlan_gives_the_same_kernel_state_and_result() {
    let lab = lab();
    let theirs_pod = lab.another_pod();
    for mode in ["bridge", "private"] {
        let mut c = conf("1.0.0", json!({"mode": mode, "mtu": 4200, "ipam": static_ipam()}));
        let ours_out = run(&lab, &plugin_bin(PLUGIN), "ADD", &lab.pod, "net1", &c);
        c["type"] = "macvlan".into();
        let theirs_out = run(&lab, &reference_plugin("macvlan"), "ADD", &theirs_pod, "net1", &c);
        let (a, b) = (lab.pod.link("net1").unwrap(), theirs_pod.link("net1").unwrap());
        assert_eq!((a.kind(), a.macvlan_mode(), a.mtu, a.is_up()), (b.kind(), b.macvlan_mode(), b.mtu, b.is_up()));
        assert_eq!(a.link_index, b.link_index, "same parent");
        assert_eq!(a.link_index, Some(lab.node.link("nic0").unwrap().ifindex));
        assert_eq!(lab.pod.addrs("net1"), theirs_pod.addrs("net1"));
        let strip = |routes: Vec<plexus_tests::Route>| -> Vec<(String, Option<String>, Option<String>)> {
            routes.into_iter().map(|r| (r.dst, r.gateway, r.scope)).collect()
        };
        assert_eq!(strip(lab.pod.routes()), strip(theirs_pod.routes()));
        // The result JSON is the same apart from the MAC and the sandbox path, and the 1.1
        // interface `mtu` plexus adds (libcni types100 carries it at 1.0.0 too).
        let normalize = |mut v: Value| {
            v["interfaces"][0]["mac"] = "mac".into();
            v["interfaces"][0]["sandbox"] = "ns".into();
            v["interfaces"][0].as_object_mut().unwrap().remove("mtu");
            v.as_object_mut().unwrap().remove("dns");
            v
        };
        assert_eq!(normalize(ours_out.result()), normalize(theirs_out.result()));
        assert!(run(&lab, &plugin_bin(PLUGIN), "DEL", &lab.pod, "net1", &c).success());
        assert!(run(&lab, &reference_plugin("macvlan"), "DEL", &theirs_pod, "net1", &c).success());
    }
}

#[test]
fn bad_input_fails_with_its_code_and_leaves_nothing() {
    let lab = lab();
    let node_links = lab.node.links().len();
    let cases: Vec<(Value, u64, &str)> = vec![
        (conf("1.0.0", json!({"master": "nope0"})), 7, "master interface \"nope0\" not found"),
        (conf("1.0.0", json!({"mtu": 9001})), 7, "invalid MTU 9001, must be [0, master MTU(9000)]"),
        (conf("1.0.0", json!({"mode": "source"})), 7, "unknown macvlan mode: source"),
        (conf("1.0.0", json!({"mode": "bogus"})), 7, "unknown macvlan mode: bogus"),
        (conf("1.0.0", json!({"mtu": "big"})), 7, "invalid network config: mtu: invalid type"),
        (conf("1.0.0", json!({"mac": "zz:00:00:00:00:01"})), 7, "invalid mac \"zz:00:00:00:00:01\""),
        (conf("1.0.0", json!({"ipam": {"type": "no-such-ipam"}})), 100, "failed to find plugin \"no-such-ipam\""),
        (
            conf("1.0.0", json!({"ipam": {"type": "static", "addresses": [{"address": "bad"}]}})),
            999,
            "the 'address' field",
        ),
    ];
    for (c, code, msg) in cases {
        let (got_code, got_msg, _) = ours(&lab, "ADD", &c).error();
        assert_eq!(got_code, code, "{msg}: {got_msg}");
        assert!(got_msg.starts_with(msg), "expected {msg:?}, got {got_msg:?}");
        assert_pod_clean(&lab.pod);
        assert_eq!(lab.node.links().len(), node_links, "{msg}: node namespace changed");
    }
    // No master and no default route in the node namespace.
    let mut c = conf("1.0.0", json!({}));
    c.as_object_mut().unwrap().remove("master");
    let (code, msg, _) = ours(&lab, "ADD", &c).error();
    assert_eq!((code, msg.as_str()), (7, "no default route interface found"));
    assert_pod_clean(&lab.pod);
}

#[test]
fn master_defaults_to_the_default_route_interface_of_the_node_namespace_the_policy_names() {
    let lab = lab();
    let dir = tempfile::tempdir().unwrap();
    lab.node.ip(&["addr", "add", "198.18.9.2/24", "dev", "nic0"]);
    lab.node.ip(&["route", "add", "default", "via", "198.18.9.1"]);
    let mut c = conf("1.0.0", json!({}));
    c.as_object_mut().unwrap().remove("master");
    // The node's uplink is nobody's implicit parent unless the policy names it.
    let (code, msg, _) = ours(&lab, "ADD", &c).error();
    assert_eq!(code, 7, "{msg}");
    assert!(msg.contains("default-route interface \"nic0\" is not a parent the node policy names"), "{msg}");
    assert!(lab.pod.link("net1").is_none());
    assert!(ours_under(&lab, dir.path(), json!({"allow": {"parents": ["nic0"]}}), "ADD", &c).success());
    let nic = lab.node.link("nic0").unwrap();
    assert_eq!(lab.pod.link("net1").unwrap().link_index, Some(nic.ifindex));
}

#[test]
fn an_interface_name_already_in_the_pod_is_refused_and_left_untouched() {
    let lab = lab();
    lab.pod.ip(&["link", "add", "net1", "mtu", "1280", "type", "veth", "peer", "name", "other"]);
    let before = lab.pod.link("net1").unwrap();
    let (code, msg, _) = ours(&lab, "ADD", &conf("1.0.0", json!({"ipam": static_ipam()}))).error();
    assert_eq!(code, 103);
    assert_eq!(msg, "interface \"net1\" already exists in the container");
    let after = lab.pod.link("net1").unwrap();
    assert_eq!((after.kind(), after.mtu, &after.address), (before.kind(), before.mtu, &before.address));
    assert_eq!(lab.pod.links().len(), 3, "lo, net1, other: nothing added");
}

#[test]
fn invalid_ifname_and_missing_netns_are_refused() {
    let lab = lab();
    let out = run(&lab, &plugin_bin(PLUGIN), "ADD", &lab.pod, "net/1", &conf("1.0.0", json!({})));
    assert_eq!(out.error().0, 4);
    let out = PluginRun::new(plugin_bin(PLUGIN), "ADD")
        .attachment("ctr1", Path::new("/run/netns/plexus-no-such-ns"), "net1", REFERENCE_CNI_DIR)
        .stdin(&conf("1.0.0", json!({})))
        .in_netns(&lab.node)
        .run();
    let (code, msg, _) = out.error();
    assert_eq!(code, 8);
    assert!(msg.contains("/run/netns/plexus-no-such-ns"), "{msg}");
    assert_pod_clean(&lab.pod);
}

#[test]
fn a_failure_after_ipam_releases_the_address_and_removes_the_link() {
    let lab = lab();
    let data = tempfile::tempdir().unwrap();
    // host-local allocates (a file per address), then the route cannot be added (its gateway is
    // off-link): the rollback must DEL host-local and delete the link.
    let c = conf(
        "1.0.0",
        json!({"ipam": {"type": "host-local", "dataDir": data.path().to_str().unwrap(),
                        "ranges": [[{"subnet": "198.18.3.0/24"}]],
                        "routes": [{"dst": "198.19.0.0/16", "gw": "198.20.0.1"}]}}),
    );
    let (code, msg, _) = ours(&lab, "ADD", &c).error();
    assert_eq!(code, 102, "{msg}");
    assert!(msg.starts_with("configure net1: add route 198.19.0.0/16 via 198.20.0.1"), "{msg}");
    assert_pod_clean(&lab.pod);
    let held: Vec<String> = std::fs::read_dir(data.path().join("rail0"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("198."))
        .collect();
    assert!(held.is_empty(), "address still reserved: {held:?}");
}

#[test]
fn del_removes_the_link_when_ipam_del_fails_reports_that_failure_and_a_later_del_releases_the_address() {
    let lab = lab();
    let data = tempfile::tempdir().unwrap();
    let ipam =
        |dir: &str| json!({"ipam": {"type": "host-local", "dataDir": dir, "ranges": [[{"subnet": "198.18.4.0/24"}]]}});
    let c = conf("1.0.0", ipam(data.path().to_str().unwrap()));
    assert!(ours(&lab, "ADD", &c).success());
    let reserved = || -> Vec<String> {
        std::fs::read_dir(data.path().join("rail0"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("198."))
            .collect()
    };
    assert_eq!(reserved().len(), 1);
    // host-local cannot open a store under a regular file: its DEL fails, ours still removes the
    // link (IPAM DEL runs alongside it) and reports host-local's error.
    let broken = conf("1.0.0", ipam("/proc/version/store"));
    let out = ours(&lab, "DEL", &broken);
    assert!(!out.success(), "DEL with a failing IPAM must fail: {}", out.stdout);
    assert!(out.stdout.contains("mkdir /proc/version"), "host-local's own error: {}", out.stdout);
    assert_pod_clean(&lab.pod);
    assert_eq!(reserved().len(), 1, "the failed IPAM DEL released nothing");
    assert!(ours(&lab, "DEL", &c).success());
    assert!(reserved().is_empty(), "address still reserved: {:?}", reserved());
}

#[test]
fn del_succeeds_twice_without_netns_after_netns_is_gone_and_after_the_link_was_removed() {
    let lab = lab();
    let c = conf("1.0.0", json!({"ipam": static_ipam()}));
    assert!(ours(&lab, "ADD", &c).success());
    assert!(ours(&lab, "DEL", &c).success());
    assert!(ours(&lab, "DEL", &c).success(), "second DEL");
    assert_pod_clean(&lab.pod);
    // containerd: empty CNI_NETNS.
    assert!(ours(&lab, "ADD", &c).success());
    let out = PluginRun::new(plugin_bin(PLUGIN), "DEL")
        .attachment("ctr1", &lab.pod.path(), "net1", REFERENCE_CNI_DIR)
        .env("CNI_NETNS", "")
        .stdin(&c)
        .in_netns(&lab.node)
        .run();
    assert!(out.success(), "{}", out.stdout);
    // The link removed by hand.
    lab.pod.ip(&["link", "del", "net1"]);
    assert!(ours(&lab, "DEL", &c).success());
    // The pod namespace deleted.
    let gone = lab.another_pod();
    assert!(run(&lab, &plugin_bin(PLUGIN), "ADD", &gone, "net1", &c).success());
    let path = gone.path();
    gone.delete();
    let out = PluginRun::new(plugin_bin(PLUGIN), "DEL")
        .attachment("ctr1", &path, "net1", REFERENCE_CNI_DIR)
        .stdin(&c)
        .in_netns(&lab.node)
        .run();
    assert!(out.success(), "{}", out.stdout);
}

#[test]
fn multi_rail_routes_each_address_out_of_its_own_interface_and_del_removes_rules_and_tables() {
    let lab = lab();
    lab.add_nic("nic1", 9000);
    let rail = |master: &str, addr: &str| {
        conf(
            "1.0.0",
            json!({"master": master, "multiRail": true,
                   "ipam": {"type": "static", "addresses": [{"address": addr, "gateway": "198.18.7.1"}],
                            "routes": [{"dst": "198.19.0.0/16"}]}}),
        )
    };
    let (c1, c2) = (rail("nic0", "198.18.7.11/24"), rail("nic1", "198.18.7.12/24"));
    let r1 = ours(&lab, "ADD", &c1).result();
    assert!(run(&lab, &plugin_bin(PLUGIN), "ADD", &lab.pod, "net2", &c2).success());
    for (addr, dev) in [("198.18.7.11", "net1"), ("198.18.7.12", "net2")] {
        for peer in ["198.18.7.100", "198.19.4.4"] {
            let got = lab.pod.ip(&["route", "get", peer, "from", addr]);
            assert!(got.contains(&format!("dev {dev} ")), "{peer} from {addr}: {got}");
        }
    }
    for dev in ["net1", "net2"] {
        assert_eq!(lab.pod.sysctl(&format!("net.ipv4.conf.{dev}.arp_ignore")), "1");
        assert_eq!(lab.pod.sysctl(&format!("net.ipv4.conf.{dev}.arp_announce")), "2");
        assert_eq!(lab.pod.sysctl(&format!("net.ipv4.conf.{dev}.rp_filter")), "2");
    }
    let tables: Vec<String> = lab.pod.rules().into_iter().map(|r| r.table).collect();
    assert!(tables.contains(&"101".into()) && tables.contains(&"102".into()), "{tables:?}");
    let mut with_prev = c1.clone();
    with_prev["prevResult"] = r1;
    let check = ours(&lab, "CHECK", &with_prev);
    assert!(check.success(), "{}", check.stdout);
    assert!(ours(&lab, "DEL", &c1).success());
    assert!(run(&lab, &plugin_bin(PLUGIN), "DEL", &lab.pod, "net2", &c2).success());
    assert_pod_clean(&lab.pod);
    assert!(lab.pod.routes().iter().all(|r| r.table.as_deref() != Some("101") && r.table.as_deref() != Some("102")));
}

#[test]
fn check_passes_after_add_and_fails_clearly_after_the_mtu_changed() {
    let lab = lab();
    let mut c = conf("1.0.0", json!({"ipam": static_ipam()}));
    let r = ours(&lab, "ADD", &c).result();
    c["prevResult"] = r;
    let out = ours(&lab, "CHECK", &c);
    assert!(out.success(), "{}", out.stdout);
    lab.pod.ip(&["link", "set", "net1", "mtu", "1400"]);
    let (code, msg, _) = ours(&lab, "CHECK", &c).error();
    assert_eq!((code, msg.as_str()), (104, "net1 has MTU 1400, expected 9000"));
    let mut no_prev = c.clone();
    no_prev.as_object_mut().unwrap().remove("prevResult");
    assert_eq!(ours(&lab, "CHECK", &no_prev).error().1, "Required prevResult missing");
}

#[test]
fn status_reports_a_missing_master_with_code_50() {
    let lab = lab();
    let ok = PluginRun::new(plugin_bin(PLUGIN), "STATUS").stdin(&conf("1.1.0", json!({}))).in_netns(&lab.node).run();
    assert!(ok.success(), "{}", ok.stdout);
    let out = PluginRun::new(plugin_bin(PLUGIN), "STATUS")
        .stdin(&conf("1.1.0", json!({"master": "gone0"})))
        .in_netns(&lab.node)
        .run();
    let (code, msg, _) = out.error();
    assert_eq!((code, msg.as_str()), (50, "master interface \"gone0\" not found"));
}

#[test]
fn mac_follows_config_then_cni_args_then_runtime_config() {
    let lab = lab();
    let mut c = conf("1.0.0", json!({"mac": "02:00:00:00:00:01"}));
    assert_eq!(ours(&lab, "ADD", &c).result()["interfaces"][0]["mac"], "02:00:00:00:00:01");
    assert!(ours(&lab, "DEL", &c).success());
    let out = PluginRun::new(plugin_bin(PLUGIN), "ADD")
        .attachment("ctr1", &lab.pod.path(), "net1", REFERENCE_CNI_DIR)
        .env("CNI_ARGS", "IgnoreUnknown=1;MAC=02:00:00:00:00:02")
        .stdin(&c)
        .in_netns(&lab.node)
        .run();
    assert_eq!(out.result()["interfaces"][0]["mac"], "02:00:00:00:00:02");
    assert!(ours(&lab, "DEL", &c).success());
    c["runtimeConfig"] = json!({"mac": "02:00:00:00:00:03"});
    assert_eq!(ours(&lab, "ADD", &c).result()["interfaces"][0]["mac"], "02:00:00:00:00:03");
    assert_eq!(lab.pod.link("net1").unwrap().address, "02:00:00:00:00:03");
}

/// A fake sysfs in which the parent nic0 is PCI function 0000:3b:00.1 with RDMA device mlx5_1.
fn fake_parent_sysfs() -> tempfile::TempDir {
    let sys = tempfile::tempdir().unwrap();
    let pf = sys.path().join("devices/pci0000:3a/0000:3b:00.1");
    std::fs::create_dir_all(pf.join("infiniband/mlx5_1")).unwrap();
    std::fs::create_dir_all(sys.path().join("class/net/nic0")).unwrap();
    std::os::unix::fs::symlink(&pf, sys.path().join("class/net/nic0/device")).unwrap();
    sys
}

#[test]
fn device_info_names_the_parents_pci_address_and_rdma_device_from_a_fake_sysfs() {
    let lab = lab();
    let sys = fake_parent_sysfs();
    let out_dir = tempfile::tempdir().unwrap();
    let info = out_dir.path().join("devinfo/rail0-ctr1-net1.json");
    // The device-info directory is the admin's: the test's policy moves it into a temp dir.
    let policy = write_policy(out_dir.path(), "policy.json", &json!({"deviceInfoDir": out_dir.path().join("devinfo")}));
    let c = conf("1.1.0", json!({"runtimeConfig": {"CNIDeviceInfoFile": info.to_str().unwrap()}}));
    let run = |verb: &str| {
        PluginRun::new(plugin_bin(PLUGIN), verb)
            .attachment("ctr1", &lab.pod.path(), "net1", REFERENCE_CNI_DIR)
            .env("PLEXUS_SYSFS_ROOT", sys.path().to_str().unwrap())
            .env("PLEXUS_POLICY", policy.to_str().unwrap())
            .stdin(&c)
            .in_netns(&lab.node)
            .run()
    };
    let out = run("ADD");
    assert!(out.success(), "{}", out.stdout);
    let doc: Value = serde_json::from_slice(&std::fs::read(&info).unwrap()).unwrap();
    assert_eq!(
        doc,
        json!({"type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:3b:00.1", "rdma-device": "mlx5_1"}})
    );
    assert!(run("DEL").success());
    assert!(!info.exists(), "DEL removes the device-info file");
}

#[test]
fn fake_sysfs_roce_gids_of_the_pods_addresses_are_waited_for_and_reported_in_device_info_by_value() {
    let lab = lab();
    let sys = fake_parent_sysfs();
    // The parent's GID table, as a ConnectX port shows it: its link-local GIDs at 0/1, another
    // pod's macvlan (also called net1) at 2/3, two holes, then our IPv4 address's v1 entry; its
    // v2 entry and the IPv6 one appear a little after the address is set, as the kernel fills
    // the table asynchronously.
    let port = sys.path().join("class/infiniband/mlx5_1/ports/1");
    gid_slot(&port, 0, "fe80:0000:0000:0000:0a5c:2bff:fe11:2233", Some("IB/RoCE v1"), "nic0");
    gid_slot(&port, 1, "fe80:0000:0000:0000:0a5c:2bff:fe11:2233", Some("RoCE v2"), "nic0");
    gid_slot(&port, 2, "0000:0000:0000:0000:0000:ffff:c612:0007", Some("IB/RoCE v1"), "net1");
    gid_slot(&port, 3, "0000:0000:0000:0000:0000:ffff:c612:0007", Some("RoCE v2"), "net1");
    gid_slot(&port, 4, "0000:0000:0000:0000:0000:0000:0000:0000", None, "");
    gid_slot(&port, 5, "0000:0000:0000:0000:0000:0000:0000:0000", None, "");
    gid_slot(&port, 6, "0000:0000:0000:0000:0000:ffff:c612:000a", Some("IB/RoCE v1"), "net1");
    let later = port.clone();
    let kernel = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        gid_slot(&later, 7, "0000:0000:0000:0000:0000:ffff:c612:000a", Some("RoCE v2"), "net1");
        gid_slot(&later, 8, "2001:0db8:0000:0001:0000:0000:0000:0010", Some("RoCE v2"), "net1");
    });
    let out_dir = tempfile::tempdir().unwrap();
    let info = out_dir.path().join("devinfo/rail0-ctr1-net1.json");
    let policy = write_policy(out_dir.path(), "policy.json", &json!({"deviceInfoDir": out_dir.path().join("devinfo")}));
    let c = conf(
        "1.0.0",
        json!({"runtimeConfig": {"CNIDeviceInfoFile": info.to_str().unwrap()}, "ipam": static_ipam(),
               "roceGidWaitMs": 5000}),
    );
    let run = |verb: &str, c: &Value| {
        PluginRun::new(plugin_bin(PLUGIN), verb)
            .attachment("ctr1", &lab.pod.path(), "net1", REFERENCE_CNI_DIR)
            .env("PLEXUS_SYSFS_ROOT", sys.path().to_str().unwrap())
            .env("PLEXUS_POLICY", policy.to_str().unwrap())
            .stdin(c)
            .in_netns(&lab.node)
            .run()
    };
    let out = run("ADD", &c);
    kernel.join().unwrap();
    assert!(out.success(), "{}", out.stdout);
    let doc: Value = serde_json::from_slice(&std::fs::read(&info).unwrap()).unwrap();
    assert_eq!(
        doc["pci"]["roce-gids"],
        json!([
            {"port": 1, "index": 6, "gid": "0000:0000:0000:0000:0000:ffff:c612:000a", "type": "IB/RoCE v1"},
            {"port": 1, "index": 7, "gid": "0000:0000:0000:0000:0000:ffff:c612:000a", "type": "RoCE v2"},
            {"port": 1, "index": 8, "gid": "2001:0db8:0000:0001:0000:0000:0000:0010", "type": "RoCE v2"},
        ]),
        "only our addresses' entries, both types, found by value (the other pod's net1 is not ours)"
    );
    assert_eq!(doc["pci"]["rdma-device"], "mlx5_1");
    assert!(run("DEL", &c).success());
    // A table that never gets the v2 entry: ADD still succeeds after the (short) wait, reporting
    // what there is.
    std::fs::remove_dir_all(port.join("gids")).unwrap();
    std::fs::create_dir_all(port.join("gids")).unwrap();
    let c = conf(
        "1.0.0",
        json!({"runtimeConfig": {"CNIDeviceInfoFile": info.to_str().unwrap()}, "ipam": static_ipam(),
               "roceGidWaitMs": 200}),
    );
    let out = run("ADD", &c);
    assert!(out.success(), "{}", out.stdout);
    let doc: Value = serde_json::from_slice(&std::fs::read(&info).unwrap()).unwrap();
    assert!(doc["pci"].get("roce-gids").is_none(), "no entries: no key: {doc}");
    assert!(run("DEL", &c).success());
    let mut too_long = c.clone();
    too_long["roceGidWaitMs"] = json!(60000);
    let (code, msg, _) = run("ADD", &too_long).error();
    assert_eq!((code, msg.as_str()), (7, "roceGidWaitMs 60000 is too long: at most 10000 ms"));
}

#[test]
fn link_in_container_uses_a_master_inside_the_pod_namespace() {
    let lab = lab();
    lab.pod.ip(&["link", "add", "pmaster", "mtu", "4000", "type", "veth", "peer", "name", "ppeer"]);
    lab.pod.ip(&["link", "set", "pmaster", "up"]);
    let c = conf("1.0.0", json!({"master": "pmaster", "linkInContainer": true}));
    let r = ours(&lab, "ADD", &c).result();
    let link = lab.pod.link("net1").unwrap();
    assert_eq!(link.mtu, 4000, "the in-pod master's MTU");
    assert_eq!(link.link.as_deref(), Some("pmaster"));
    assert_eq!(r["interfaces"][0]["mtu"], 4000);
    assert!(ours(&lab, "DEL", &c).success());
    assert!(lab.pod.link("net1").is_none());
    // The master is looked up in the pod, not the node: nic0 is not there.
    let (code, msg, _) = ours(&lab, "ADD", &conf("1.0.0", json!({"linkInContainer": true}))).error();
    assert_eq!((code, msg.as_str()), (7, "master interface \"nic0\" not found"));
}

#[test]
fn bcqueuelen_dns_and_the_ips_capability_reach_the_kernel_and_the_result() {
    let lab = lab();
    let c = conf(
        "1.0.0",
        json!({"bcqueuelen": 123, "dns": {"nameservers": ["198.18.0.53"], "search": ["rail.example"]},
               "capabilities": {"ips": true}, "runtimeConfig": {"ips": ["198.18.0.44/24"]},
               "ipam": {"type": "static"}}),
    );
    let r = ours(&lab, "ADD", &c).result();
    let link = lab.pod.link("net1").unwrap();
    assert_eq!(link.linkinfo.as_ref().unwrap()["info_data"]["bcqueuelen"], 123);
    assert_eq!(r["dns"], json!({"nameservers": ["198.18.0.53"], "search": ["rail.example"]}));
    assert_eq!(r["ips"][0]["address"], "198.18.0.44/24", "runtimeConfig.ips reached the IPAM plugin");
    assert_eq!(lab.pod.addrs("net1")[0].cidr(), "198.18.0.44/24");
}

#[test]
fn check_status_and_gc_are_forwarded_to_the_ipam_plugin() {
    use std::os::unix::fs::PermissionsExt;
    let lab = lab();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("calls");
    let spy = dir.path().join("spy-ipam");
    std::fs::write(
        &spy,
        format!(
            "#!/bin/sh\necho \"$CNI_COMMAND\" >> {log}\ncat > /dev/null\n[ \"$CNI_COMMAND\" = ADD ] && echo '{{\"cniVersion\":\"1.1.0\",\"ips\":[{{\"address\":\"198.18.0.61/24\"}}]}}'\nexit 0\n",
            log = log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&spy, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().to_str().unwrap();
    let c = conf("1.1.0", json!({"ipam": {"type": "spy-ipam"}}));
    let add = PluginRun::new(plugin_bin(PLUGIN), "ADD").attachment("ctr1", &lab.pod.path(), "net1", path).stdin(&c);
    let mut with_prev = c.clone();
    with_prev["prevResult"] = add.in_netns(&lab.node).run().result();
    let check = PluginRun::new(plugin_bin(PLUGIN), "CHECK")
        .attachment("ctr1", &lab.pod.path(), "net1", path)
        .stdin(&with_prev)
        .in_netns(&lab.node)
        .run();
    assert!(check.success(), "{}", check.stdout);
    for verb in ["STATUS", "GC"] {
        let out = PluginRun::new(plugin_bin(PLUGIN), verb).env("CNI_PATH", path).stdin(&c).in_netns(&lab.node).run();
        assert!(out.success(), "{verb}: {}", out.stdout);
    }
    let del = PluginRun::new(plugin_bin(PLUGIN), "DEL").attachment("ctr1", &lab.pod.path(), "net1", path).stdin(&c);
    assert!(del.in_netns(&lab.node).run().success());
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "ADD\nCHECK\nSTATUS\nGC\nDEL\n");
}

#[test]
fn del_removes_a_macvlan_a_killed_add_left_under_the_attachments_temporary_name() {
    let lab = lab();
    // What plexus-macvlan leaves when it is killed between creating the link and renaming it:
    // a macvlan under the attachment's own temporary name.
    let tag = plexus_cni::env::attachment_tag("ctr1", "net1");
    let temp = format!("plx{}", &tag[..12]);
    lab.node.ip(&["link", "add", &temp, "link", "nic0", "type", "macvlan", "mode", "bridge"]);
    lab.node.ip(&["link", "set", &temp, "netns", lab.pod.name()]);
    assert!(lab.pod.link(&temp).is_some());
    let c = conf("1.0.0", json!({}));
    assert!(ours(&lab, "DEL", &c).success());
    assert!(lab.pod.link(&temp).is_none(), "DEL found it by its name");
    // Another attachment's temporary name is not this attachment's business.
    let other = format!("plx{}", &plexus_cni::env::attachment_tag("ctr2", "net1")[..12]);
    lab.node.ip(&["link", "add", &other, "link", "nic0", "type", "macvlan", "mode", "bridge"]);
    lab.node.ip(&["link", "set", &other, "netns", lab.pod.name()]);
    assert!(ours(&lab, "DEL", &c).success());
    assert!(lab.pod.link(&other).is_some());
    // And an ADD is not hindered by such a leftover.
    lab.pod.ip(&["link", "del", &other]);
    lab.node.ip(&["link", "add", &temp, "link", "nic0", "type", "macvlan", "mode", "bridge"]);
    lab.node.ip(&["link", "set", &temp, "netns", lab.pod.name()]);
    assert!(ours(&lab, "ADD", &c).success(), "a random temporary name is tried next");
    assert!(ours(&lab, "DEL", &c).success());
    assert_eq!(lab.pod.links().len(), 1, "only lo: the leftover went with the DEL too");
}
