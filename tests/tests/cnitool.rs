//! The real cnitool (built from Debian's source package by scripts/tools/build-cnitool.sh)
//! drives plexus in standalone mode: a conflist whose plugin is `plexus` with `nadDir` and
//! `networks`, selecting a plexus-macvlan + plexus-ipam NAD. cnitool is libcni's own client: it
//! derives the container ID, caches the result and sends it back as prevResult on CHECK and DEL.

use std::process::Command;

use plexus_tests::runner::enter_netns;
use plexus_tests::{Lab, plugin_bin, tool_bin};
use serde_json::{Value, json};

/// libcni (in cnitool) keeps its result cache in /var/lib/cni/results; `del` removes the entry.
fn cnitool(lab: &Lab, verb: &str, netconf: &std::path::Path) -> (bool, String) {
    let mut cmd = Command::new(tool_bin("cnitool"));
    cmd.args([verb, "roce"])
        .arg(lab.pod.path())
        .env("NETCONFPATH", netconf)
        .env("CNI_PATH", plugin_bin("plexus").parent().unwrap())
        .env("CNI_IFNAME", "eth0");
    enter_netns(&mut cmd, &lab.node.path());
    let out = cmd.output().expect("run cnitool");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn cnitool_adds_checks_and_deletes_through_plexus_standalone() {
    let lab = Lab::new();
    lab.add_nic("nic0", 9000);
    let dir = tempfile::tempdir().unwrap();
    let nads = dir.path().join("nads");
    std::fs::create_dir_all(&nads).unwrap();
    let nad_conf = json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic0",
        "ipam": {"type": "plexus-ipam", "range": "198.18.70.0/24", "dataDir": dir.path().join("ipam")}});
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
    assert_eq!(std::fs::read_dir(dir.path().join("ipam/default/ips")).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(dir.path().join("cache")).unwrap().count(), 0);
}
