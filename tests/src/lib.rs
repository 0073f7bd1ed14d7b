//! plexus-tests: the end-to-end harness every plugin's tests use, and those tests.
//!
//! Owns: node and pod network namespaces with veth "NICs" (unique names, removed on drop and on
//! panic), a runner that execs a built plugin inside the node namespace with the CNI environment,
//! and readers of kernel state (`ip -j`, an observer independent of plexus's own netlink code).
//!
//! Rules: never touch the host namespace or `eth0`; addresses from
//! 198.18.0.0/15 and 2001:db8::/32; tests need root and fail, loudly, without it.

pub mod cluster;
pub mod daemon;
pub mod etcd;
pub mod fake_api;
pub mod kernel;
pub mod netns;
pub mod otlp;
pub mod reliability;
pub mod runner;
pub mod tenant;

pub use daemon::DaemonProcess;
pub use kernel::{Addr, Link, Route, Rule};
pub use netns::{Lab, Netns};
pub use runner::{
    Outcome, PluginRun, REFERENCE_CNI_DIR, plugin_bin, previous_release, reference_plugin, test_policy, tool_bin,
    write_policy,
};

/// The data directory of one test's store or state (plexus-ipam's `dataDir`, plexus-host-device's
/// `dataDir`): a direct child of the tests' data root (the system temp dir, [`test_policy`]), as
/// the node policy wants a network's own directory; not made here — plexus makes and marks it,
/// and removes it when it holds nothing — and removed with whatever it holds on drop.
#[derive(Debug)]
pub struct DataDir(std::path::PathBuf);

impl DataDir {
    pub fn new(role: &str) -> DataDir {
        DataDir(std::env::temp_dir().join(netns::unique(role)))
    }

    /// Made now, empty and root-only (for a test that mounts something on it, or fills it first).
    pub fn made(role: &str) -> DataDir {
        use std::os::unix::fs::DirBuilderExt;
        let d = DataDir::new(role);
        std::fs::DirBuilder::new().mode(0o700).create(&d.0).unwrap();
        d
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }

    /// The names in it, sorted, plexus's own mark left out; none when it is gone.
    pub fn entries(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.0)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != ".plexus-data")
            .collect();
        names.sort();
        names
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        unmount_below(&self.0);
        if std::fs::remove_dir_all(&self.0).is_err() {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

impl serde::Serialize for DataDir {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// Unmount (lazily) every mount below `dir`: what a runtime's storage left in a test's temp dir.
pub fn unmount_below(dir: &std::path::Path) {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let prefix = dir.display().to_string();
    let mut points: Vec<&str> =
        mounts.lines().filter_map(|l| l.split_whitespace().nth(1)).filter(|m| m.starts_with(&prefix)).collect();
    points.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in points {
        let _ = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// A mount a test made, undone on drop (panics included): a read-only bind of a directory onto
/// itself, or a small tmpfs — the full and read-only disks plexus must survive.
#[derive(Debug)]
pub struct Mount(std::path::PathBuf);

impl Mount {
    /// `dir`, bound onto itself read-only.
    pub fn read_only(dir: &std::path::Path) -> Mount {
        use nix::mount::{MsFlags, mount};
        mount(Some(dir), dir, None::<&str>, MsFlags::MS_BIND, None::<&str>)
            .unwrap_or_else(|e| panic!("bind {}: {e}", dir.display()));
        let guard = Mount(dir.to_path_buf());
        let ro = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
        mount(None::<&str>, dir, None::<&str>, ro, None::<&str>)
            .unwrap_or_else(|e| panic!("remount {} read-only: {e}", dir.display()));
        guard
    }

    /// A tmpfs of `size` (e.g. `8k`) on `dir`, mode 0700.
    pub fn tmpfs(dir: &std::path::Path, size: &str) -> Mount {
        use nix::mount::{MsFlags, mount};
        let opts = format!("size={size},mode=0700");
        mount(Some("tmpfs"), dir, Some("tmpfs"), MsFlags::empty(), Some(opts.as_str()))
            .unwrap_or_else(|e| panic!("tmpfs on {}: {e}", dir.display()));
        Mount(dir.to_path_buf())
    }

    /// Remount this tmpfs with new options (`size=..,nr_inodes=..`; `read_only` makes it
    /// read-only, false writable again).
    pub fn remount(&self, opts: &str, read_only: bool) {
        use nix::mount::{MsFlags, mount};
        let flags = if read_only { MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY } else { MsFlags::MS_REMOUNT };
        mount(None::<&str>, &self.0, None::<&str>, flags, Some(opts))
            .unwrap_or_else(|e| panic!("remount {} {opts}: {e}", self.0.display()));
    }

    /// Pages (4 KiB) and inodes in use.
    pub fn used(&self) -> (u64, u64) {
        let s = nix::sys::statvfs::statvfs(&self.0).expect("statvfs");
        ((s.blocks() - s.blocks_free()) as u64, (s.files() - s.files_free()) as u64)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// One slot of a GID table in a fake sysfs port directory (`.../ports/<p>`), as the kernel shows
/// it: the GID, its netdev and type; `kind` None is an empty slot, whose type cannot be read
/// (EINVAL in the kernel; a directory here, which a read refuses too).
pub fn gid_slot(port: &std::path::Path, index: u32, gid: &str, kind: Option<&str>, ndev: &str) {
    for d in ["gids", "gid_attrs/types", "gid_attrs/ndevs"] {
        std::fs::create_dir_all(port.join(d)).unwrap();
    }
    std::fs::write(port.join("gids").join(index.to_string()), format!("{gid}\n")).unwrap();
    std::fs::write(port.join("gid_attrs/ndevs").join(index.to_string()), format!("{ndev}\n")).unwrap();
    match kind {
        Some(k) => std::fs::write(port.join("gid_attrs/types").join(index.to_string()), format!("{k}\n")).unwrap(),
        None => std::fs::create_dir_all(port.join("gid_attrs/types").join(index.to_string())).unwrap(),
    }
}

/// Fail, with a clear message, when not root: these tests create namespaces and links, and a
/// test that cannot do what it tests must not report a pass. Run the suite as root, as CI does
/// (`scripts/test.sh` refuses to run otherwise); the unit tests of the crates need no root.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (it creates network namespaces): run the suite as root, as CI does"
    );
}
