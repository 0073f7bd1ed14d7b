//! Prepare and unprepare on a fake API and fake ports, with real files (CDI spec, prepared claim).

use std::sync::Mutex;

use nix::sys::stat::{Mode as FileMode, SFlag, makedev, mknod};
use serde_json::json;

use super::*;
use crate::kubelet::Driver as _;
use crate::nics::Mode;

const UID: &str = "11111111-2222-3333-4444-555555555555";

struct Api(Mutex<Vec<ResourceClaim>>, Mutex<Vec<String>>);

impl ClaimSource for Api {
    fn claim(&self, namespace: &str, name: &str) -> crate::error::Result<ResourceClaim> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .find(|c| c.metadata.namespace.as_deref() == Some(namespace) && c.metadata.name.as_deref() == Some(name))
            .cloned()
            .ok_or_else(|| crate::DraError::Api(format!("resourceclaims {namespace}/{name} not found")))
    }
    fn clear_status(&self, claim: &Claim) -> crate::error::Result<()> {
        self.1.lock().unwrap().push(claim.uid.clone());
        Err(crate::DraError::Api("the API is away".into()))
    }
}

struct Fixed(Vec<Nic>);

impl Ports for Fixed {
    fn nics(&self) -> Vec<Nic> {
        self.0.clone()
    }
}

fn nic() -> Nic {
    crate::nics::sample("rail0", Mode::Exclusive)
}

fn claim(uid: &str, device: &str) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": "nic", "namespace": "team-a", "uid": uid},
        "spec": {},
        "status": {"allocation": {"devices": {"results": [
            {"request": "nic", "driver": "plexus.dev", "pool": "node-1", "device": device}]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-1"}]}
    }))
    .unwrap()
}

struct Rig {
    dir: tempfile::TempDir,
    driver: Driver,
    api: Arc<Api>,
}

fn rig() -> Rig {
    assert!(nix::unistd::geteuid().is_root(), "this test needs root (mknod)");
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("dev/infiniband");
    std::fs::create_dir_all(&dev).unwrap();
    mknod(&dev.join("uverbs0"), SFlag::S_IFCHR, FileMode::from_bits_truncate(0o600), makedev(231, 192)).unwrap();
    let api = Arc::new(Api(Mutex::new(vec![claim(UID, "rail0")]), Mutex::default()));
    let driver = Driver {
        node: "node-1".into(),
        claims: api.clone(),
        ports: Arc::new(Fixed(vec![nic()])),
        store: Store::new(dir.path().join("claims")),
        cdi_dir: dir.path().join("cdi"),
        dev_root: dir.path().join("dev"),
        ready: Default::default(),
    };
    Rig { dir, driver, api }
}

fn kubelet_claim(uid: &str) -> Claim {
    Claim { namespace: "team-a".into(), name: "nic".into(), uid: uid.into() }
}

#[test]
fn a_prepared_claim_has_its_cdi_spec_and_its_record_and_unprepare_removes_both() {
    let r = rig();
    let devices = r.driver.prepare(&kubelet_claim(UID)).unwrap();
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].device_name, "rail0");
    assert_eq!(devices[0].pool_name, "node-1");
    assert_eq!(devices[0].request_names, ["nic"]);
    assert_eq!(devices[0].cdi_device_ids, [format!("plexus.dev/rdma={UID}-rail0")]);
    let spec = r.dir.path().join(format!("cdi/plexus.dev-{UID}.json"));
    assert!(spec.exists());
    let kept = r.driver.store.load(UID).unwrap().unwrap();
    assert_eq!(kept.pods, ["pod-1"]);
    assert_eq!(kept.devices[0].cdi_device_ids, devices[0].cdi_device_ids);
    // Asked again (a kubelet restart): the same answer, from what was kept, without the API.
    r.api.0.lock().unwrap().clear();
    assert_eq!(r.driver.prepare(&kubelet_claim(UID)).unwrap(), devices);
    r.driver.unprepare(&kubelet_claim(UID)).unwrap();
    assert!(!spec.exists() && r.driver.store.load(UID).unwrap().is_none());
    // Its status was asked to be cleared; an API that does not answer does not hold unprepare.
    assert_eq!(*r.api.1.lock().unwrap(), [UID]);
    r.driver.unprepare(&kubelet_claim(UID)).unwrap();
}

#[test]
fn a_claim_that_cannot_be_prepared_leaves_nothing_behind() {
    let r = rig();
    let other = "22222222-2222-3333-4444-555555555555";
    // The API's claim of that name is a later one (another UID).
    let e = r.driver.prepare(&kubelet_claim(other)).unwrap_err();
    assert!(e.contains("the API has UID"), "{e}");
    // A device the node no longer offers.
    *r.api.0.lock().unwrap() = vec![claim(other, "rail5")];
    let e = r.driver.prepare(&kubelet_claim(other)).unwrap_err();
    assert!(e.contains("device rail5 is not offered"), "{e}");
    // A port whose RDMA device has no node in /dev.
    std::fs::remove_file(r.dir.path().join("dev/infiniband/uverbs0")).unwrap();
    *r.api.0.lock().unwrap() = vec![claim(other, "rail0")];
    let e = r.driver.prepare(&kubelet_claim(other)).unwrap_err();
    assert!(e.contains("uverbs0"), "{e}");
    let left: Vec<_> = ["cdi", "claims"]
        .iter()
        .flat_map(|d| std::fs::read_dir(r.dir.path().join(d)).into_iter().flatten().flatten())
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn a_prepare_killed_after_its_cdi_spec_is_done_again_by_the_kubelets_retry() {
    let r = rig();
    // What a plugin killed between the two writes leaves: the spec, no prepared claim.
    let spec = r.dir.path().join(format!("cdi/plexus.dev-{UID}.json"));
    std::fs::create_dir_all(spec.parent().unwrap()).unwrap();
    std::fs::write(&spec, b"{\"half\": true}").unwrap();
    let devices = r.driver.prepare(&kubelet_claim(UID)).unwrap();
    assert_eq!(devices[0].cdi_device_ids, [format!("plexus.dev/rdma={UID}-rail0")]);
    let written: serde_json::Value = serde_json::from_slice(&std::fs::read(&spec).unwrap()).unwrap();
    assert_eq!(written["kind"], "plexus.dev/rdma", "the spec written anew");
    assert!(r.driver.store.load(UID).unwrap().is_some());
}
