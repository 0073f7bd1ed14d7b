//! Multus's cache read as Multus's DEL reads it. The fixtures (plugins/plexus/tests/multus, its
//! README says what each is): a cache the real Multus v4.2.3 wrote, and one in its encoding with
//! the fields a plain pod does not use — a cluster network (a conflist), a macvlan with the MAC
//! and IP the selection asked for, a host-device with a device ID, a requested interface name and
//! a gateway — with libcni's cached result of the macvlan.

use std::path::Path;

use serde_json::json;

use super::*;

const CACHE: &str = include_str!("../../tests/multus/v4-fields-cache.json");
const RESULT: &str = include_str!("../../tests/multus/v4-fields-result.json");
const REAL: &str = include_str!("../../tests/multus/v4.2.3-thin-cache.json");

fn multus_dir(dir: &Path, container_id: &str) {
    std::fs::write(dir.join(container_id), CACHE).unwrap();
    std::fs::create_dir_all(dir.join("results")).unwrap();
    std::fs::write(dir.join("results").join(format!("rail0-{container_id}-net1")), RESULT).unwrap();
}

#[test]
fn each_delegate_gets_the_interface_multus_gave_it_and_the_conf_it_ran() {
    let dir = tempfile::tempdir().unwrap();
    multus_dir(dir.path(), "0123abcd");
    let s = Sandbox::load(dir.path(), "0123abcd", "eth0").unwrap().unwrap();
    let got: Vec<_> =
        s.attachments.iter().map(|a| (a.network.as_str(), a.ifname.as_str(), a.cluster_network)).collect();
    // The first on the runtime's interface, the second `net<index>`, the third its request.
    assert_eq!(got, [("cbr0", "eth0", true), ("rail0", "net1", false), ("exclusive", "rdma0", false)]);
    assert_eq!(s.attachments[0].conf["plugins"][1]["type"], "portmap");
    assert_eq!(s.attachments[1].conf["master"], "ens1f0np0");
    assert_eq!(s.attachments[2].conf["deviceID"], "0000:3b:00.1");
}

/// Multus v4.2.3's own cache: the cluster network's conflist as Multus ran it (its bridge's IPAM
/// ranges), not the re-marshalled copy Multus's own DEL runs and fails on; NADs by their conf's
/// name, as libcni names their results.
#[test]
fn a_cache_of_multus_v4_2_3_gives_the_conflist_as_multus_ran_it_not_its_lossy_copy() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("c1"), REAL).unwrap();
    let s = Sandbox::load(dir.path(), "c1", "eth0").unwrap().unwrap();
    let got: Vec<_> =
        s.attachments.iter().map(|a| (a.network.as_str(), a.ifname.as_str(), a.cluster_network)).collect();
    assert_eq!(got, [("bootstrap", "eth0", true), ("w-rail", "net1", false), ("w-dev", "net2", false)]);
    let bridge = &s.attachments[0].conf["plugins"][0];
    assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], "198.19.251.0/24");
    assert_eq!(s.attachments[2].conf["device"], "ens2f0np0");
}

#[test]
fn a_delegate_keeps_the_capability_arguments_and_the_result_multus_ran_it_with() {
    let dir = tempfile::tempdir().unwrap();
    multus_dir(dir.path(), "0123abcd");
    let s = Sandbox::load(dir.path(), "0123abcd", "eth0").unwrap().unwrap();
    let rail = &s.attachments[1];
    assert_eq!(
        Value::Object(rail.capability_args.clone()),
        json!({"mac": "02:00:00:00:00:11", "ips": ["198.19.0.7/24"]})
    );
    assert_eq!(rail.result.as_ref().unwrap()["ips"][0]["address"], "198.19.0.7/24");
    let device = &s.attachments[2];
    assert_eq!(Value::Object(device.capability_args.clone()), json!({"deviceID": "0000:3b:00.1"}));
    assert_eq!(device.resource_name.as_deref(), Some("example.com/roce"));
    assert_eq!(device.default_route, Some(vec!["198.19.1.1".parse().unwrap()]));
    assert!(device.result.is_none(), "no cached result: DEL without prevResult");
}

#[test]
fn removing_a_sandbox_takes_multus_cache_and_results_of_that_container_only() {
    let dir = tempfile::tempdir().unwrap();
    multus_dir(dir.path(), "0123abcd");
    multus_dir(dir.path(), "4567ef01");
    Sandbox::load(dir.path(), "0123abcd", "eth0").unwrap().unwrap().remove();
    assert!(!dir.path().join("0123abcd").exists());
    assert!(!dir.path().join("results/rail0-0123abcd-net1").exists());
    assert!(dir.path().join("4567ef01").exists());
    assert!(dir.path().join("results/rail0-4567ef01-net1").exists());
}

#[test]
fn no_cache_is_none_and_a_file_that_is_not_multus_cache_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    assert!(Sandbox::load(dir.path(), "c1", "eth0").unwrap().is_none());
    for (bytes, why) in [
        ("{\"version\": 1, \"containerID\": \"c1\", \"attachments\": []}", "not a Multus delegate cache"),
        ("[]", "no delegate"),
        ("[{\"Name\": \"x\"}]", "no \"Bytes\""),
        ("[{\"Name\": \"x\", \"Bytes\": \"bm90IGpzb24=\"}]", "not a conf"),
    ] {
        std::fs::write(dir.path().join("c1"), bytes).unwrap();
        let err = Sandbox::load(dir.path(), "c1", "eth0").unwrap_err();
        assert!(err.contains(why) && err.contains("/c1"), "{bytes}: {err}");
    }
}

#[test]
fn a_symlink_or_a_huge_file_in_multus_directory_is_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = dir.path().join("elsewhere");
    std::fs::write(&elsewhere, CACHE).unwrap();
    std::os::unix::fs::symlink(&elsewhere, dir.path().join("c1")).unwrap();
    assert!(Sandbox::load(dir.path(), "c1", "eth0").is_err());
    let huge = std::fs::File::create(dir.path().join("c2")).unwrap();
    huge.set_len(MAX_BYTES + 1).unwrap();
    assert!(Sandbox::load(dir.path(), "c2", "eth0").unwrap_err().contains("larger than"));
}

#[test]
fn every_multus_cache_of_a_directory_is_found_and_other_files_named() {
    let dir = tempfile::tempdir().unwrap();
    multus_dir(dir.path(), "0123abcd");
    std::fs::write(dir.path().join("notmultus"), "{}").unwrap();
    std::fs::write(dir.path().join(".hidden"), "{}").unwrap();
    let (read, unread) = Sandbox::all(dir.path());
    assert_eq!(read.iter().map(|s| s.container_id.as_str()).collect::<Vec<_>>(), ["0123abcd"]);
    assert_eq!(unread, ["notmultus"], "the results directory and dot files are not caches");
}

/// What plexus writes for Multus is what Multus's DEL reads back: the same delegates, interfaces,
/// confs (a list's plugins where Multus looks for them) and capability arguments.
#[test]
fn the_cache_written_for_multus_reads_back_as_the_attachments_plexus_ran() {
    let dir = tempfile::tempdir().unwrap();
    multus_dir(dir.path(), "0123abcd");
    let ran = Sandbox::load(dir.path(), "0123abcd", "eth0").unwrap().unwrap().attachments;
    let path = write(&dir.path().join("again"), "c2", &ran).unwrap();
    let written: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    // Multus's DEL takes a delegate with plugins in "ConfList" for a list, else a single conf.
    assert_eq!(written[0]["ConfList"]["plugins"][0]["type"], "bridge");
    assert_eq!(written[1]["ConfList"]["plugins"], Value::Null);
    assert_eq!(written[1]["Conf"]["type"], "macvlan");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    let back = Sandbox::load(&dir.path().join("again"), "c2", "eth0").unwrap().unwrap().attachments;
    let view = |a: &[Attachment]| -> Vec<Value> {
        a.iter()
            .map(|a| {
                json!([
                    a.network,
                    a.ifname,
                    a.cluster_network,
                    a.conf,
                    a.capability_args,
                    a.device_id,
                    a.resource_name,
                    a.default_route
                ])
            })
            .collect()
    };
    assert_eq!(view(&back), view(&ran));
}

/// A NAD's network name and an annotation's interface name are tenants': one that would leave the
/// results directory never becomes a path plexus reads or removes.
#[test]
fn a_network_name_that_would_leave_the_results_directory_is_neither_read_nor_removed() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim-c1-net1");
    std::fs::write(&victim, "{}").unwrap();
    let conf = json!({"cniVersion": "1.0.0", "name": "../victim", "type": "macvlan"});
    let bytes = base64::engine::general_purpose::STANDARD.encode(conf.to_string());
    let cache = json!([{"Name": "x", "Bytes": bytes}, {"Name": "y", "ifnameRequest": "../../x", "Bytes": bytes}]);
    std::fs::write(dir.path().join("c1"), cache.to_string()).unwrap();
    let s = Sandbox::load(dir.path(), "c1", "net1").unwrap().unwrap();
    assert_eq!(s.attachments.len(), 2);
    s.remove();
    assert!(victim.exists(), "outside the results directory: not removed");
    assert!(!dir.path().join("c1").exists());
}
