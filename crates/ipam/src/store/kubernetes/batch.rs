//! Writing a pool: one JSON Patch for a batch of a node's requests on it (group commit,
//! [`super::spool`]), and the ops it is made of.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::pool::{CURSOR_ANNOTATION, MAX_OFFSET, Pool};
use super::spool::{Answer, Kind};
use crate::range::IpRange;
use crate::store::{Candidates, Owner};

/// The JSON Patch ops that remove the entry at `offset` if it is still `container_id`'s.
pub(super) fn removal(offset: u128, container_id: &str) -> [Value; 2] {
    let path = format!("/spec/allocations/{offset}");
    [json!({"op": "test", "path": format!("{path}/id"), "value": container_id}), json!({"op": "remove", "path": path})]
}

/// A new entry of `owner`'s, as whereabouts writes it.
pub(super) fn entry(owner: &Owner) -> Value {
    json!({"id": owner.container_id, "podref": owner.pod_ref.clone().unwrap_or_default(), "ifname": owner.ifname})
}

/// `key` as a JSON Pointer token.
pub(super) fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Where a node's walk for free offsets starts once its write met another node's: after the
/// pool's cursor (the offset some node handed out last) moved on by the node's lane, a share of
/// the range's first [`LANE_SPAN`] offsets its name picks. Nodes whose writes meet on one pool
/// read the same cursor; from the cursor itself they would all offer the same offsets again, and
/// every write but one would fail its `test` and go again (at 16 nodes a third of the writes
/// did). From their lanes they offer different ones. The walk stays next-fit from there, and an
/// empty name (no node) keeps the cursor as it is.
pub(super) fn node_cursor(cursor: Option<u128>, range: &IpRange, node: &str) -> Option<u128> {
    use sha2::{Digest, Sha256};
    if node.is_empty() || range.last <= range.first {
        return cursor;
    }
    let size = range.last - range.first + 1;
    let hash = Sha256::digest(node.as_bytes());
    let lane = u128::from(u64::from_be_bytes(hash[..8].try_into().expect("8 bytes"))) % size.min(LANE_SPAN);
    // No cursor: as if the last offset was handed out last (the walk starts at the first).
    let base = cursor.filter(|c| (range.first..=range.last).contains(c)).unwrap_or(range.last);
    Some(range.first + (base - range.first + lane) % size)
}

/// How far from the cursor a lane starts, at most: wide enough to keep a few hundred nodes'
/// batches apart, near enough that an IPv6 /64 still hands out short addresses.
const LANE_SPAN: u128 = 4096;

/// One request of a batch: an owner wanting an address (ADD) or giving its entries up (DEL).
pub(super) type Request<'a> = (Kind, &'a Owner);

/// What one write does for a batch.
pub(super) struct Plan {
    /// The JSON Patch (only `test`s when nothing changes: the server writes nothing then).
    pub(super) ops: Vec<Value>,
    /// Each request's answer, in order.
    pub(super) answers: Vec<Answer>,
    /// Some answer rests on something the read did not show (the range full, nothing to
    /// release), which no `test` can check: believed only from etcd's copy.
    pub(super) unguarded: bool,
}

/// One write for several requests on one pool. An ADD's owner gets the offset it holds (an entry
/// of the pod's earlier container is taken over) or the next free one after the cursor; a DEL's
/// owner has its entries removed. Every answer is guarded by a `test` (a new entry's offset still
/// absent, a held or removed entry still the owner's). ADDs are planned first: a DEL of the
/// container whose entry an ADD of the pod's new sandbox takes over in the same write releases
/// nothing, as it would after that ADD. Offsets released here are not handed out again in the
/// same write.
pub(super) fn plan_batch(pool: &Pool, range: &IpRange, requests: &[Request<'_>]) -> Plan {
    plan_from(pool, range, requests, pool.cursor)
}

/// [`plan_batch`] for a batch whose write met another node's (a `test` failed): new offsets
/// from the node's lane ([`node_cursor`]; the batch is one node's spool, the lane its first
/// request's node's).
pub(super) fn plan_batch_in_lane(pool: &Pool, range: &IpRange, requests: &[Request<'_>]) -> Plan {
    let node = requests.first().map_or("", |(_, o)| o.node.as_str());
    plan_from(pool, range, requests, node_cursor(pool.cursor, range, node))
}

fn plan_from(pool: &Pool, range: &IpRange, requests: &[Request<'_>], cursor: Option<u128>) -> Plan {
    let mut ops = Vec::new();
    let mut answers: Vec<Option<Answer>> = vec![None; requests.len()];
    let mut unguarded = false;
    let mut taken: BTreeSet<u128> = pool.allocations.keys().copied().collect();
    let mut claimed = BTreeSet::new();
    let mut cursor = cursor;
    let mut added = false;
    let path = |o: u128| format!("/spec/allocations/{o}");
    for (i, (_, owner)) in requests.iter().enumerate().filter(|(_, (k, _))| *k == Kind::Add) {
        let answer = &mut answers[i];
        match pool.held_by(owner) {
            Some((o, false)) => {
                // Still the owner's when the write lands (the read may be the cache's).
                ops.push(json!({"op": "test", "path": format!("{}/id", path(o)), "value": owner.container_id}));
                claimed.insert(o);
                *answer = Some(Answer::offset(o, None));
            }
            Some((o, true)) => {
                let (take, old) = take_over(pool, o, owner);
                ops.extend(take);
                claimed.insert(o);
                *answer = Some(Answer::offset(o, Some(old)));
            }
            None => match Candidates::after(range, cursor).find(|o| *o <= MAX_OFFSET && !taken.contains(o)) {
                Some(o) => {
                    if !added && !pool.has_allocations {
                        ops.push(json!({"op": "add", "path": "/spec/allocations", "value": {}}));
                    }
                    added = true;
                    ops.push(json!({"op": "test", "path": path(o), "value": null}));
                    ops.push(json!({"op": "add", "path": path(o), "value": entry(owner)}));
                    taken.insert(o);
                    cursor = Some(o);
                    *answer = Some(Answer::offset(o, None));
                }
                None => {
                    unguarded = true;
                    *answer = Some(Answer::Exhausted);
                }
            },
        }
    }
    for (i, (_, owner)) in requests.iter().enumerate().filter(|(_, (k, _))| *k == Kind::Release) {
        let held = pool.entries_of(&owner.container_id, &owner.ifname);
        unguarded |= held.is_empty();
        let mine: Vec<u128> = held.into_iter().filter(|o| !claimed.contains(o)).collect();
        for o in &mine {
            ops.extend(removal(*o, &owner.container_id));
        }
        answers[i] = Some(Answer::Released { offsets: mine.iter().map(u128::to_string).collect() });
    }
    if added && let Some(c) = cursor {
        let c = json!(c.to_string());
        ops.push(match pool.has_annotations {
            true => {
                json!({"op": "add", "path": format!("/metadata/annotations/{}", escape(CURSOR_ANNOTATION)), "value": c})
            }
            false => json!({"op": "add", "path": "/metadata/annotations", "value": {CURSOR_ANNOTATION: c}}),
        });
    }
    Plan { ops, answers: answers.into_iter().map(|a| a.expect("every request answered")).collect(), unguarded }
}

/// The pod's entry at `offset`, of its earlier container, made `owner`'s (the pod's new sandbox,
/// so the old sandbox's DEL no longer releases the address the pod uses): the ops, `test`ing it
/// is still the earlier container's, and that container's ID.
pub(super) fn take_over(pool: &Pool, offset: u128, owner: &Owner) -> ([Value; 2], String) {
    let path = format!("/spec/allocations/{offset}");
    let old = pool.allocations[&offset].get("id").cloned().unwrap_or(Value::Null);
    let ops = [
        json!({"op": "test", "path": format!("{path}/id"), "value": old}),
        json!({"op": "replace", "path": path, "value": entry(owner)}),
    ];
    (ops, old.as_str().unwrap_or_default().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::range::RangeSpec;

    fn range(r: &str) -> IpRange {
        IpRange::parse(&RangeSpec { range: r, ..Default::default() }).unwrap()
    }

    fn owner(cid: &str, pod: &str) -> Owner {
        Owner {
            container_id: cid.into(),
            ifname: "net1".into(),
            pod_ref: Some(pod.into()),
            node: String::new(),
            network: "n".into(),
        }
    }

    #[test]
    fn one_write_serves_a_batch_next_fit_every_answer_guarded_by_a_test() {
        let r = range("198.18.0.0/29"); // offsets 1..=6
        let obj = json!({"metadata": {"annotations": {"ipam.plexus.io/next": "2"}},
            "spec": {"allocations": {
                "2": {"id": "c-held", "podref": "default/held", "ifname": "net1"},
                "3": {"id": "c-old", "podref": "default/moved", "ifname": "net1"},
                "4": {"id": "w", "podref": "default/whereabouts", "ifname": "net1"}}}});
        let pool = Pool::from_object("p", &obj, &r);
        let (a, held, moved, b, c) = (
            owner("c-a", "default/a"),
            owner("c-held", "default/held"),
            owner("c-new", "default/moved"),
            owner("c-b", "default/b"),
            owner("c-c", "default/c"),
        );
        let add = |o| (Kind::Add, o);
        let Plan { ops, answers, unguarded } =
            plan_batch(&pool, &r, &[add(&a), add(&held), add(&moved), add(&b), add(&c)]);
        assert!(!unguarded);
        assert_eq!(
            answers,
            [
                Answer::offset(5, None),
                Answer::offset(2, None),
                Answer::offset(3, Some("c-old".into())),
                Answer::offset(6, None),
                Answer::offset(1, None), // wrapped past the end, 2..4 taken
            ]
        );
        let entry = |o: &Owner| json!({"id": o.container_id, "podref": o.pod_ref, "ifname": "net1"});
        assert_eq!(
            ops,
            [
                json!({"op": "test", "path": "/spec/allocations/5", "value": null}),
                json!({"op": "add", "path": "/spec/allocations/5", "value": entry(&a)}),
                json!({"op": "test", "path": "/spec/allocations/2/id", "value": "c-held"}),
                json!({"op": "test", "path": "/spec/allocations/3/id", "value": "c-old"}),
                json!({"op": "replace", "path": "/spec/allocations/3", "value": entry(&moved)}),
                json!({"op": "test", "path": "/spec/allocations/6", "value": null}),
                json!({"op": "add", "path": "/spec/allocations/6", "value": entry(&b)}),
                json!({"op": "test", "path": "/spec/allocations/1", "value": null}),
                json!({"op": "add", "path": "/spec/allocations/1", "value": entry(&c)}),
                json!({"op": "add", "path": "/metadata/annotations/ipam.plexus.io~1next", "value": "1"}),
            ]
        );
        // A full range: the one left over is told so, the others still get theirs.
        let d = owner("c-d", "default/d");
        let plan = plan_batch(&pool, &r, &[add(&a), add(&b), add(&c), add(&d)]);
        assert_eq!(plan.answers[3], Answer::Exhausted);
        assert!(plan.unguarded, "only etcd's copy says the range is full");
        // Only held entries: nothing to write, only that they are still held to check.
        let plan = plan_batch(&pool, &r, &[add(&held)]);
        assert_eq!(plan.ops, [json!({"op": "test", "path": "/spec/allocations/2/id", "value": "c-held"})]);
        assert_eq!(plan.answers, [Answer::offset(2, None)]);
        // A full range and nobody served: no patch to send (only a read from etcd says "full").
        let full = Pool::from_object(
            "p",
            &json!({"spec": {"allocations": {
            "1": {"id": "x1"}, "2": {"id": "x2"}, "3": {"id": "x3"}, "4": {"id": "x4"}, "5": {"id": "x5"}, "6": {"id": "x6"}}}}),
            &r,
        );
        let plan = plan_batch(&full, &r, &[add(&a)]);
        assert!(plan.ops.is_empty() && plan.unguarded);
        assert_eq!(plan.answers, [Answer::Exhausted]);
    }

    #[test]
    fn dels_share_the_write_with_adds_each_entry_removed_under_a_test_of_its_owner() {
        let r = range("198.18.0.0/29"); // offsets 1..=6
        let obj = json!({"metadata": {"annotations": {"ipam.plexus.io/next": "4"}},
            "spec": {"allocations": {
                "2": {"id": "c-gone", "podref": "default/gone", "ifname": "net1"},
                "3": {"id": "c-old", "podref": "default/moved", "ifname": "net1"},
                "4": {"id": "c-gone", "podref": "default/gone", "ifname": "net2"}}}});
        let pool = Pool::from_object("p", &obj, &r);
        let (gone, a, old, moved, never) = (
            owner("c-gone", "default/gone"),
            owner("c-a", "default/a"),
            owner("c-old", "default/moved"),
            owner("c-new", "default/moved"),
            owner("c-never", "default/never"),
        );
        let plan = plan_batch(
            &pool,
            &r,
            &[(Kind::Release, &gone), (Kind::Add, &a), (Kind::Release, &old), (Kind::Add, &moved)],
        );
        assert_eq!(
            plan.answers,
            [
                Answer::Released { offsets: vec!["2".into()] }, // net2's entry is another attachment's
                Answer::offset(5, None),                        // offset 2 is freed by this write, not handed out in it
                // The pod's new sandbox took the old container's entry over in the same write:
                // the old sandbox's DEL releases nothing, as after that ADD.
                Answer::Released { offsets: vec![] },
                Answer::offset(3, Some("c-old".into())),
            ]
        );
        assert!(!plan.unguarded, "every answer rests on an entry the read showed");
        let entry = |o: &Owner| json!({"id": o.container_id, "podref": o.pod_ref, "ifname": "net1"});
        assert_eq!(
            plan.ops,
            [
                json!({"op": "test", "path": "/spec/allocations/5", "value": null}),
                json!({"op": "add", "path": "/spec/allocations/5", "value": entry(&a)}),
                json!({"op": "test", "path": "/spec/allocations/3/id", "value": "c-old"}),
                json!({"op": "replace", "path": "/spec/allocations/3", "value": entry(&moved)}),
                json!({"op": "test", "path": "/spec/allocations/2/id", "value": "c-gone"}),
                json!({"op": "remove", "path": "/spec/allocations/2"}),
                json!({"op": "add", "path": "/metadata/annotations/ipam.plexus.io~1next", "value": "5"}),
            ]
        );
        // Nothing of the container in the read: only etcd's copy may say so.
        let plan = plan_batch(&pool, &r, &[(Kind::Release, &never)]);
        assert!(plan.ops.is_empty() && plan.unguarded);
        assert_eq!(plan.answers, [Answer::Released { offsets: vec![] }]);
    }

    #[test]
    fn nodes_whose_writes_met_offer_offsets_apart_each_from_its_own_lane() {
        let r = range("198.18.0.0/21"); // offsets 1..=2046
        let pool = Pool::from_object("p", &json!({"metadata": {"annotations": {"ipam.plexus.io/next": "40"}}}), &r);
        let on = |node: &str, cid: &str| Owner { node: node.into(), ..owner(cid, &format!("default/{cid}")) };
        let starts: Vec<u128> = (1..=16)
            .map(|k| {
                let (a, b) = (on(&format!("node-{k}"), "a"), on(&format!("node-{k}"), "b"));
                let plan = plan_batch_in_lane(&pool, &r, &[(Kind::Add, &a), (Kind::Add, &b)]);
                let [Answer::Offset { offset: first, .. }, Answer::Offset { offset: second, .. }] = &plan.answers[..]
                else {
                    panic!("{:?}", plan.answers)
                };
                let (first, second) = (first.parse::<u128>().unwrap(), second.parse::<u128>().unwrap());
                assert!((1..=2046).contains(&first), "{first}");
                assert_eq!(second, if first == 2046 { 1 } else { first + 1 }, "next-fit within a node's batch");
                first
            })
            .collect();
        let apart = starts.iter().collect::<BTreeSet<_>>().len();
        assert_eq!(apart, 16, "each node from its own place: {starts:?}");
        // The lane is the node's: the same node starts at the same place from the same cursor.
        let again = plan_batch_in_lane(&pool, &r, &[(Kind::Add, &on("node-1", "c"))]);
        assert_eq!(again.answers[0], Answer::offset(starts[0], None));
        // A first write, or no node named: from the cursor.
        assert_eq!(plan_batch(&pool, &r, &[(Kind::Add, &on("node-1", "c"))]).answers[0], Answer::offset(41, None));
        assert_eq!(node_cursor(Some(40), &r, ""), Some(40));
        assert_eq!(
            plan_batch_in_lane(&pool, &r, &[(Kind::Add, &owner("c", "default/c"))]).answers[0],
            Answer::offset(41, None)
        );
        // In an IPv6 /64, a lane is among the first LANE_SPAN offsets after the cursor.
        let v6 = range("2001:db8:1::/64");
        for k in 0..64 {
            let moved = node_cursor(None, &v6, &format!("node-{k}")).unwrap();
            assert!(moved < v6.first + LANE_SPAN, "{moved}");
        }
        // Never outside the range, whatever the cursor says.
        for c in [None, Some(0), Some(1), Some(2046), Some(5000)] {
            let moved = node_cursor(c, &r, "node-7").unwrap();
            assert!((1..=2046).contains(&moved), "{c:?} -> {moved}");
        }
    }

    #[test]
    fn a_batch_on_a_new_pool_creates_its_allocations_and_annotations_once() {
        let r = range("198.18.0.0/24");
        let pool = Pool::from_object("p", &json!({"spec": {"range": "198.18.0.0/24"}}), &r);
        let (a, b) = (owner("c-a", "default/a"), owner("c-b", "default/b"));
        let Plan { ops, answers, .. } = plan_batch(&pool, &r, &[(Kind::Add, &a), (Kind::Add, &b)]);
        assert_eq!(answers, [Answer::offset(1, None), Answer::offset(2, None)]);
        assert_eq!(ops[0], json!({"op": "add", "path": "/spec/allocations", "value": {}}));
        assert_eq!(ops.iter().filter(|o| o["path"] == "/spec/allocations").count(), 1);
        assert_eq!(
            ops.last().unwrap(),
            &json!({"op": "add", "path": "/metadata/annotations", "value": {"ipam.plexus.io/next": "2"}})
        );
    }

    #[test]
    fn json_pointer_keys_are_escaped() {
        assert_eq!(escape("ipam.plexus.io/next"), "ipam.plexus.io~1next");
    }
}
