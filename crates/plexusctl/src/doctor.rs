//! `plexusctl doctor`: is this node ready for RoCE attachments? Each finding says what is wrong
//! and how to fix it; any failure makes the exit status non-zero.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::Result;
use plexus_net::rdma::{NetnsMode, RdmaSocket};
use plexus_net::roce::GidType;
use plexus_net::sysfs::Sysfs;
use plexus_net::{LinkSocket, configure};

/// The binaries a node needs in its CNI bin dir.
pub const BINARIES: [&str; 4] = ["plexus", "plexus-macvlan", "plexus-host-device", "plexus-ipam"];

#[derive(Debug, PartialEq, Eq)]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug)]
pub struct Finding {
    pub level: Level,
    pub what: String,
    pub fix: Option<String>,
}

fn ok(what: impl Into<String>) -> Finding {
    Finding { level: Level::Ok, what: what.into(), fix: None }
}
fn warn(what: impl Into<String>, fix: impl Into<String>) -> Finding {
    Finding { level: Level::Warn, what: what.into(), fix: Some(fix.into()) }
}
fn fail(what: impl Into<String>, fix: impl Into<String>) -> Finding {
    Finding { level: Level::Fail, what: what.into(), fix: Some(fix.into()) }
}

pub struct Options {
    pub parent: Option<String>,
    pub mtu: Option<u32>,
    pub bin_dir: PathBuf,
    pub conf: Option<PathBuf>,
}

pub fn check(o: &Options) -> Result<Vec<Finding>> {
    let mut out = Vec::new();
    if let Some(parent) = &o.parent {
        check_parent(parent, o.mtu, &mut out)?;
    }
    for b in BINARIES {
        let p = o.bin_dir.join(b);
        match std::fs::metadata(&p) {
            Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => {
                out.push(ok(format!("{} is installed", p.display())))
            }
            _ => out.push(fail(
                format!("{} is missing or not executable", p.display()),
                format!("install the plexus binaries: scripts/install.sh --bin-dir {}", o.bin_dir.display()),
            )),
        }
    }
    if let Some(conf) = &o.conf {
        out.push(check_conf(conf));
    }
    Ok(out)
}

fn check_parent(parent: &str, mtu: Option<u32>, out: &mut Vec<Finding>) -> Result<()> {
    let link = configure::runtime()?.block_on(async {
        let sock = LinkSocket::current()?;
        sock.link(parent).await
    })?;
    let Some(link) = link else {
        out.push(fail(
            format!("parent interface {parent} not found"),
            "check the NIC name (`ip link`) and that its driver (mlx5_core) is loaded",
        ));
        return Ok(());
    };
    out.push(ok(format!("parent interface {parent} exists (index {})", link.index)));
    if link.up {
        out.push(ok(format!("{parent} is up")));
    } else {
        out.push(fail(format!("{parent} is down"), format!("ip link set {parent} up")));
    }
    match mtu {
        Some(want) if link.mtu < want => out.push(fail(
            format!("{parent} has MTU {}, the fabric needs {want}", link.mtu),
            format!("ip link set {parent} mtu {want} (and the switch ports): RoCE's 4096-byte MTU needs jumbo frames"),
        )),
        _ => out.push(ok(format!("{parent} MTU {}", link.mtu))),
    }
    let named = std::env::var(plexus_node::paths::SYSFS_ROOT_ENV).ok();
    let sysfs = Sysfs::new(plexus_node::paths::sysfs_root(named.as_deref()));
    let hw = sysfs.netdev_hardware(parent);
    match &hw.pci_address {
        Some(pci) => {
            out.push(ok(format!("{parent} is PCI device {pci} (driver {})", hw.driver.as_deref().unwrap_or("?"))))
        }
        None => out.push(warn(
            format!("{parent} has no PCI device in {}", sysfs.root().display()),
            "a virtual interface cannot carry RoCE: use the ConnectX port (PF, VF or SF)",
        )),
    }
    match &hw.rdma_device {
        Some(rdma) => {
            out.push(ok(format!("{parent} has RDMA device {rdma}")));
            let addrs = configure::runtime()?
                .block_on(async { LinkSocket::current()?.addresses(link.index).await.map_err(anyhow::Error::from) })?;
            check_gids(&sysfs, parent, rdma, &addrs.iter().map(|a| a.net.ip()).collect::<Vec<_>>(), out);
            match RdmaSocket::open().and_then(|mut s| s.netns_mode()) {
                Ok(NetnsMode::Exclusive) => {
                    out.push(ok("RDMA netns mode: exclusive (host-device moves RDMA devices into pods)"))
                }
                Ok(NetnsMode::Shared) => out.push(ok("RDMA netns mode: shared (macvlan pods share the RDMA device)")),
                Err(e) => out.push(warn(
                    format!("RDMA netns mode unknown: {e}"),
                    "load ib_core/mlx5_ib; `rdma system` shows the mode",
                )),
            }
        }
        None => out.push(fail(
            format!("{parent} has no RDMA device"),
            "load the RDMA driver (modprobe mlx5_ib) and check the NIC has RoCE enabled",
        )),
    }
    Ok(())
}

/// The GID table of the port's RDMA device: entries per type, and a RoCE v2 entry for each of
/// the port's own (non-link-local) addresses.
fn check_gids(sysfs: &Sysfs, parent: &str, rdma: &str, addrs: &[std::net::IpAddr], out: &mut Vec<Finding>) {
    if !sysfs.has_gid_table(rdma) {
        out.push(warn(
            format!("{rdma} has no GID table in {}", sysfs.root().display()),
            "an RDMA device without ports/*/gids is not a RoCE port: check the NIC's link layer (Ethernet)",
        ));
        return;
    }
    let table = sysfs.gid_table(rdma);
    let v2 = table.iter().filter(|e| e.kind == GidType::RoceV2).count();
    let v1 = table.len() - v2;
    if v2 == 0 {
        out.push(fail(
            format!("{rdma} GID table: {v1} IB/RoCE v1 entries, no RoCE v2 entry"),
            "NCCL needs RoCE v2: check the firmware's RoCE mode and that the port has addresses",
        ));
    } else {
        out.push(ok(format!("{rdma} GID table: {v2} RoCE v2 and {v1} IB/RoCE v1 entries")));
    }
    for a in addrs {
        if matches!(a, std::net::IpAddr::V6(v6) if v6.is_unicast_link_local()) {
            continue;
        }
        let gid = plexus_net::roce::gid_of(*a);
        match table.iter().find(|e| e.gid == gid && e.kind == GidType::RoceV2) {
            Some(e) => {
                out.push(ok(format!("{parent} address {a}: RoCE v2 GID at {rdma} port {} index {}", e.port, e.index)))
            }
            None => out.push(warn(
                format!("{parent} address {a} has no RoCE v2 GID in {rdma}'s table"),
                "the kernel adds GIDs for a RoCE port's addresses: check `ip addr` on the port and dmesg for mlx5_ib",
            )),
        }
    }
}

fn check_conf(path: &Path) -> Finding {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) => {
            return fail(format!("meta config {}: {e}", path.display()), "write the plexus config into /etc/cni/net.d");
        }
    };
    let v: serde_json::Value = match serde_json::from_slice(&text) {
        Ok(v) => v,
        Err(e) => return fail(format!("meta config {} is not JSON: {e}", path.display()), "fix the JSON"),
    };
    let plugin = v.get("plugins").and_then(|p| p.get(0)).unwrap_or(&v);
    if plugin.get("type").and_then(|t| t.as_str()) != Some("plexus") {
        return fail(
            format!("meta config {} does not run plexus first", path.display()),
            "its (first) plugin must be \"type\": \"plexus\"",
        );
    }
    let cluster = plugin.get("clusterNetwork").and_then(|c| c.as_str()).is_some_and(|c| !c.is_empty());
    let delegates = plugin.get("delegates").and_then(|d| d.as_array()).is_some_and(|d| !d.is_empty());
    if cluster && delegates {
        return fail(
            format!("meta config {}: clusterNetwork and delegates together", path.display()),
            "keep one of them",
        );
    }
    ok(format!("meta config {} parses", path.display()))
}

pub fn print(findings: &[Finding]) -> bool {
    let mut healthy = true;
    for f in findings {
        let tag = match f.level {
            Level::Ok => "OK  ",
            Level::Warn => "WARN",
            Level::Fail => {
                healthy = false;
                "FAIL"
            }
        };
        println!("{tag} {}", f.what);
        if let Some(fix) = &f.fix {
            println!("     fix: {fix}");
        }
    }
    healthy
}
