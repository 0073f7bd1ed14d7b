//! Every verb of plexus-net's real socket, called through the `Kernel` trait the plugins use, on
//! the kernel in throwaway namespaces; what each one did is read back independently, with
//! `ip -j` and /proc/sys (`plexus_tests::kernel`). The plugins' unit tests run the same verbs on
//! the recording fake: these tests are what keeps the fake honest.

use plexus_net::{Dad, IpFamily, Kernel, LinkChange, LinkSocket, MacvlanMode, NewMacvlan, RouteSpec, RuleSpec};
use plexus_tests::{Lab, require_root};

/// Run `f` with a socket in `ns` (and the namespace handle), on the plugins' runtime.
fn with_socket<T>(ns: &plexus_tests::Netns, f: impl AsyncFnOnce(&LinkSocket, &plexus_net::Netns) -> T) -> T {
    let netns = plexus_net::Netns::open(&ns.path()).expect("open netns");
    plexus_net::configure::runtime().unwrap().block_on(async {
        let sock = LinkSocket::open(&netns).expect("socket in netns");
        f(&sock, &netns).await
    })
}

fn lab() -> Lab {
    require_root();
    let lab = Lab::new();
    lab.add_nic("nic0", 9000);
    lab
}

#[test]
fn links_are_found_by_name_and_index_and_listed_and_a_missing_one_is_none() {
    let lab = lab();
    let want = lab.node.link("nic0").unwrap();
    with_socket(&lab.node, async |sock, _| {
        let l = sock.link("nic0").await.unwrap().expect("nic0");
        assert_eq!((l.index, l.mtu, l.mac_string().unwrap(), l.up), (want.ifindex, 9000, want.address.clone(), true));
        assert_eq!(l.kind.as_deref(), Some("veth"));
        assert_eq!(sock.link_by_index(l.index).await.unwrap(), Some(l.clone()));
        assert!(sock.links().await.unwrap().iter().any(|k| k.name == "nic0"));
        assert_eq!(sock.link("absent0").await.unwrap(), None);
        assert_eq!(sock.link_by_index(999_999).await.unwrap(), None);
    });
}

#[test]
fn a_macvlan_is_created_straight_in_another_namespace_with_its_settings_and_once() {
    let lab = lab();
    let pod = plexus_net::Netns::open(&lab.pod.path()).unwrap();
    with_socket(&lab.node, async |sock, _| {
        let parent = sock.link("nic0").await.unwrap().unwrap();
        let spec = NewMacvlan {
            name: "mv0",
            parent_index: parent.index,
            mode: MacvlanMode::Private,
            mtu: Some(1500),
            mac: Some([0x02, 0, 0, 0, 0x0a, 0x01]),
            bcqueuelen: None,
            netns: Some(&pod),
        };
        sock.add_macvlan(&spec).await.unwrap();
        assert!(sock.link("mv0").await.unwrap().is_none(), "not in the node namespace");
        // The pod's namespace has one now: a second create there is EEXIST.
        assert!(sock.add_macvlan(&spec).await.unwrap_err().is_exists());
    });
    let mv = lab.pod.link("mv0").expect("in the pod");
    assert_eq!((mv.kind(), mv.macvlan_mode(), mv.mtu), (Some("macvlan"), Some("private"), 1500));
    assert_eq!(mv.address, "02:00:00:00:0a:01");
}

#[test]
fn set_link_renames_sets_mtu_mac_alias_state_and_ipv4_settings_zero_included_in_one_request() {
    let lab = lab();
    let index = lab.node.link("nic0").unwrap().ifindex;
    with_socket(&lab.node, async |sock, _| {
        let change = LinkChange {
            name: Some("rail0"),
            mtu: Some(4200),
            mac: Some([0x02, 0, 0, 0, 0x0b, 0x02]),
            alias: Some("plexus-test"),
            up: Some(false),
            ipv4_conf: Some(plexus_net::link::Ipv4Conf {
                arp_notify: Some(1),
                arp_ignore: Some(1),
                arp_announce: Some(2),
                rp_filter: Some(2),
            }),
            ..Default::default()
        };
        sock.set_link(index, &change).await.unwrap();
    });
    let l = lab.node.link("rail0").expect("renamed");
    assert_eq!(
        (l.mtu, l.address.as_str(), l.ifalias.as_deref(), l.is_up()),
        (4200, "02:00:00:00:0b:02", Some("plexus-test"), false)
    );
    for (key, want) in [("arp_notify", "1"), ("arp_ignore", "1"), ("arp_announce", "2"), ("rp_filter", "2")] {
        assert_eq!(lab.node.sysctl(&format!("net.ipv4.conf.rail0.{key}")), want, "{key}");
    }
    // A setting can be put back to 0 (netlink-packet-route alone would drop a zero).
    with_socket(&lab.node, async |sock, _| {
        let off = plexus_net::link::Ipv4Conf { rp_filter: Some(0), ..Default::default() };
        sock.set_link(index, &LinkChange { ipv4_conf: Some(off), ..Default::default() }).await.unwrap();
    });
    assert_eq!(lab.node.sysctl("net.ipv4.conf.rail0.rp_filter"), "0");
    assert_eq!(lab.node.sysctl("net.ipv4.conf.rail0.arp_ignore"), "1", "the others are left as they were");
}

#[test]
fn set_link_moves_a_link_into_another_namespace_renamed_and_a_taken_name_fails_after_the_move() {
    let lab = lab();
    let pod = plexus_net::Netns::open(&lab.pod.path()).unwrap();
    lab.node.ip(&["link", "add", "hd0", "type", "veth", "peer", "name", "hd0p"]);
    lab.pod.ip(&["link", "add", "net2", "type", "veth", "peer", "name", "net2p"]);
    let nic = lab.node.link("nic0").unwrap().ifindex;
    let hd0 = lab.node.link("hd0").unwrap().ifindex;
    with_socket(&lab.node, async |sock, _| {
        let move_in = LinkChange { netns: Some(&pod), name: Some("net1"), ..Default::default() };
        sock.set_link(nic, &move_in).await.unwrap();
        // The kernel moves first and renames after: a name taken in the target fails the
        // request with the link already there, under its old name (what host-device's
        // rollback relies on finding).
        let taken = LinkChange { netns: Some(&pod), name: Some("net2"), ..Default::default() };
        assert!(sock.set_link(hd0, &taken).await.unwrap_err().is_exists());
    });
    assert!(lab.node.link("nic0").is_none());
    assert!(lab.pod.link("net1").is_some());
    assert!(lab.pod.link("hd0").is_some(), "moved, not renamed");
}

/// What plexus-host-device marks a device with: an alternative name (`:` allowed and longer than
/// a name), listed with its link, moving with it, unique in a namespace.
#[test]
fn an_alternative_name_is_added_listed_moves_with_its_link_and_is_removed() {
    let lab = lab();
    let pod = plexus_net::Netns::open(&lab.pod.path()).unwrap();
    lab.node.ip(&["link", "add", "other0", "type", "veth", "peer", "name", "other0p"]);
    let nic = lab.node.link("nic0").unwrap().ifindex;
    let other = lab.node.link("other0").unwrap().ifindex;
    let marker = "plexus-host-device:nic0:0123456789abcdef";
    with_socket(&lab.node, async |sock, _| {
        sock.set_alt_name(nic, marker, true).await.unwrap();
        let l = sock.links().await.unwrap().into_iter().find(|l| l.alt_names.iter().any(|a| a == marker));
        assert_eq!(l.map(|l| (l.index, l.alt_names)), Some((nic, vec![marker.to_string()])));
        assert!(sock.set_alt_name(other, marker, true).await.unwrap_err().is_exists(), "unique in its namespace");
        let move_in = LinkChange { netns: Some(&pod), name: Some("net1"), alias: Some("nic0"), ..Default::default() };
        sock.set_link(nic, &move_in).await.unwrap();
    });
    assert_eq!(lab.pod.link("net1").unwrap().altnames, [marker], "moved with it");
    assert_eq!(lab.pod.link("net1").unwrap().ifalias.as_deref(), Some("nic0"));
    with_socket(&lab.pod, async |sock, _| {
        let l = sock.link("net1").await.unwrap().unwrap();
        sock.set_alt_name(l.index, marker, false).await.unwrap();
        assert!(sock.set_alt_name(l.index, marker, false).await.is_err(), "already gone");
    });
    assert!(lab.pod.link("net1").unwrap().altnames.is_empty());
}

#[test]
fn delete_link_removes_it_and_a_second_delete_is_not_found() {
    let lab = lab();
    lab.node.ip(&["link", "add", "gone0", "type", "veth", "peer", "name", "gone0p"]);
    let index = lab.node.link("gone0").unwrap().ifindex;
    with_socket(&lab.node, async |sock, _| {
        sock.delete_link(index).await.unwrap();
        assert!(sock.delete_link(index).await.unwrap_err().is_not_found());
    });
    assert!(lab.node.link("gone0").is_none() && lab.node.link("gone0p").is_none());
}

#[test]
fn addresses_are_added_with_their_prefix_listed_per_link_and_a_duplicate_is_refused() {
    let lab = lab();
    let index = lab.node.link("nic0").unwrap().ifindex;
    with_socket(&lab.node, async |sock, _| {
        sock.add_address(index, "198.18.7.2/24".parse().unwrap(), Dad::Skip).await.unwrap();
        sock.add_address(index, "2001:db8:7::2/64".parse().unwrap(), Dad::Skip).await.unwrap();
        assert!(sock.add_address(index, "198.18.7.2/24".parse().unwrap(), Dad::Skip).await.unwrap_err().is_exists());
        let mut got: Vec<String> = sock
            .addresses(index)
            .await
            .unwrap()
            .into_iter()
            .filter(|a| {
                !a.net.ip().is_ipv6() || !matches!(a.net.ip(), std::net::IpAddr::V6(v6) if v6.is_unicast_link_local())
            })
            .map(|a| {
                assert!(!a.tentative, "{} was added without DAD", a.net);
                a.net.to_string()
            })
            .collect();
        got.sort();
        assert_eq!(got, ["198.18.7.2/24", "2001:db8:7::2/64"]);
    });
    let mut ip: Vec<String> = lab.node.addrs("nic0").iter().map(|a| a.cidr()).collect();
    ip.sort();
    assert_eq!(ip, ["198.18.7.2/24", "2001:db8:7::2/64"]);
    let brd = lab.node.ip(&["-4", "addr", "show", "dev", "nic0"]);
    assert!(brd.contains("brd 198.18.7.255"), "an IPv4 address gets its broadcast: {brd}");
}

#[test]
fn routes_go_into_their_table_with_gateway_metric_and_mtu_and_default_routes_are_deleted_per_family() {
    let lab = lab();
    let index = lab.node.link("nic0").unwrap().ifindex;
    with_socket(&lab.node, async |sock, _| {
        sock.add_address(index, "198.18.8.2/24".parse().unwrap(), Dad::Skip).await.unwrap();
        sock.add_address(index, "2001:db8:8::2/64".parse().unwrap(), Dad::Skip).await.unwrap();
        let gw = Some("198.18.8.1".parse().unwrap());
        let rail = RouteSpec {
            table: 1234,
            metric: Some(50),
            mtu: Some(4000),
            ..RouteSpec::new("198.19.0.0/16".parse().unwrap(), gw, index)
        };
        sock.add_route(&rail).await.unwrap();
        assert!(sock.add_route(&rail).await.unwrap_err().is_exists());
        sock.add_route(&RouteSpec::new("0.0.0.0/0".parse().unwrap(), gw, index)).await.unwrap();
        let gw6 = Some("2001:db8:8::1".parse().unwrap());
        sock.add_route(&RouteSpec::new("::/0".parse().unwrap(), gw6, index)).await.unwrap();
        let all = sock.all_routes().await.unwrap();
        let found = all.iter().find(|r| r.table == 1234).expect("the rail route");
        assert_eq!(
            (found.dst, found.gw, found.oif, found.metric, found.mtu),
            (rail.dst, gw, Some(index), Some(50), Some(4000))
        );
        assert_eq!(sock.default_route_link().await.unwrap().map(|l| l.name), Some("nic0".into()));
        assert_eq!(sock.delete_default_routes(index, IpFamily::V4).await.unwrap(), 1);
        assert_eq!(sock.delete_default_routes(index, IpFamily::V4).await.unwrap(), 0);
    });
    let routes = lab.node.routes();
    assert!(routes.iter().any(|r| r.dst == "198.19.0.0/16" && r.table.as_deref() == Some("1234")), "{routes:?}");
    assert!(!routes.iter().any(|r| r.dst == "default" && r.gateway.as_deref() == Some("198.18.8.1")), "{routes:?}");
    assert!(routes.iter().any(|r| r.dst == "default" && r.gateway.as_deref() == Some("2001:db8:8::1")), "IPv6's stays");
}

#[test]
fn rules_are_added_listed_and_deleted_and_a_missing_one_is_not_found() {
    let lab = lab();
    let rule = RuleSpec { src: "198.18.9.5/32".parse().unwrap(), table: 4321, priority: 1000 };
    let rule6 = RuleSpec { src: "2001:db8:9::5/128".parse().unwrap(), table: 4321, priority: 1000 };
    with_socket(&lab.node, async |sock, _| {
        sock.add_rule(&rule).await.unwrap();
        sock.add_rule(&rule6).await.unwrap();
        let mine: Vec<RuleSpec> = sock.rules().await.unwrap().into_iter().filter(|r| r.table == 4321).collect();
        assert_eq!(mine, vec![rule.clone(), rule6.clone()]);
    });
    let ip = lab.node.rules();
    assert!(
        ip.iter().any(|r| r.src.as_deref() == Some("198.18.9.5") && r.table == "4321" && r.priority == 1000),
        "{ip:?}"
    );
    with_socket(&lab.node, async |sock, _| {
        sock.delete_rule(&rule).await.unwrap();
        sock.delete_rule(&rule6).await.unwrap();
        assert!(sock.delete_rule(&rule).await.unwrap_err().is_not_found());
        assert!(sock.rules().await.unwrap().iter().all(|r| r.table != 4321));
    });
}

#[test]
fn sysctls_are_written_in_the_sockets_namespace_only() {
    let lab = lab();
    lab.pod.ip(&["link", "add", "net1", "type", "veth", "peer", "name", "net1p"]);
    lab.node.ip(&["link", "add", "net1", "type", "veth", "peer", "name", "net1p"]);
    with_socket(&lab.pod, async |sock, _| {
        let key = plexus_net::sysctl("ipv6", "net1", "accept_dad");
        sock.write_sysctls(&[(key, "0")]).unwrap();
    });
    assert_eq!(lab.pod.sysctl("net.ipv6.conf.net1.accept_dad"), "0");
    assert_ne!(lab.node.sysctl("net.ipv6.conf.net1.accept_dad"), "0", "the node's own net1 is untouched");
}
