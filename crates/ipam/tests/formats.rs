//! plexus-ipam's attachment record across versions (`plexus_node::format::IPAM_RECORD`): this
//! build writes the latest format exactly as its fixture holds it, reads every earlier one, and
//! refuses a later one (code 105) without touching what it holds. Fixtures: `tests/formats/`.

use std::net::IpAddr;
use std::path::Path;

use plexus_ipam_core::range::RangeSpec;
use plexus_ipam_core::store::file::FileStore;
use plexus_ipam_core::store::{AllocRequest, Owner, Store};
use plexus_ipam_core::{IpRange, IpamError};

const V1: &[u8] = include_bytes!("formats/ipam-record-v1.json");
/// What builds wrote before formats carried a version: read as version 1.
const UNVERSIONED: &[u8] = include_bytes!("formats/ipam-record-unversioned.json");
const V2: &[u8] = include_bytes!("formats/ipam-record-v2.json");

fn owner() -> Owner {
    Owner {
        container_id: "c1".into(),
        ifname: "net1".into(),
        pod_ref: Some("default/trainer-0".into()),
        node: "node-1".into(),
        network: "rail0".into(),
    }
}

fn ranges() -> Vec<IpRange> {
    ["198.18.7.0/24", "2001:db8:7::/64"]
        .iter()
        .map(|r| IpRange::parse(&RangeSpec { range: r, ..Default::default() }).unwrap())
        .collect()
}

/// A store holding c1/net1's addresses; its record's path.
fn allocated(dir: &Path) -> (FileStore, Vec<IpAddr>, std::path::PathBuf) {
    let store = FileStore::open_admin(dir, "default").unwrap();
    let ranges = ranges();
    let req = AllocRequest { owner: owner(), ranges: &ranges, requested: vec![None, None], overlapping: true };
    let ips = store.allocate(&req).unwrap();
    (store, ips, dir.join("default/attachments/c1=net1"))
}

#[test]
fn this_build_writes_the_latest_record_format_as_its_fixture_holds_it() {
    // A change to what a record holds shows here: keep the old fixture (it must still be read)
    // and add the new one, with a new version if an older build would misread it.
    let dir = tempfile::tempdir().unwrap();
    let (_, ips, record) = allocated(dir.path());
    assert_eq!(ips, ["198.18.7.1".parse::<IpAddr>().unwrap(), "2001:db8:7::1".parse().unwrap()]);
    assert_eq!(String::from_utf8(std::fs::read(record).unwrap()).unwrap(), String::from_utf8(V1.to_vec()).unwrap());
}

#[test]
fn a_record_of_every_version_this_build_knows_is_released() {
    for fixture in [UNVERSIONED, V1] {
        let dir = tempfile::tempdir().unwrap();
        let (store, ips, record) = allocated(dir.path());
        std::fs::write(&record, fixture).unwrap();
        let released: Vec<IpAddr> = store.release("c1", "net1").unwrap().into_iter().map(|a| a.ip).collect();
        assert_eq!(released, ips);
        assert!(!record.exists());
    }
}

#[test]
fn a_record_of_a_later_format_is_refused_and_what_it_holds_stays_held() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _, record) = allocated(dir.path());
    std::fs::write(&record, V2).unwrap();
    for (verb, outcome) in [
        ("DEL", store.release("c1", "net1").map(|_| ())),
        ("ADD", {
            let ranges = ranges();
            store
                .allocate(&AllocRequest {
                    owner: owner(),
                    ranges: &ranges,
                    requested: vec![None, None],
                    overlapping: true,
                })
                .map(|_| ())
        }),
    ] {
        let e: plexus_cni::Error = match outcome {
            Err(e @ IpamError::Format(_)) => e.into(),
            other => panic!("{verb}: {other:?}"),
        };
        assert_eq!(e.code, plexus_cni::code::FORMAT_TOO_NEW, "{verb}");
        assert!(e.msg.contains("plexus-ipam's attachment record of format version 2"), "{verb}: {e}");
    }
    assert_eq!(std::fs::read(&record).unwrap(), V2, "the record is left as it is");
    let held: Vec<_> = std::fs::read_dir(dir.path().join("default/ips")).unwrap().collect();
    assert_eq!(held.len(), 2, "its addresses stay reserved");
}
