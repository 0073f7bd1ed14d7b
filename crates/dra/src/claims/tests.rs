//! Claims as the API gives them (allocated by the scheduler, reserved for a pod) worked out
//! into prepared devices, and the store of prepared claims.

use serde_json::json;

use super::*;

const UID: &str = "11111111-2222-3333-4444-555555555555";
const POD: &str = "99999999-8888-7777-6666-555555555555";

fn nic(name: &str, mode: Mode) -> Nic {
    crate::nics::sample(name, mode)
}

/// A claim of two requests allocated on node-1 (rail0 for `a`, rail1 for `b`) and a GPU of
/// another driver, with a class config for every request and a claim config for `b`.
fn claim(extra: serde_json::Value) -> ResourceClaim {
    let mut v = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "nics", "namespace": "team-a", "uid": UID},
        "spec": {"devices": {"requests": []}},
        "status": {
            "allocation": {"devices": {
                "results": [
                    {"request": "gpu", "driver": "gpu.example.com", "pool": "node-1", "device": "gpu0"},
                    {"request": "a", "driver": "plexus.dev", "pool": "node-1", "device": "rail0"},
                    {"request": "b", "driver": "plexus.dev", "pool": "node-1", "device": "rail1", "shareID": "aaaaaaaa-0000-0000-0000-000000000001"}
                ],
                "config": [
                    {"source": "FromClass", "opaque": {"driver": "plexus.dev", "parameters": {"mtu": 9000, "ipam": {"type": "plexus-ipam", "range": "198.18.0.0/24"}}}},
                    {"source": "FromClaim", "requests": ["b"], "opaque": {"driver": "plexus.dev", "parameters": {"interface": "net7", "mtu": 4200}}},
                    {"source": "FromClaim", "opaque": {"driver": "gpu.example.com", "parameters": {"whatever": true}}}
                ]
            }},
            "reservedFor": [{"resource": "pods", "name": "trainer", "uid": POD}]
        }
    });
    crate::claims::tests::merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

pub(super) fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

#[test]
fn a_claim_is_prepared_with_its_devices_of_this_driver_each_with_the_config_of_its_request() {
    let p = prepare(&claim(json!({})), "node-1", &[nic("rail0", Mode::Exclusive), nic("rail1", Mode::Shared)]).unwrap();
    assert_eq!((p.namespace.as_str(), p.name.as_str(), p.uid.as_str()), ("team-a", "nics", UID));
    assert_eq!(p.pods, [POD]);
    assert_eq!(p.devices.len(), 2, "the GPU is another driver's");
    let (a, b) = (&p.devices[0], &p.devices[1]);
    assert_eq!(
        (a.request.as_str(), a.device.as_str(), a.ifname.as_str(), a.mode),
        ("a", "rail0", "rail0", Mode::Exclusive)
    );
    assert_eq!(a.config.mtu, Some(9000));
    assert_eq!(a.config.ipam, Some(json!({"type": "plexus-ipam", "range": "198.18.0.0/24"})));
    assert_eq!(a.ifname_in_pod(), "rail0");
    // The claim's config comes after the class's: its keys win, the others stay.
    assert_eq!(b.config.mtu, Some(4200));
    assert_eq!(b.config.interface.as_deref(), Some("net7"));
    assert!(b.config.ipam.is_some());
    assert_eq!(b.ifname_in_pod(), "net7");
    assert_eq!(b.mode, Mode::Shared);
    assert_eq!(b.share_id.as_deref(), Some("aaaaaaaa-0000-0000-0000-000000000001"));
}

#[test]
fn what_cannot_be_prepared_here_is_refused_naming_the_claim_and_why() {
    let nics = [nic("rail0", Mode::Exclusive), nic("rail1", Mode::Shared)];
    let refused =
        |extra: serde_json::Value, nics: &[Nic]| prepare(&claim(extra), "node-1", nics).unwrap_err().to_string();
    let e = refused(json!({}), &nics[..1]);
    assert!(e.starts_with("claim team-a/nics: ") && e.contains("device rail1 is not offered on node node-1"), "{e}");
    let e = prepare(&claim(json!({})), "node-2", &nics).unwrap_err().to_string();
    assert!(e.contains("pool node-1, not this node's (node-2)"), "{e}");
    let unknown_key = json!({"status": {"allocation": {"devices": {"config": [
        {"source": "FromClaim", "opaque": {"driver": "plexus.dev", "parameters": {"logFile": "/etc/shadow"}}}]}}}});
    let e = refused(unknown_key, &nics);
    assert!(e.contains("unknown field `logFile`"), "{e}");
    let bad_name = json!({"status": {"allocation": {"devices": {"config": [
        {"source": "FromClaim", "opaque": {"driver": "plexus.dev", "parameters": {"interface": "../../x"}}}]}}}});
    assert!(refused(bad_name, &nics).contains("interface \"../../x\""));
    // What the pod's sandbox would fail on is refused at prepare, naming the request: an MTU
    // the port cannot have, a network that is not a NAD's name (it would become an API path).
    let param = |p: serde_json::Value| {
        json!({"status": {"allocation": {"devices": {"config": [
            {"source": "FromClaim", "requests": ["b"], "opaque": {"driver": "plexus.dev", "parameters": p}}]}}}})
    };
    for (p, says) in [
        (json!({"mtu": 9001}), "request b: mtu 9001: port rail1 takes 68 to 9000"),
        (json!({"mtu": 0}), "request b: mtu 0: port rail1 takes 68 to 9000"),
        (
            json!({"network": "../../secrets"}),
            "request b: network: network-attachment-definition name \"../../secrets\"",
        ),
        (json!({"network": "x?watch=1"}), "is not a Kubernetes object name"),
    ] {
        let e = refused(param(p.clone()), &nics);
        assert!(e.starts_with("claim team-a/nics: ") && e.contains(says), "{p}: {e}");
    }
    let exclusive_jumbo = json!({"status": {"allocation": {"devices": {"config": [
        {"source": "FromClaim", "requests": ["a"], "opaque": {"driver": "plexus.dev", "parameters": {"mtu": 9216, "network": "rail.a-1"}}}]}}}});
    assert!(
        prepare(&claim(exclusive_jumbo), "node-1", &nics).is_ok(),
        "an exclusive port's MTU is the device's to refuse"
    );
    let same_name = json!({"status": {"allocation": {"devices": {"config": [
        {"source": "FromClaim", "opaque": {"driver": "plexus.dev", "parameters": {"interface": "net1"}}}]}}}});
    assert!(refused(same_name, &nics).contains("two devices would be net1"));
    let not_object = json!({"status": {"allocation": {"devices": {"config": [
        {"source": "FromClaim", "opaque": {"driver": "plexus.dev", "parameters": [1]}}]}}}});
    assert!(refused(not_object, &nics).contains("not an object"));
    let unallocated: ResourceClaim =
        serde_json::from_value(json!({"metadata": {"name": "x", "namespace": "n", "uid": UID}, "spec": {}})).unwrap();
    assert!(prepare(&unallocated, "node-1", &nics).unwrap_err().to_string().contains("not allocated"));
    let no_uid = json!({"metadata": {"uid": "../../etc"}});
    assert!(refused(no_uid, &nics).contains("is not a UID"));
}

#[test]
fn prepared_claims_are_kept_found_by_pod_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path().join("claims"));
    let p = prepare(&claim(json!({})), "node-1", &[nic("rail0", Mode::Exclusive), nic("rail1", Mode::Shared)]).unwrap();
    store.save(&p).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let file = store.dir().join(format!("{UID}.json"));
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(store.dir()).unwrap().permissions().mode() & 0o777, 0o700);
    assert_eq!(store.load(UID).unwrap().as_ref(), Some(&p));
    assert_eq!(store.for_pod(POD), std::slice::from_ref(&p));
    assert!(store.for_pod("another-pod").is_empty());
    // A later plexus's file is not read as this one's.
    let mut later = serde_json::to_value(&p).unwrap();
    later["version"] = json!(2);
    std::fs::write(&file, serde_json::to_vec(&later).unwrap()).unwrap();
    assert!(store.load(UID).unwrap_err().to_string().contains("later plexus"));
    assert!(store.for_pod(POD).is_empty());
    store.remove(UID).unwrap();
    assert!(!file.exists());
    store.remove(UID).unwrap();
    assert_eq!(store.load(UID).unwrap(), None);
}
