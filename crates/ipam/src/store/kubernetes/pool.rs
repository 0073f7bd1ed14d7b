//! An IPPool as read from the API server, and the JSON Patch pieces that change one entry of it.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::range::IpRange;
use crate::store::Owner;

/// plexus's next-fit cursor on an IPPool (a hint).
pub(super) const CURSOR_ANNOTATION: &str = "ipam.plexus.io/next";
/// The largest offset whereabouts can read back (int64): ranges of this store are capped here.
pub const MAX_OFFSET: u128 = i64::MAX as u128;

/// One pool as read: its allocations by offset and its cursor. Keys that are not an offset inside
/// the range's network (not a number, or past its end) are not allocations plexus reads or
/// writes: whereabouts reads them as int64, and an address outside the network is no address of
/// this pool.
#[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
pub(super) struct Pool {
    pub(super) name: String,
    pub(super) allocations: BTreeMap<u128, Value>,
    pub(super) cursor: Option<u128>,
    pub(super) has_annotations: bool,
    pub(super) has_allocations: bool,
}

impl Pool {
    pub(super) fn from_object(name: &str, obj: &Value, range: &IpRange) -> Pool {
        let allocs = obj.pointer("/spec/allocations").and_then(Value::as_object);
        let allocations = allocs
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| {
                        k.parse::<u128>().ok().filter(|o| range.in_network(*o)).map(|o| (o, v.clone()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let annotations = obj.pointer("/metadata/annotations").and_then(Value::as_object);
        Pool {
            name: name.to_string(),
            allocations,
            cursor: annotations
                .and_then(|a| a.get(CURSOR_ANNOTATION))
                .and_then(Value::as_str)
                .and_then(|c| c.parse().ok()),
            has_annotations: annotations.is_some(),
            has_allocations: allocs.is_some(),
        }
    }

    /// The offsets of the entries of (container, ifname).
    pub(super) fn entries_of(&self, container_id: &str, ifname: &str) -> Vec<u128> {
        self.allocations
            .iter()
            .filter(|(_, v)| field_is(v, "id", container_id) && field_is(v, "ifname", ifname))
            .map(|(o, _)| *o)
            .collect()
    }

    /// The offset `owner` holds here: by container ID and ifname, or (idempotent ADD, as
    /// whereabouts) by pod and ifname.
    pub(super) fn held_by(&self, owner: &Owner) -> Option<(u128, bool)> {
        if let Some(o) = self.entries_of(&owner.container_id, &owner.ifname).first() {
            return Some((*o, false));
        }
        let pod = owner.pod_ref.as_deref().filter(|p| !p.is_empty())?;
        self.allocations
            .iter()
            .find(|(_, v)| field_is(v, "podref", pod) && field_is(v, "ifname", &owner.ifname))
            .map(|(o, _)| (*o, true))
    }
}

/// Whether entry `v`'s `key` is `want`.
pub(super) fn field_is(v: &Value, key: &str, want: &str) -> bool {
    v.get(key).and_then(Value::as_str) == Some(want)
}

/// Whether a reservation is the attachment's: by container ID when it names one (plexus writes
/// it), else by pod and interface (whereabouts writes only those).
pub(super) fn reserved_for(r: &Value, container_id: &str, pod_ref: &str, ifname: &str) -> bool {
    let s = |k: &str| r.pointer(&format!("/spec/{k}")).and_then(Value::as_str).unwrap_or_default();
    match s("containerid") {
        "" => s("podref") == pod_ref && s("ifname") == ifname,
        id => id == container_id,
    }
}

/// The fuzz targets' way in: a pool and a reservation as read back from the API server.
#[cfg(feature = "fuzzing")]
pub(crate) fn read_back(obj: &Value, range: &IpRange) {
    use crate::store::Candidates;

    let pool = Pool::from_object("fuzz", obj, range);
    for offset in pool.allocations.keys() {
        assert!(range.network.contains(range.addr(*offset)), "offset {offset} outside {}", range.network);
    }
    let owner = Owner {
        container_id: "c1".into(),
        ifname: "net1".into(),
        pod_ref: Some("ns/pod".into()),
        node: String::new(),
        network: "fuzz".into(),
    };
    if let Some((offset, _)) = pool.held_by(&owner) {
        assert!(pool.allocations.contains_key(&offset));
    }
    let _ = Candidates::after(range, pool.cursor).take(4).count();
    let _ = reserved_for(obj, "c1", "ns/pod", "net1");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::range::RangeSpec;
    use serde_json::json;

    fn range(r: &str) -> IpRange {
        IpRange::parse(&RangeSpec { range: r, ..Default::default() }).unwrap()
    }

    #[test]
    fn a_pool_is_read_with_its_offsets_cursor_and_the_owner_found_by_container_or_by_pod() {
        let obj = json!({"metadata": {"annotations": {"ipam.plexus.io/next": "7"}},
            "spec": {"range": "198.18.0.0/24", "allocations": {
                "5": {"id": "c1", "podref": "default/a", "ifname": "net1"},
                "7": {"id": "c2", "podref": "default/b", "ifname": "net1"},
                "bogus": {"id": "x"},
                "256": {"id": "past the network"},
                "340282366920938463463374607431768211455": {"id": "u128::MAX"}}}});
        let p = Pool::from_object("198.18.0.0-24", &obj, &range("198.18.0.0/24"));
        assert_eq!(p.allocations.keys().copied().collect::<Vec<_>>(), [5, 7]);
        assert_eq!(p.cursor, Some(7));
        let owner = |cid: &str, pod: &str| Owner {
            container_id: cid.into(),
            ifname: "net1".into(),
            pod_ref: Some(pod.into()),
            node: String::new(),
            network: "n".into(),
        };
        assert_eq!(p.held_by(&owner("c1", "default/a")), Some((5, false)));
        assert_eq!(p.held_by(&owner("c9", "default/b")), Some((7, true)), "idempotent per pod and ifname");
        assert_eq!(p.held_by(&owner("c9", "default/z")), None);
    }

    #[test]
    fn a_reservation_is_matched_by_container_when_it_names_one_else_by_pod_and_interface() {
        let ours = json!({"spec": {"containerid": "c1", "podref": "default/a", "ifname": "net1"}});
        let theirs = json!({"spec": {"podref": "default/a", "ifname": "net1"}});
        assert!(reserved_for(&ours, "c1", "default/a", "net1"));
        assert!(!reserved_for(&ours, "c2", "default/a", "net1"), "another container of the pod");
        assert!(reserved_for(&theirs, "c2", "default/a", "net1"), "whereabouts writes no container ID");
        assert!(!reserved_for(&theirs, "c2", "default/a", "net2"));
    }
}
