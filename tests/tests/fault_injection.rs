//! A fault at every step. Debug builds of the plugins (the ones the tests run) pass an injection
//! point before each netlink request, private file write, delegate exec and API/etcd call
//! (`plexus_node::fault`): `PLEXUS_FAULT=<binary>:<n>[:kill]` fails the n-th one or kills the
//! process there. For every n of an ADD and of a DEL — of plexus-macvlan, of the plexus-ipam it
//! runs, of plexus-host-device, and of plexus with two delegates — as an error and as SIGKILL,
//! the DEL the runtime sends next (for plexus also with its cache gone) must leave the node
//! exactly as it was: links, addresses, routes and rules of the node and the pod (read with
//! `ip`), and every file in the IPAM, host-device state, cache and device-info directories.

use plexus_tests::reliability::Rig;

#[test]
fn plexus_macvlan_add_and_del_leave_nothing_whatever_step_fails_or_is_killed() {
    let rig = Rig::macvlan();
    let add = rig.every_point("plexus-macvlan", "ADD", false);
    let del = rig.every_point("plexus-macvlan", "DEL", false);
    assert!(add >= 8, "an ADD has at least its netlink steps and the IPAM exec: {add}");
    assert!(del >= 2, "{del}");
}

#[test]
fn plexus_ipam_under_plexus_macvlan_leaves_no_reservation_whatever_step_fails_or_is_killed() {
    let rig = Rig::macvlan();
    let add = rig.every_point("plexus-ipam", "ADD", false);
    let del = rig.every_point("plexus-ipam", "DEL", false);
    assert!(add >= 1 && del >= 1, "{add} {del}");
}

#[test]
fn plexus_host_device_gives_the_device_back_as_it_was_whatever_step_fails_or_is_killed() {
    let rig = Rig::host_device();
    let add = rig.every_point("plexus-host-device", "ADD", false);
    let del = rig.every_point("plexus-host-device", "DEL", false);
    assert!(add >= 5 && del >= 3, "{add} {del}");
}

#[test]
fn plexus_with_two_delegates_leaves_nothing_whatever_step_fails_or_is_killed() {
    let rig = Rig::meta();
    let add = rig.every_point("plexus", "ADD", false);
    let del = rig.every_point("plexus", "DEL", false);
    // The cache, one record per delegate, two delegate execs.
    assert!(add >= 5, "{add}");
    assert!(del >= 2, "{del}");
}

#[test]
fn plexus_with_its_cache_gone_still_leaves_nothing_after_a_fault_at_any_step() {
    let rig = Rig::meta();
    rig.every_point("plexus", "ADD", true);
}

#[test]
fn delegates_run_by_plexus_leave_nothing_whatever_step_of_theirs_fails_or_is_killed() {
    let rig = Rig::meta();
    rig.every_point("plexus-macvlan", "ADD", false);
    rig.every_point("plexus-macvlan", "DEL", false);
}
