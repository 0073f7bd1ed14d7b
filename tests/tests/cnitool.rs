//! The real cnitool (built from Debian's source package by scripts/tools/build-cnitool.sh)
//! drives plexus in standalone mode: a conflist whose plugin is `plexus` with `nadDir` and
//! `networks`, selecting a plexus-macvlan + plexus-ipam NAD. cnitool is libcni's own client: it
//! derives the container ID, caches the result and sends it back as prevResult on CHECK and DEL.

use std::process::Command;

use plexus_tests::runner::enter_netns;
use plexus_tests::{Lab, plugin_bin, test_policy, tool_bin};
use serde_json::{Value, json};

/// libcni (in cnitool) keeps its result cache in /var/lib/cni/results; `del` removes the entry.
fn cnitool(lab: &Lab, verb: &str, netconf: &std::path::Path) -> (bool, String) {
    let mut cmd = Command::new(tool_bin("cnitool"));
    cmd.args([verb, "roce"])
        .arg(lab.pod.path())
        .env("NETCONFPATH", netconf)
        .env("CNI_PATH", plugin_bin("plexus").parent().unwrap())
        .env("CNI_IFNAME", "eth0")
        .env("PLEXUS_POLICY", test_policy());
    enter_netns(&mut cmd, &lab.node.path());
    let out = cmd.output().expect("run cnitool");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn cnitool_adds_checks_and_deletes_through_plexus_standalone() {
    let lab = Lab::new();
    lab.add_nic("nic0", 9000);
    let dir = tempfile::tempdir().unwrap();
    let dir_ipam = plexus_tests::DataDir::new("ipam");
    let nads = dir.path().join("nads");
    std::fs::create_dir_all(&nads).unwrap();
    let nad_conf = json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic0",
        "ipam": {"type": "plexus-ipam", "range": "198.18.70.0/24", "dataDir": dir_ipam.path()}});
    std::fs::write(
        nads.join("rail0.yaml"),
        format!("apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata:\n  name: rail0\nspec:\n  config: '{nad_conf}'\n"),
    )
    .unwrap();
    let netconf = dir.path().join("net.d");
    std::fs::create_dir_all(&netconf).unwrap();
    let list = json!({"cniVersion": "1.0.0", "name": "roce", "plugins": [{"type": "plexus", "nadDir": nads,
        "networks": "rail0", "cniDir": dir.path().join("cache"), "binDir": plugin_bin("plexus").parent().unwrap()}]});
    std::fs::write(netconf.join("10-roce.conflist"), list.to_string()).unwrap();

    let (ok, out) = cnitool(&lab, "add", &netconf);
    assert!(ok, "cnitool add: {out}");
    let result: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(result["interfaces"][0]["name"], "net1");
    assert_eq!(result["ips"][0]["address"], "198.18.70.1/24");
    assert_eq!(lab.pod.addrs("net1")[0].cidr(), "198.18.70.1/24");
    assert_eq!(lab.pod.link("net1").unwrap().mtu, 9000);

    let (ok, out) = cnitool(&lab, "check", &netconf);
    assert!(ok, "cnitool check: {out}");
    let (ok, out) = cnitool(&lab, "del", &netconf);
    assert!(ok, "cnitool del: {out}");
    assert!(lab.pod.link("net1").is_none());
    assert!(!dir_ipam.path().exists(), "the store went with its last attachment");
    assert_eq!(std::fs::read_dir(dir.path().join("cache")).unwrap().count(), 0);
}

/// cnitool against a conflist in `dir` named `name`, inside the node namespace.
fn cnitool_net(
    lab: &Lab,
    verb: &str,
    name: &str,
    netconf: &std::path::Path,
    ifname: &str,
    sysfs: Option<&std::path::Path>,
) -> (bool, String) {
    let mut cmd = Command::new(tool_bin("cnitool"));
    cmd.args([verb, name])
        .arg(lab.pod.path())
        .env("NETCONFPATH", netconf)
        .env("CNI_PATH", format!("{}:/usr/lib/cni", plugin_bin("plexus").parent().unwrap().display()))
        .env("CNI_IFNAME", ifname)
        .env("PLEXUS_POLICY", test_policy());
    if let Some(s) = sysfs {
        cmd.env("PLEXUS_SYSFS_ROOT", s);
    }
    enter_netns(&mut cmd, &lab.node.path());
    let out = cmd.output().expect("run cnitool");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn cnitool_runs_a_plexus_host_device_conflist() {
    let lab = Lab::new();
    lab.add_nic("ens3f0", 9000);
    lab.node.ip(&["addr", "add", "198.18.72.5/24", "dev", "ens3f0"]);
    let dir = tempfile::tempdir().unwrap();
    let dir_state = plexus_tests::DataDir::new("state");
    let dir_ipam = plexus_tests::DataDir::new("ipam");
    let netconf = dir.path().join("net.d");
    std::fs::create_dir_all(&netconf).unwrap();
    let list = json!({"cniVersion": "1.0.0", "name": "hostdev", "plugins": [{"type": "plexus-host-device", "device": "ens3f0",
        "dataDir": dir_state.path(),
        "ipam": {"type": "plexus-ipam", "range": "198.18.73.0/24", "dataDir": dir_ipam.path()}}]});
    std::fs::write(netconf.join("30-hostdev.conflist"), list.to_string()).unwrap();
    let before = lab.node.link("ens3f0").unwrap();
    let (ok, out) = cnitool_net(&lab, "add", "hostdev", &netconf, "net1", None);
    assert!(ok, "{out}");
    assert!(lab.node.link("ens3f0").is_none());
    assert_eq!(lab.pod.addrs("net1")[0].cidr(), "198.18.73.1/24");
    let (ok, out) = cnitool_net(&lab, "check", "hostdev", &netconf, "net1", None);
    assert!(ok, "{out}");
    let (ok, out) = cnitool_net(&lab, "del", "hostdev", &netconf, "net1", None);
    assert!(ok, "{out}");
    let after = lab.node.link("ens3f0").expect("back on the host");
    assert_eq!((after.mtu, &after.address, after.is_up()), (before.mtu, &before.address, before.is_up()));
    assert_eq!(lab.node.addrs("ens3f0")[0].cidr(), "198.18.72.5/24");
}

#[test]
fn cnitool_runs_plexus_macvlan_chained_with_reference_tuning() {
    let lab = Lab::new();
    lab.add_nic("nic0", 9000);
    let dir = tempfile::tempdir().unwrap();
    let dir_ipam = plexus_tests::DataDir::new("ipam");
    let netconf = dir.path().join("net.d");
    std::fs::create_dir_all(&netconf).unwrap();
    let list = json!({"cniVersion": "1.0.0", "name": "tuned", "plugins": [
        {"type": "plexus-macvlan", "master": "nic0",
         "ipam": {"type": "plexus-ipam", "range": "198.18.74.0/24", "dataDir": dir_ipam.path()}},
        {"type": "tuning", "promisc": true, "sysctl": {"net.ipv4.conf.net1.arp_filter": "1"}}]});
    std::fs::write(netconf.join("40-tuned.conflist"), list.to_string()).unwrap();
    let (ok, out) = cnitool_net(&lab, "add", "tuned", &netconf, "net1", None);
    assert!(ok, "{out}");
    let result: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(result["ips"][0]["address"], "198.18.74.1/24", "tuning passes plexus-macvlan's result on");
    let net1 = lab.pod.link("net1").unwrap();
    assert!(net1.flags.iter().any(|f| f == "PROMISC"), "tuning ran after plexus-macvlan: {:?}", net1.flags);
    assert_eq!(net1.mtu, 9000);
    assert_eq!(lab.pod.sysctl("net.ipv4.conf.net1.arp_filter"), "1");
    let (ok, out) = cnitool_net(&lab, "check", "tuned", &netconf, "net1", None);
    assert!(ok, "{out}");
    let (ok, out) = cnitool_net(&lab, "del", "tuned", &netconf, "net1", None);
    assert!(ok, "{out}");
    assert!(lab.pod.link("net1").is_none());
}
