//! The harness itself: what later plugin tests rely on must hold.

use std::os::unix::fs::PermissionsExt;

use plexus_tests::{Lab, Netns, PluginRun};

#[test]
fn a_nic_is_a_veth_in_the_node_namespace_with_its_mtu_and_up() {
    let lab = Lab::new();
    lab.add_nic("nic0", 9000);
    let nic = lab.node.link("nic0").expect("nic0 in node");
    assert_eq!(nic.kind(), Some("veth"));
    assert_eq!(nic.mtu, 9000);
    assert!(nic.is_up());
    assert!(lab.fabric.link("nic0").is_some(), "peer in the fabric namespace");
    assert!(lab.pod.link("nic0").is_none());
}

#[test]
fn namespaces_are_removed_on_drop_and_on_panic() {
    let names = std::thread::spawn(|| {
        let lab = Lab::new();
        let names = [lab.node.name().to_string(), lab.pod.name().to_string(), lab.fabric.name().to_string()];
        for n in &names {
            assert!(Netns::exists(n));
        }
        std::panic::panic_any(names)
    })
    .join()
    .expect_err("the thread panicked")
    .downcast::<[String; 3]>()
    .unwrap();
    for n in names.iter() {
        assert!(!Netns::exists(n), "{n} survived a panic");
    }
}

#[test]
fn the_runner_execs_the_plugin_inside_the_node_namespace() {
    let lab = Lab::new();
    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("probe");
    std::fs::write(&probe, "#!/bin/sh\nreadlink /proc/self/ns/net\necho \"$CNI_COMMAND $CNI_IFNAME\"\ncat\n").unwrap();
    std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out =
        PluginRun::new(&probe, "ADD").env("CNI_IFNAME", "net1").stdin_raw(b"stdin-bytes").in_netns(&lab.node).run();
    assert!(out.success(), "{}", out.stderr);
    let node_ns = std::fs::read_link(format!("/proc/{}/ns/net", std::process::id())).unwrap();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_ne!(lines[0], node_ns.to_str().unwrap(), "must not run in the test's own namespace");
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(lab.node.path()).unwrap().ino();
    assert_eq!(lines[0], format!("net:[{ino}]"));
    assert_eq!(lines[1], "ADD net1");
    assert_eq!(lines[2], "stdin-bytes");
}

#[test]
fn kernel_readers_see_addresses_routes_and_rules() {
    let lab = Lab::new();
    lab.add_nic("nic0", 9000);
    lab.node.ip(&["addr", "add", "198.18.5.2/24", "dev", "nic0"]);
    lab.node.ip(&["addr", "add", "2001:db8:5::2/64", "dev", "nic0", "nodad"]);
    lab.node.ip(&["route", "add", "198.19.0.0/16", "via", "198.18.5.1", "dev", "nic0", "table", "105"]);
    lab.node.ip(&["rule", "add", "from", "198.18.5.2/32", "lookup", "105", "priority", "1005"]);
    let addrs: Vec<String> = lab.node.addrs("nic0").iter().map(|a| a.cidr()).collect();
    assert_eq!(addrs, ["198.18.5.2/24", "2001:db8:5::2/64"]);
    let routes = lab.node.routes();
    assert!(
        routes.iter().any(|r| r.dst == "198.19.0.0/16"
            && r.gateway.as_deref() == Some("198.18.5.1")
            && r.table.as_deref() == Some("105")),
        "{routes:?}"
    );
    let rule = lab.node.rules().into_iter().find(|r| r.priority == 1005).expect("rule");
    assert_eq!((rule.src.as_deref(), rule.table.as_str()), (Some("198.18.5.2"), "105"));
    assert_eq!(lab.node.sysctl("net.ipv4.conf.nic0.arp_ignore"), "0");
}

#[test]
fn a_test_that_needs_root_fails_without_it_and_never_reports_a_pass() {
    plexus_tests::require_root();
    // This test binary, one of its namespace tests, run as nobody (setpriv, util-linux).
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "a_nic_is_a_veth_in_the_node_namespace_with_its_mtu_and_up", "--test-threads=1"])
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "passed without root:\n{text}");
    assert!(text.contains("this test needs root"), "{text}");
    assert!(text.contains("1 failed"), "{text}");
}
