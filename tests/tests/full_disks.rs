//! Full and read-only disks. The IPAM data dir, the meta-plugin's cache dir and the host-device
//! state dir each get a tmpfs of their own; it is then remounted with room for exactly k more
//! pages (or inodes), for every k from none up to what a clean ADD needs, and read-only. Each
//! time, an ADD that fails does so with a CNI error naming the path; the runtime's DEL succeeds
//! and leaves node, pod and files exactly as before; and once there is room again a clean ADD
//! works (nothing half-written was kept and trusted).

use std::path::Path;

use plexus_tests::Mount;
use plexus_tests::reliability::Rig;

/// Room for everything but the resource under test.
const ROOMY_PAGES: u64 = 256;
const ROOMY_INODES: u64 = 1024;

#[derive(Clone, Copy, Debug)]
enum Resource {
    Pages,
    Inodes,
}

/// Tmpfs options: room for `room` more of the resource under test (None: room for everything).
fn limits(mount: &Mount, tight: Option<(Resource, u64)>) -> String {
    let (pages, inodes) = mount.used();
    let (page_room, inode_room) = match tight {
        None => (ROOMY_PAGES, ROOMY_INODES),
        Some((Resource::Pages, room)) => (room, ROOMY_INODES),
        Some((Resource::Inodes, room)) => (ROOMY_PAGES, room),
    };
    format!("size={}k,nr_inodes={}", (pages + page_room) * 4, inodes + inode_room)
}

/// The error of a failed ADD names the directory (or a path below it).
fn assert_names_path(what: &str, dir: &Path, out: &plexus_tests::Outcome) {
    let (code, msg, details) = out.error();
    assert!(code != 0, "{what}: {}", out.stdout);
    let shown = format!("{msg} {details}");
    let dir_name = dir.file_name().unwrap().to_string_lossy();
    assert!(
        shown.contains(&dir.display().to_string()) || shown.contains(&format!("{dir_name}/")),
        "{what}: the error does not name the path {}: {shown}",
        dir.display()
    );
}

/// Mount a tmpfs on `<sub>` (the rig's IPAM or state data directory, or `rig.dir/<sub>`), then:
/// every k of room in pages and in inodes, and read-only. Returns the rooms at which an ADD first
/// succeeded (pages, inodes).
fn exhaust(rig: &Rig, sub: &str) -> (u64, u64) {
    let dir = match sub {
        "ipam" => rig.ipam.path().to_path_buf(),
        "state" => rig.state.path().to_path_buf(),
        _ => rig.dir.path().join(sub),
    };
    std::fs::create_dir_all(&dir).unwrap();
    let mount = Mount::tmpfs(&dir, "1m");
    // A page in use from the start: a tmpfs cannot be sized to zero pages (that means unlimited).
    // A data directory has its mark, which stays (a mount point is never removed); the cache
    // directory gets a file.
    if !matches!(sub, "ipam" | "state") {
        std::fs::write(dir.join("ballast"), [0u8; 4096]).unwrap();
    }
    let no_log = Path::new("/dev/null");
    // A first cycle creates what stays (the data directory's mark, the cache directory).
    assert!(rig.run("ADD", None, no_log).success());
    assert!(rig.run("DEL", None, no_log).success());
    let before = rig.snapshot();
    let check = |what: &str| {
        let del = rig.run("DEL", None, no_log);
        assert!(del.success(), "{what}: the runtime's DEL failed: {}", del.stdout);
        let after = rig.snapshot();
        assert_eq!(after.0, before.0, "{what}: the node namespace changed");
        assert_eq!(after.1, before.1, "{what}: the pod namespace changed");
        assert_eq!(after.2, before.2, "{what}: files left or lost");
    };
    let mut first_success = [0u64; 2];
    for (i, resource) in [Resource::Pages, Resource::Inodes].into_iter().enumerate() {
        let mut room = 0;
        loop {
            let what = format!("{sub} with room for {room} more {resource:?}");
            // The disk stays full for the DEL too.
            mount.remount(&limits(&mount, Some((resource, room))), false);
            let add = rig.run("ADD", None, no_log);
            if add.success() {
                check(&what);
                mount.remount(&limits(&mount, None), false);
                first_success[i] = room;
                break;
            }
            assert_names_path(&what, &dir, &add);
            check(&what);
            // Room again: a clean ADD trusts nothing the failed one half-wrote.
            mount.remount(&limits(&mount, None), false);
            let again = rig.run("ADD", None, no_log);
            assert!(again.success(), "{what}: ADD with room again: {}", again.stdout);
            check(&what);
            room += 1;
            assert!(room <= 64, "{what}: an ADD needs more than 64 {resource:?}?");
        }
    }
    let what = format!("{sub} read-only");
    mount.remount("", true);
    let add = rig.run("ADD", None, no_log);
    assert!(!add.success(), "{what}: ADD succeeded on a read-only {sub}");
    assert_names_path(&what, &dir, &add);
    check(&what);
    mount.remount("", false);
    assert!(rig.run("ADD", None, no_log).success(), "{what}: writable again");
    check(&what);
    eprintln!(
        "{} on a full {sub}: ADD fails cleanly below {} pages / {} inodes of room",
        rig.binary, first_success[0], first_success[1]
    );
    (first_success[0], first_success[1])
}

#[test]
fn a_full_or_read_only_ipam_data_dir_fails_add_naming_it_and_del_leaves_nothing() {
    let rig = Rig::macvlan();
    let (pages, inodes) = exhaust(&rig, "ipam");
    assert!(pages >= 1 && inodes >= 1, "an allocation writes files: {pages} {inodes}");
}

#[test]
fn a_full_or_read_only_meta_cache_dir_fails_add_naming_it_and_del_leaves_nothing() {
    let rig = Rig::meta();
    let (pages, inodes) = exhaust(&rig, "cache");
    assert!(pages >= 1 && inodes >= 1, "the cache is written: {pages} {inodes}");
}

#[test]
fn a_full_or_read_only_host_device_state_dir_fails_add_naming_it_and_del_gives_the_device_back() {
    let rig = Rig::host_device();
    let (pages, inodes) = exhaust(&rig, "state");
    assert!(pages >= 1 && inodes >= 1, "the state is written: {pages} {inodes}");
}
