//! Discovery on a fake sysfs: what is offered, with which facts, and what is left out and why.

use std::os::unix::fs::symlink;
use std::path::Path;

use super::*;

/// A PCI function `bdf` under root complex `root` with netdev `ifname`, RDMA device `rdma`
/// (`uverbs`), NUMA node `numa`; `vf_of` makes it a VF of that function.
fn pci_nic(
    sys: &Path,
    root: &str,
    bdf: &str,
    ifname: &str,
    rdma: Option<(&str, &str)>,
    numa: i64,
    vf_of: Option<&str>,
) {
    let dev = sys.join("devices").join(root).join(format!("{}:00.0", &root[3..])).join(bdf);
    std::fs::create_dir_all(dev.join("net").join(ifname)).unwrap();
    std::fs::write(dev.join("numa_node"), format!("{numa}\n")).unwrap();
    if let Some((name, uverbs)) = rdma {
        std::fs::create_dir_all(dev.join("infiniband").join(name)).unwrap();
        std::fs::create_dir_all(dev.join("infiniband_verbs").join(uverbs)).unwrap();
    }
    if let Some(pf) = vf_of {
        symlink(sys.join("bus/pci/devices").join(pf), dev.join("physfn")).unwrap();
    }
    std::fs::create_dir_all(sys.join("bus/pci/devices")).unwrap();
    symlink(&dev, sys.join("bus/pci/devices").join(bdf)).unwrap();
    std::fs::create_dir_all(sys.join("class/net").join(ifname)).unwrap();
    symlink(&dev, sys.join("class/net").join(ifname).join("device")).unwrap();
    std::fs::write(sys.join("class/net").join(ifname).join("speed"), "400000\n").unwrap();
}

fn link(index: u32, name: &str) -> Link {
    Link {
        index,
        name: name.into(),
        mtu: 9000,
        mac: Some([2, 0, 0, 0, 0, index as u8]),
        up: true,
        parent: None,
        alias: None,
        alt_names: Vec::new(),
        kind: None,
        macvlan_mode: None,
        master: None,
    }
}

struct Node {
    _dir: tempfile::TempDir,
    sysfs: Sysfs,
    links: Vec<Link>,
}

/// rail0 (PF, pci0000:3a, NUMA 0) and rail1 (VF of rail0's PF's neighbour, pci0000:3a), rail2
/// (PF, pci0000:9a, NUMA 1), eth0 (the uplink, RDMA-capable) and its SF-like sibling uplink1 on
/// the same PCI function, bport (a bridge port), plain (no RDMA device), veth0 (no device).
fn node() -> Node {
    let dir = tempfile::tempdir().unwrap();
    let sys = dir.path().join("sys");
    pci_nic(&sys, "pci0000:3a", "0000:3b:00.0", "rail0", Some(("mlx5_0", "uverbs0")), 0, None);
    pci_nic(&sys, "pci0000:3a", "0000:3b:00.1", "pf1", None, 0, None);
    pci_nic(&sys, "pci0000:3a", "0000:3b:00.2", "rail1", Some(("mlx5_2", "uverbs2")), 0, Some("0000:3b:00.1"));
    pci_nic(&sys, "pci0000:9a", "0000:9b:00.0", "rail2", Some(("mlx5_3", "uverbs3")), 1, None);
    pci_nic(&sys, "pci0000:00", "0000:01:00.0", "eth0", Some(("mlx5_9", "uverbs9")), 0, None);
    // A second netdev of the uplink's PCI function (as a sub-function or representor shows).
    let uplink_dev = std::fs::canonicalize(sys.join("bus/pci/devices/0000:01:00.0")).unwrap();
    std::fs::create_dir_all(sys.join("class/net/uplink1")).unwrap();
    symlink(&uplink_dev, sys.join("class/net/uplink1/device")).unwrap();
    pci_nic(&sys, "pci0000:9a", "0000:9b:00.1", "bport", Some(("mlx5_4", "uverbs4")), 1, None);
    pci_nic(&sys, "pci0000:9a", "0000:9b:00.2", "plain", None, 1, None);
    let mut links: Vec<Link> = ["rail0", "pf1", "rail1", "rail2", "eth0", "uplink1", "bport", "plain", "veth0"]
        .iter()
        .enumerate()
        .map(|(i, n)| link(i as u32 + 2, n))
        .collect();
    links.iter_mut().find(|l| l.name == "bport").unwrap().master = Some(99);
    Node { sysfs: Sysfs::new(&sys), links, _dir: dir }
}

fn run(node: &Node, policy: &Policy, shared: &[&str]) -> (Vec<Nic>, Vec<Skipped>) {
    let shared: Vec<String> = shared.iter().map(|s| s.to_string()).collect();
    let eth0 = node.links.iter().find(|l| l.name == "eth0").unwrap().index;
    discover(&NodeView { links: &node.links, default_route: &[eth0], sysfs: &node.sysfs, policy, shared: &shared })
}

#[test]
fn rdma_ports_are_offered_with_their_pcie_root_numa_node_function_and_verbs() {
    let node = node();
    let (nics, _) = run(&node, &Policy::default(), &[]);
    let names: Vec<&str> = nics.iter().map(|n| n.ifname.as_str()).collect();
    assert_eq!(names, ["rail0", "rail1", "rail2"]);
    let rail0 = &nics[0];
    assert_eq!(rail0.device, "rail0");
    assert_eq!(rail0.mode, Mode::Exclusive);
    assert_eq!(rail0.pci_address, "0000:3b:00.0");
    assert_eq!(rail0.pcie_root.as_deref(), Some("pci0000:3a"));
    assert_eq!(rail0.numa_node, Some(0));
    assert_eq!(rail0.function, "pf");
    assert_eq!(rail0.rdma_device, "mlx5_0");
    assert_eq!(rail0.uverbs, ["uverbs0"]);
    assert_eq!(rail0.speed_mbps, Some(400_000));
    assert_eq!(rail0.mtu, 9000);
    assert_eq!(nics[1].function, "vf");
    assert_eq!(nics[2].pcie_root.as_deref(), Some("pci0000:9a"));
    assert_eq!(nics[2].numa_node, Some(1));
}

#[test]
fn the_uplink_its_pci_siblings_and_bridge_ports_are_left_out_with_why() {
    let node = node();
    let (_, skipped) = run(&node, &Policy::default(), &[]);
    let why = |n: &str| skipped.iter().find(|s| s.ifname == n).map(|s| s.why.clone()).unwrap_or_default();
    assert!(why("eth0").contains("default route"), "{skipped:?}");
    assert!(why("uplink1").contains("shares PCI function 0000:01:00.0"), "{skipped:?}");
    assert!(why("bport").contains("bridge or bond"), "{skipped:?}");
    // No RDMA device, or no device at all: not a RoCE port, not worth a word.
    assert!(skipped.iter().all(|s| !["plain", "veth0", "pf1"].contains(&s.ifname.as_str())), "{skipped:?}");
}

#[test]
fn the_node_policy_decides_which_ports_each_mode_may_offer() {
    let node = node();
    let policy = Policy::parse(br#"{"allow": {"devices": ["rail0", "rail2"], "pciAddresses": ["0000:3b:*", "0000:9b:*"], "parents": ["rail1"]}}"#)
        .unwrap();
    let (nics, skipped) = run(&node, &policy, &["rail1", "rail2"]);
    let offered: Vec<(&str, Mode)> = nics.iter().map(|n| (n.ifname.as_str(), n.mode)).collect();
    assert_eq!(offered, [("rail0", Mode::Exclusive), ("rail1", Mode::Shared)]);
    let rail2 = skipped.iter().find(|s| s.ifname == "rail2").expect("rail2 skipped");
    assert!(rail2.why.contains("not allowed by the node policy") && rail2.why.contains("rail2"), "{rail2:?}");
}

#[test]
fn netdev_names_become_dns_labels_and_changed_ones_stay_apart() {
    assert_eq!(device_name("ens1f0np0"), "ens1f0np0");
    let (a, b) = (device_name("eth_0"), device_name("eth.0"));
    assert!(a.starts_with("eth-0-") && b.starts_with("eth-0-") && a != b, "{a} {b}");
    assert!(device_name("Rail0").starts_with("rail0-"));
    for n in ["-x-", "_", "ABCDEFGHIJKLMNO"] {
        let d = device_name(n);
        assert!(d.len() <= 63 && d.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'), "{d}");
        assert!(!d.starts_with('-') && !d.ends_with('-'), "{d}");
    }
}
