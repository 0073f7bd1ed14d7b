//! plexus-ipam's verbs and its request parsing, called as functions on the file store in a
//! temporary directory: no root, no process. `tests/tests/ipam.rs` runs the binary, beside
//! host-local and whereabouts.

use plexus_node::policy::Policy;
use plexus_plugin::testing;
use serde_json::{Value, json};

use super::*;

struct Rig {
    dir: tempfile::TempDir,
}

impl Rig {
    fn new() -> Rig {
        Rig { dir: tempfile::tempdir().unwrap() }
    }

    fn config(&self, range: &str) -> Value {
        json!({"cniVersion": "1.0.0", "name": "rdma", "type": "plexus-macvlan",
            "ipam": {"type": "plexus-ipam", "range": range, "dataDir": self.dir.path().join("ipam"), "nodeName": "n1"}})
    }

    fn request(&self, command: &str, container: &str, args: &str, config: &Value) -> Request {
        let bin = self.dir.path().display().to_string();
        let vars = [
            ("CNI_PATH", bin.as_str()),
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", container),
            ("CNI_NETNS", "/var/run/netns/pod"),
            ("CNI_IFNAME", "net1"),
            ("CNI_ARGS", args),
        ];
        let policy = Policy::parse(json!({"dataRoots": [self.dir.path()]}).to_string().as_bytes()).unwrap();
        testing::request(&vars, config, policy)
    }

    fn add(&self, container: &str, args: &str, config: &Value) -> Result<CniResult, Error> {
        Ipam.add(&self.request("ADD", container, args, config))
    }
}

fn addresses(r: &CniResult) -> Vec<String> {
    r.ips.iter().map(|i| i.address.to_string()).collect()
}

#[test]
fn add_takes_the_first_free_address_and_the_same_attachment_gets_it_again() {
    let rig = Rig::new();
    let c = rig.config("198.18.4.0/29");
    let first = rig.add("c1", "", &c).unwrap();
    assert_eq!(addresses(&first), ["198.18.4.1/29"]);
    assert_eq!(addresses(&rig.add("c1", "", &c).unwrap()), ["198.18.4.1/29"], "idempotent per attachment");
    assert_eq!(addresses(&rig.add("c2", "", &c).unwrap()), ["198.18.4.2/29"]);
}

#[test]
fn a_pod_named_in_cni_args_keeps_its_address_across_a_new_sandbox() {
    let rig = Rig::new();
    let c = rig.config("198.18.4.0/29");
    let pod = "K8S_POD_NAMESPACE=ml;K8S_POD_NAME=trainer-0";
    let first = rig.add("sandbox1", pod, &c).unwrap();
    let again = rig.add("sandbox2", pod, &c).unwrap();
    assert_eq!(addresses(&first), addresses(&again));
    let req = rig.request("ADD", "s", pod, &c);
    let cfg = IpamConfig::from_netconf(&req.config, &req.policy).unwrap();
    assert_eq!(owner(&req, &cfg).pod_ref.as_deref(), Some("ml/trainer-0"));
    assert_eq!(owner(&rig.request("ADD", "s", "", &c), &cfg).pod_ref, None, "no pod outside Kubernetes");
}

#[test]
fn requested_addresses_from_cni_args_runtime_config_and_args_are_unioned_and_matched_to_their_range() {
    let rig = Rig::new();
    let mut c = rig.config("198.18.4.0/29");
    c["runtimeConfig"] = json!({"ips": ["198.18.4.5/29"]});
    c["args"] = json!({"cni": {"ips": ["198.18.4.5"]}});
    let req = rig.request("ADD", "c1", "IP=198.18.4.5", &c);
    assert_eq!(requested(&req).unwrap(), vec!["198.18.4.5".parse::<IpAddr>().unwrap()], "once, whatever the source");
    assert_eq!(addresses(&Ipam.add(&req).unwrap()), ["198.18.4.5/29"]);
    let outside = rig.request("ADD", "c2", "IP=198.19.0.1", &rig.config("198.18.4.0/29"));
    let e = Ipam.add(&outside).unwrap_err();
    assert_eq!(e.code, code::IPAM_ADDRESS_OUTSIDE, "{e:?}");
    assert!(e.msg.contains("198.19.0.1"), "{e:?}");
    let bad = rig.request("ADD", "c3", "IP=nope", &rig.config("198.18.4.0/29"));
    assert_eq!(Ipam.add(&bad).unwrap_err().msg, "invalid CNI_ARGS IP address \"nope\"");
}

#[test]
fn gateways_from_cni_args_must_be_addresses() {
    let rig = Rig::new();
    let c = rig.config("198.18.4.0/29");
    let gws = cni_gateways(&rig.request("ADD", "c1", "GATEWAY=198.18.4.6", &c)).unwrap();
    assert_eq!(gws, vec!["198.18.4.6".parse::<IpAddr>().unwrap()]);
    let e = cni_gateways(&rig.request("ADD", "c1", "GATEWAY=x", &c)).unwrap_err();
    assert_eq!(
        (e.code, e.msg.as_str()),
        (code::INVALID_NETWORK_CONFIG, "invalid CNI_ARGS GATEWAY \"x\": not an IP address")
    );
}

#[test]
fn del_releases_and_a_second_del_or_a_del_before_any_add_succeeds() {
    let rig = Rig::new();
    let c = rig.config("198.18.4.0/30");
    assert!(Ipam.del(&rig.request("DEL", "c0", "", &c)).is_ok(), "no store yet");
    rig.add("c1", "", &c).unwrap();
    rig.add("c2", "", &c).unwrap();
    let full = rig.add("c3", "", &c).unwrap_err();
    assert_eq!(full.code, code::IPAM_EXHAUSTED, "{full:?}");
    assert!(full.msg.contains("198.18.4.0/30"), "the full range is named: {full:?}");
    Ipam.del(&rig.request("DEL", "c1", "", &c)).unwrap();
    Ipam.del(&rig.request("DEL", "c1", "", &c)).unwrap();
    assert_eq!(addresses(&rig.add("c3", "", &c).unwrap()), ["198.18.4.1/30"], "the released address is free again");
}

#[test]
fn check_wants_the_allocation_in_prev_result() {
    let rig = Rig::new();
    let c = rig.config("198.18.4.0/29");
    let result = rig.add("c1", "", &c).unwrap();
    let mut with_prev = c.clone();
    with_prev["prevResult"] = result.to_value(plexus_cni::SpecVersion::V1_0_0).unwrap();
    Ipam.check(&rig.request("CHECK", "c1", "", &with_prev)).unwrap();
    let e = Ipam.check(&rig.request("CHECK", "c9", "", &with_prev)).unwrap_err();
    assert_eq!(e.code, code::CHECK_FAILED);
    let mut wrong = c.clone();
    wrong["prevResult"] = json!({"cniVersion": "1.0.0", "ips": [{"address": "198.18.4.6/29"}]});
    let e = Ipam.check(&rig.request("CHECK", "c1", "", &wrong)).unwrap_err();
    assert_eq!(e.msg, "allocated address 198.18.4.1 is not in prevResult");
}

#[test]
fn status_reports_a_full_range_and_gc_releases_only_what_is_no_longer_valid() {
    let rig = Rig::new();
    let c = rig.config("198.18.4.0/30");
    Ipam.status(&rig.request("STATUS", "", "", &c)).unwrap();
    rig.add("c1", "", &c).unwrap();
    rig.add("c2", "", &c).unwrap();
    let e = Ipam.status(&rig.request("STATUS", "", "", &c)).unwrap_err();
    assert_eq!(e.code, code::PLUGIN_NOT_AVAILABLE);
    assert!(e.msg.starts_with("no free address left in range 198.18.4.0/30"), "{e:?}");
    let mut gc = c.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "c2", "ifname": "net1"}]);
    Ipam.gc(&rig.request("GC", "", "", &gc)).unwrap();
    assert_eq!(addresses(&rig.add("c3", "", &c).unwrap()), ["198.18.4.1/30"], "c1's address was stale");
    assert!(rig.add("c4", "", &c).is_err(), "c2 (valid) and c3 hold the rest");
}
