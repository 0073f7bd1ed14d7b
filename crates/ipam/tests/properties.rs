//! Range arithmetic and allocation as properties: whatever the range (IPv4 or IPv6, start/end,
//! `A-B/nn`, exclusions), next-fit hands out only usable addresses, each at most once, and finds
//! every one of them.

use std::collections::BTreeSet;
use std::net::IpAddr;

use plexus_ipam_core::range::RangeSpec;
use plexus_ipam_core::store::file::FileStore;
use plexus_ipam_core::store::{AllocRequest, Candidates, Owner, Store};
use plexus_ipam_core::{IpRange, IpamError};
use proptest::prelude::*;

fn owner(i: usize) -> Owner {
    Owner {
        container_id: format!("c{i}"),
        ifname: "net1".into(),
        pod_ref: None,
        node: "n1".into(),
        network: "rail0".into(),
    }
}

type Spec = (String, Option<u8>, Option<u8>, Vec<(u8, u8)>, bool);

/// A small IPv4 or IPv6 range with optional start, end and exclusions.
fn small_range() -> impl Strategy<Value = Spec> {
    (
        any::<bool>(),
        26u8..=30,
        proptest::option::of(0u8..64),
        proptest::option::of(0u8..64),
        proptest::collection::vec((0u8..64, 0u8..3), 0..4),
        any::<bool>(),
    )
        .prop_map(|(v6, prefix, start, end, excl, dash)| {
            let (base, p) =
                if v6 { ("2001:db8:1::".to_string(), 96 + prefix) } else { ("198.18.1.0".to_string(), prefix) };
            (format!("{base}/{p}"), start, end, excl, dash && !v6)
        })
}

fn build(spec: &Spec) -> Result<IpRange, IpamError> {
    let (range, start, end, excl, dash) = spec;
    let v6 = range.contains(':');
    let addr = |o: u8| if v6 { format!("2001:db8:1::{o:x}") } else { format!("198.18.1.{o}") };
    let exclude: Vec<String> = excl
        .iter()
        .map(|(o, w)| if *w == 0 { addr(*o) } else { format!("{}/{}", addr(*o & !3), if v6 { 126 } else { 30 }) })
        .collect();
    let (s, e) = (start.map(addr), end.map(addr));
    if *dash && let (Some(s), Some(e)) = (&s, &e) {
        let prefix = range.split('/').nth(1).unwrap();
        let r = format!("{s}-{e}/{prefix}");
        return IpRange::parse(&RangeSpec { range: &r, exclude: &exclude, ..Default::default() });
    }
    IpRange::parse(&RangeSpec {
        range,
        range_start: s.as_deref(),
        range_end: e.as_deref(),
        exclude: &exclude,
        ..Default::default()
    })
}

fn req<'a>(o: Owner, ranges: &'a [IpRange], requested: Vec<Option<IpAddr>>, overlapping: bool) -> AllocRequest<'a> {
    AllocRequest { owner: o, ranges, requested, overlapping }
}

proptest! {
    #[test]
    fn candidates_are_exactly_the_usable_addresses(spec in small_range(), cursor in proptest::option::of(0u128..80)) {
        let Ok(r) = build(&spec) else { return Ok(()) };
        let got: Vec<u128> = Candidates::after(&r, cursor).collect();
        let set: BTreeSet<u128> = got.iter().copied().collect();
        prop_assert_eq!(set.len(), got.len(), "each once");
        prop_assert_eq!(got.len() as u128, r.capacity());
        for o in &got {
            prop_assert!(*o >= r.first && *o <= r.last && !r.is_excluded(*o));
            let ip = r.addr(*o);
            prop_assert_ne!(ip, r.network.network(), "never the network address");
            if let (IpAddr::V4(_), ipnetwork::IpNetwork::V4(n)) = (ip, r.network) && n.prefix() < 31 {
                prop_assert_ne!(ip, IpAddr::V4(n.broadcast()), "never the broadcast address");
            }
            prop_assert_eq!(r.offset_of(ip), Some(*o));
        }
        if let Some(c) = cursor && !got.is_empty() && c >= r.first && c < r.last && got.iter().any(|o| *o > c) {
            prop_assert!(got[0] > c, "starts after the cursor");
        }
    }

    #[test]
    fn the_file_store_fills_a_range_exactly_then_reports_exhaustion(spec in small_range()) {
        let Ok(r) = build(&spec) else { return Ok(()) };
        prop_assume!(r.capacity() <= 64);
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open_admin(dir.path(), "d").unwrap();
        let ranges = vec![r.clone()];
        let mut seen = BTreeSet::new();
        for i in 0..r.capacity() as usize {
            let ips = store.allocate(&req(owner(i), &ranges, vec![None], true)).unwrap();
            prop_assert!(r.offset_of(ips[0]).is_some());
            prop_assert!(seen.insert(ips[0]), "{} twice", ips[0]);
        }
        let full = store.allocate(&req(owner(999), &ranges, vec![None], true));
        prop_assert!(matches!(full, Err(IpamError::Exhausted { .. })), "{:?}", full);
        // Release one: it is the only free one, so it comes back.
        let freed = store.release("c0", "net1").unwrap();
        prop_assert_eq!(freed.len(), 1);
        let again = store.allocate(&req(owner(1000), &ranges, vec![None], true)).unwrap();
        prop_assert_eq!(again[0], freed[0].ip);
    }
}

fn range(r: &str) -> IpRange {
    IpRange::parse(&RangeSpec { range: r, ..Default::default() }).unwrap()
}

#[test]
fn a_released_address_is_not_handed_out_again_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::open_admin(dir.path(), "default").unwrap();
    let ranges = vec![range("198.18.5.0/24")];
    let a = store.allocate(&req(owner(1), &ranges, vec![None], true)).unwrap();
    store.release("c1", "net1").unwrap();
    let b = store.allocate(&req(owner(2), &ranges, vec![None], true)).unwrap();
    assert_ne!(a, b, "next-fit moves on from the cursor");
}

#[test]
fn overlapping_ranges_never_share_an_address_unless_overlap_is_disabled() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::open_admin(dir.path(), "default").unwrap();
    let wide = vec![range("198.18.2.0/24")];
    let narrow = vec![range("198.18.2.0/28")];
    let a = store.allocate(&req(owner(1), &narrow, vec![None], true)).unwrap();
    let b = store.allocate(&req(owner(2), &wide, vec![None], true)).unwrap();
    assert_ne!(a, b, "overlapping ranges in one domain share the address space");
    let c = store.allocate(&req(owner(3), &wide, a.iter().map(|i| Some(*i)).collect(), true));
    assert!(matches!(c, Err(IpamError::InUse { .. })), "{c:?}");
    // Without overlap protection the wide range may hand out what the narrow one holds.
    let d = store.allocate(&req(owner(4), &wide, a.iter().map(|i| Some(*i)).collect(), false));
    assert_eq!(d.unwrap(), a);
}

#[test]
fn the_same_attachment_gets_the_same_addresses_and_a_recreated_pod_its_old_ones() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::open_admin(dir.path(), "default").unwrap();
    let ranges = vec![range("198.18.3.0/24"), range("2001:db8:3::/64")];
    let mut o = owner(1);
    o.pod_ref = Some("ml/trainer-0".into());
    let first = store.allocate(&req(o.clone(), &ranges, vec![None, None], true)).unwrap();
    let again = store.allocate(&req(o.clone(), &ranges, vec![None, None], true)).unwrap();
    assert_eq!(first, again);
    // StatefulSet pod re-created: new container ID, same pod and interface.
    let mut o2 = o.clone();
    o2.container_id = "c-new".into();
    let back = store.allocate(&req(o2, &ranges, vec![None, None], true)).unwrap();
    assert_eq!(back, first);
    assert!(store.holdings("c1", "net1").unwrap().is_empty(), "the old container ID holds nothing now");
    assert_eq!(store.holdings("c-new", "net1").unwrap().len(), 2);
    assert!(store.release("c1", "net1").unwrap().is_empty(), "DEL of the old sandbox releases nothing");
    assert_eq!(store.list().unwrap().len(), 2);
}
