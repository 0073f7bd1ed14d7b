//! RoCE GIDs: which entries of an RDMA device's GID table belong to the addresses plexus put on a
//! pod's interface — what NCCL's `NCCL_IB_GID_INDEX` must name, and what no other component of
//! the stack tells the pod.
//!
//! The table is sysfs's: `class/infiniband/<dev>/ports/<port>/gids/<index>` (the GID, eight
//! lower-case groups of four hex digits), `gid_attrs/types/<index>` (`RoCE v2` or `IB/RoCE v1`)
//! and `gid_attrs/ndevs/<index>` (the netdev). An empty slot reads as the all-zero GID and its
//! attribute files fail (EINVAL): skipped. The kernel fills the table asynchronously after an
//! address is added, so the lookup waits, bounded, for each address's RoCE v2 entry; it never
//! fails: what it did not find is simply not reported (and logged).
//!
//! Entries are matched by GID value — the address, IPv4 as the IPv4-mapped IPv6 address — never
//! by netdev name: several pods' macvlans on one parent are often all called `net1`.
//!
//! In exclusive RDMA mode the device moved into the pod is visible only to a sysfs mounted from
//! the pod's network namespace: [`in_netns`] mounts one in a private mount namespace of a thread
//! of its own. `PLEXUS_SYSFS_ROOT` (tests: a fake tree) replaces both.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use plexus_cni::Error;
use serde::Serialize;

use crate::netns::Netns;
use crate::sysfs::Sysfs;

/// How long ADD waits for the kernel to list an address's RoCE v2 GID, unless configured.
pub const DEFAULT_WAIT: Duration = Duration::from_millis(1000);
/// The longest wait a config may ask for (`roceGidWaitMs`).
pub const MAX_WAIT: Duration = Duration::from_millis(10_000);
/// How often the table is read again while waiting.
const POLL: Duration = Duration::from_millis(10);

/// The GID type sysfs reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum GidType {
    /// `RoCE v2`: routable, UDP-encapsulated; what NCCL uses on RoCE fabrics.
    RoceV2,
    /// `IB/RoCE v1`.
    RoceV1,
}

impl GidType {
    pub fn as_str(self) -> &'static str {
        match self {
            GidType::RoceV2 => "RoCE v2",
            GidType::RoceV1 => "IB/RoCE v1",
        }
    }

    fn parse(s: &str) -> Option<GidType> {
        match s.trim() {
            "RoCE v2" => Some(GidType::RoceV2),
            "IB/RoCE v1" => Some(GidType::RoceV1),
            _ => None,
        }
    }
}

impl Serialize for GidType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// One filled entry of a GID table.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct GidEntry {
    pub port: u32,
    pub index: u32,
    /// As sysfs prints it: eight lower-case groups of four hex digits.
    pub gid: String,
    #[serde(rename = "type")]
    pub kind: GidType,
    /// The netdev the entry belongs to (not serialised into device-info: names repeat across pods).
    #[serde(skip)]
    pub ndev: Option<String>,
}

/// The GID of an address, as sysfs prints it (IPv4 as the IPv4-mapped IPv6 address).
pub fn gid_of(addr: IpAddr) -> String {
    let v6 = match addr {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    v6.segments().iter().map(|s| format!("{s:04x}")).collect::<Vec<_>>().join(":")
}

fn valid_device_name(dev: &str) -> bool {
    !dev.is_empty()
        && dev.len() <= 64
        && dev.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && dev != "."
        && dev != ".."
}

fn numbered(dir: &Path) -> Vec<u32> {
    let mut n: Vec<u32> = std::fs::read_dir(dir)
        .map(|d| d.flatten().filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok())).collect())
        .unwrap_or_default();
    n.sort_unstable();
    n
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

impl Sysfs {
    fn ports_dir(&self, dev: &str) -> Option<PathBuf> {
        valid_device_name(dev).then(|| self.root().join("class/infiniband").join(dev).join("ports"))
    }

    /// Whether RDMA device `dev` has a GID table here (RoCE and IB ports do).
    pub fn has_gid_table(&self, dev: &str) -> bool {
        self.ports_dir(dev).is_some_and(|p| p.is_dir())
    }

    /// Every filled entry of every port of RDMA device `dev`, by port and index.
    pub fn gid_table(&self, dev: &str) -> Vec<GidEntry> {
        let Some(ports) = self.ports_dir(dev) else { return Vec::new() };
        let mut out = Vec::new();
        for port in numbered(&ports) {
            let p = ports.join(port.to_string());
            for index in numbered(&p.join("gids")) {
                let Some(gid) = read_trimmed(&p.join("gids").join(index.to_string())) else { continue };
                if gid.chars().all(|c| c == '0' || c == ':') {
                    continue; // an empty slot
                }
                // An empty slot's attributes fail to read (EINVAL); an unknown type is skipped too.
                let Some(kind) = read_trimmed(&p.join("gid_attrs/types").join(index.to_string()))
                    .as_deref()
                    .and_then(GidType::parse)
                else {
                    continue;
                };
                let ndev = read_trimmed(&p.join("gid_attrs/ndevs").join(index.to_string())).filter(|n| !n.is_empty());
                out.push(GidEntry { port, index, gid, kind, ndev });
            }
        }
        out
    }

    /// Names of the RDMA devices this sysfs shows.
    pub fn rdma_devices(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.root().join("class/infiniband"))
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        names.sort();
        names
    }
}

/// The entries of `dev`'s table (both types) whose GID is one of `addrs`, waiting up to `wait`
/// for every address to have its RoCE v2 entry. Never fails: a device without a table, or a
/// table the kernel did not fill in time, gives what there is (logged).
pub fn gids_for(sysfs: &Sysfs, dev: &str, addrs: &[IpAddr], wait: Duration) -> Vec<GidEntry> {
    if addrs.is_empty() || !sysfs.has_gid_table(dev) {
        return Vec::new();
    }
    let wanted: Vec<String> = addrs.iter().map(|a| gid_of(*a)).collect();
    let deadline = Instant::now() + wait;
    loop {
        let found: Vec<GidEntry> = sysfs.gid_table(dev).into_iter().filter(|e| wanted.contains(&e.gid)).collect();
        let complete = wanted.iter().all(|g| found.iter().any(|e| &e.gid == g && e.kind == GidType::RoceV2));
        if complete || Instant::now() >= deadline {
            if !complete {
                let missing: Vec<&String> = wanted
                    .iter()
                    .filter(|g| !found.iter().any(|e| &e.gid == *g && e.kind == GidType::RoceV2))
                    .collect();
                tracing::warn!(device = dev, ?missing, ?wait, "no RoCE v2 GID for these addresses in time");
            }
            return found;
        }
        std::thread::sleep(POLL);
    }
}

/// [`gids_for`] as seen from network namespace `netns`: sysfs mounted in a private mount
/// namespace of a thread that joined it (the moved RDMA device of exclusive mode is visible only
/// there). With a fake tree as `sysfs`, that tree is read instead.
pub fn gids_for_in(
    netns: &Netns,
    sysfs: &Sysfs,
    dev: &str,
    addrs: &[IpAddr],
    wait: Duration,
) -> Result<Vec<GidEntry>, Error> {
    if sysfs.is_fake() {
        return Ok(gids_for(sysfs, dev, addrs, wait));
    }
    let (dev, addrs) = (dev.to_string(), addrs.to_vec());
    in_netns(netns, move |sysfs| gids_for(sysfs, &dev, &addrs, wait))
}

/// Run `f` with a sysfs mounted from network namespace `netns`, on a thread of its own with a
/// private mount namespace (nothing is mounted anywhere else; the mount goes with the thread).
pub fn in_netns<T: Send + 'static>(netns: &Netns, f: impl FnOnce(&Sysfs) -> T + Send + 'static) -> Result<T, Error> {
    use nix::mount::{MsFlags, mount};
    use nix::sched::{CloneFlags, setns, unshare};
    let fd = netns.fd().try_clone_to_owned().map_err(|e| Error::io(format!("netns descriptor: {e}")))?;
    let path = netns.path().display().to_string();
    let work = std::thread::spawn(move || -> Result<T, Error> {
        let fail = |what: &str, e: nix::Error| Error::io(format!("sysfs of {path}: {what}: {e}"));
        // A mount namespace of this thread's own (CLONE_NEWNS implies an fs_struct of its own).
        unshare(CloneFlags::CLONE_NEWNS).map_err(|e| fail("unshare mount namespace", e))?;
        mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
            .map_err(|e| fail("make mounts private", e))?;
        setns(&fd, CloneFlags::CLONE_NEWNET).map_err(|e| fail("join network namespace", e))?;
        // sysfs shows the network namespace of whoever mounts it. Mounted over /sys: this
        // thread's namespace only, gone when the thread ends.
        mount(
            Some("sysfs"),
            "/sys",
            Some("sysfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            None::<&str>,
        )
        .map_err(|e| fail("mount sysfs", e))?;
        Ok(f(&Sysfs::new("/sys")))
    });
    work.join().map_err(|_| Error::io("sysfs reader thread panicked"))?
}

/// The wait a config asks for (`roceGidWaitMs`): default [`DEFAULT_WAIT`], at most [`MAX_WAIT`].
pub fn configured_wait(ms: Option<u64>) -> Result<Duration, Error> {
    match ms {
        None => Ok(DEFAULT_WAIT),
        Some(ms) if Duration::from_millis(ms) <= MAX_WAIT => Ok(Duration::from_millis(ms)),
        Some(ms) => {
            Err(Error::invalid_config(format!("roceGidWaitMs {ms} is too long: at most {} ms", MAX_WAIT.as_millis())))
        }
    }
}

/// The device-info document with the GIDs added to its `pci` object (`roce-gids`).
pub fn with_gids(mut doc: serde_json::Value, gids: &[GidEntry]) -> serde_json::Value {
    if !gids.is_empty()
        && let Some(pci) = doc.get_mut("pci").and_then(|p| p.as_object_mut())
    {
        pci.insert("roce-gids".into(), serde_json::to_value(gids).expect("json"));
    }
    doc
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A port's GID table in a fake sysfs, shaped like a ConnectX port's.
    struct Table {
        dir: tempfile::TempDir,
    }

    impl Table {
        fn new() -> Table {
            let t = Table { dir: tempfile::tempdir().unwrap() };
            // Default GIDs: the link-local address, as v1 and v2, at 0 and 1.
            t.set("mlx5_0", 1, 0, "fe80:0000:0000:0000:0a5c:2bff:fe11:2233", Some("IB/RoCE v1"), "ens1f0np0");
            t.set("mlx5_0", 1, 1, "fe80:0000:0000:0000:0a5c:2bff:fe11:2233", Some("RoCE v2"), "ens1f0np0");
            t
        }

        fn port(&self, dev: &str, port: u32) -> PathBuf {
            self.dir.path().join("class/infiniband").join(dev).join("ports").join(port.to_string())
        }

        fn set(&self, dev: &str, port: u32, index: u32, gid: &str, kind: Option<&str>, ndev: &str) {
            let p = self.port(dev, port);
            for d in ["gids", "gid_attrs/types", "gid_attrs/ndevs"] {
                fs::create_dir_all(p.join(d)).unwrap();
            }
            fs::write(p.join("gids").join(index.to_string()), format!("{gid}\n")).unwrap();
            match kind {
                Some(k) => {
                    fs::write(p.join("gid_attrs/types").join(index.to_string()), format!("{k}\n")).unwrap();
                    fs::write(p.join("gid_attrs/ndevs").join(index.to_string()), format!("{ndev}\n")).unwrap();
                }
                None => {
                    // An empty slot: its attribute files exist but cannot be read (EINVAL in
                    // the kernel; a directory here, which read_to_string refuses too).
                    fs::create_dir_all(p.join("gid_attrs/types").join(index.to_string())).unwrap();
                }
            }
        }

        fn empty_slot(&self, dev: &str, port: u32, index: u32) {
            self.set(dev, port, index, "0000:0000:0000:0000:0000:0000:0000:0000", None, "");
        }

        fn sysfs(&self) -> Sysfs {
            Sysfs::new(self.dir.path())
        }
    }

    fn addr(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ipv4_gids_are_ipv4_mapped_and_printed_as_sysfs_does() {
        assert_eq!(gid_of(addr("198.18.240.1")), "0000:0000:0000:0000:0000:ffff:c612:f001");
        assert_eq!(gid_of(addr("2001:db8::5")), "2001:0db8:0000:0000:0000:0000:0000:0005");
    }

    #[test]
    fn the_entries_of_an_address_are_found_by_value_across_holes_and_macvlans_of_other_pods() {
        let t = Table::new();
        // Another pod's macvlan, also called net1, on the same parent: entries 2 and 3.
        t.set("mlx5_0", 1, 2, &gid_of(addr("198.18.240.7")), Some("IB/RoCE v1"), "net1");
        t.set("mlx5_0", 1, 3, &gid_of(addr("198.18.240.7")), Some("RoCE v2"), "net1");
        // A hole left by a pod that went away, then ours: a sparse table.
        t.empty_slot("mlx5_0", 1, 4);
        t.empty_slot("mlx5_0", 1, 5);
        t.set("mlx5_0", 1, 6, &gid_of(addr("198.18.240.1")), Some("IB/RoCE v1"), "net1");
        t.set("mlx5_0", 1, 7, &gid_of(addr("198.18.240.1")), Some("RoCE v2"), "net1");
        t.set("mlx5_0", 1, 8, &gid_of(addr("2001:db8::1")), Some("RoCE v2"), "net1");
        let found = gids_for(&t.sysfs(), "mlx5_0", &[addr("198.18.240.1"), addr("2001:db8::1")], Duration::ZERO);
        let got: Vec<(u32, u32, GidType)> = found.iter().map(|e| (e.port, e.index, e.kind)).collect();
        assert_eq!(got, [(1, 6, GidType::RoceV1), (1, 7, GidType::RoceV2), (1, 8, GidType::RoceV2)]);
        assert_eq!(found[1].gid, "0000:0000:0000:0000:0000:ffff:c612:f001");
        assert_eq!(t.sysfs().gid_table("mlx5_0").len(), 7, "empty slots are skipped");
    }

    #[test]
    fn entries_of_a_second_port_are_reported_with_their_port() {
        let t = Table::new();
        t.set("mlx5_0", 2, 4, &gid_of(addr("198.18.241.1")), Some("RoCE v2"), "net2");
        let found = gids_for(&t.sysfs(), "mlx5_0", &[addr("198.18.241.1")], Duration::ZERO);
        assert_eq!(found.iter().map(|e| (e.port, e.index)).collect::<Vec<_>>(), [(2, 4)]);
    }

    #[test]
    fn a_table_filled_later_is_waited_for_within_the_deadline() {
        let t = Table::new();
        let port = t.port("mlx5_0", 1);
        let gid = gid_of(addr("198.18.240.1"));
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            fs::write(port.join("gids/9"), format!("{gid}\n")).unwrap();
            fs::write(port.join("gid_attrs/ndevs/9"), "net1\n").unwrap();
            fs::write(port.join("gid_attrs/types/9"), "RoCE v2\n").unwrap();
        });
        let start = Instant::now();
        let found = gids_for(&t.sysfs(), "mlx5_0", &[addr("198.18.240.1")], Duration::from_secs(5));
        writer.join().unwrap();
        assert_eq!(found.iter().map(|e| e.index).collect::<Vec<_>>(), [9]);
        assert!(start.elapsed() < Duration::from_secs(5), "returned once the entry appeared");
    }

    #[test]
    fn a_table_never_filled_gives_nothing_after_the_deadline_and_no_table_gives_nothing_at_once() {
        let t = Table::new();
        let start = Instant::now();
        assert!(gids_for(&t.sysfs(), "mlx5_0", &[addr("198.18.240.1")], Duration::from_millis(100)).is_empty());
        assert!(start.elapsed() >= Duration::from_millis(100));
        let start = Instant::now();
        assert!(gids_for(&t.sysfs(), "mlx5_9", &[addr("198.18.240.1")], Duration::from_secs(5)).is_empty());
        assert!(gids_for(&t.sysfs(), "../../etc", &[addr("198.18.240.1")], Duration::from_secs(5)).is_empty());
        assert!(start.elapsed() < Duration::from_secs(1), "no table: no wait");
    }

    #[test]
    fn gids_go_into_the_pci_object_of_device_info_as_the_issue_describes() {
        let doc = serde_json::json!({"type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:3b:00.0", "rdma-device": "mlx5_0"}});
        let gids = vec![GidEntry {
            port: 1,
            index: 7,
            gid: gid_of(addr("198.18.240.1")),
            kind: GidType::RoceV2,
            ndev: Some("net1".into()),
        }];
        assert_eq!(
            with_gids(doc.clone(), &gids)["pci"]["roce-gids"],
            serde_json::json!([{"port": 1, "index": 7, "gid": "0000:0000:0000:0000:0000:ffff:c612:f001", "type": "RoCE v2"}])
        );
        assert_eq!(with_gids(doc.clone(), &[]), doc, "no GIDs: no key");
    }

    #[test]
    fn the_configured_wait_is_bounded_and_names_the_key() {
        assert_eq!(configured_wait(None).unwrap(), DEFAULT_WAIT);
        assert_eq!(configured_wait(Some(0)).unwrap(), Duration::ZERO);
        let e = configured_wait(Some(60_000)).unwrap_err();
        assert!(e.msg.contains("roceGidWaitMs 60000"), "{}", e.msg);
    }
}
