//! How plexus reads the GID table of an RDMA device moved into a pod (exclusive RDMA mode): that
//! device is visible only to a sysfs mounted from the pod's network namespace, so plexus mounts
//! one in a private mount namespace of a thread that joined it. This kernel has no RDMA: the
//! tests check the mechanism on what the same sysfs shows of netdevs (namespaced the same way),
//! and that nothing is mounted anywhere else.

use plexus_tests::Lab;

fn mounts() -> usize {
    std::fs::read_to_string("/proc/self/mountinfo").unwrap().lines().count()
}

#[test]
fn sysfs_mounted_from_the_pods_namespace_shows_the_pods_devices_and_leaves_no_mount_behind() {
    plexus_tests::require_root();
    let lab = Lab::new();
    lab.add_nic("nic0", 9000);
    lab.pod.ip(&["link", "add", "podonly0", "type", "veth", "peer", "name", "podonly1"]);
    let before = mounts();
    let pod = plexus_net::Netns::open(&lab.pod.path()).unwrap();
    let names = plexus_net::roce::in_netns(&pod, |sysfs| {
        let mut n: Vec<String> = std::fs::read_dir(sysfs.root().join("class/net"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        n.sort();
        n
    })
    .unwrap();
    assert_eq!(names, ["lo", "podonly0", "podonly1"], "the pod's netdevs, not the node's nic0");
    assert_eq!(mounts(), before, "the sysfs mount lived only in the reader thread's namespace");
    // The node's own view is untouched.
    assert!(std::path::Path::new("/sys/class/net/lo").exists());
    // No RDMA device in the pod here: no GIDs, no error, no wait.
    let start = std::time::Instant::now();
    let addr = "198.18.0.10".parse().unwrap();
    let sysfs = plexus_net::sysfs::Sysfs::new(plexus_node::paths::SYSFS_ROOT);
    let gids =
        plexus_net::roce::gids_for_in(&pod, &sysfs, "mlx5_0", &[addr], std::time::Duration::from_secs(5)).unwrap();
    assert!(gids.is_empty());
    assert!(start.elapsed() < std::time::Duration::from_secs(1));
}
