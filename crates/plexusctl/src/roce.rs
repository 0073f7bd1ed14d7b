//! `plexusctl roce NETNS | --pod NS/NAME`: the RoCE GIDs of a pod's interfaces, as `show_gids`
//! prints them — which GID index NCCL must use for which interface. The pod's addresses come from
//! its namespace (netlink); the GID tables from sysfs: the node's (shared RDMA mode: the parent's
//! device) and one mounted from the pod's namespace (exclusive mode: the moved device).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use plexus_net::roce::{self, GidEntry};
use plexus_net::sysfs::Sysfs;
use plexus_net::{LinkSocket, Netns, configure};
use plexus_node::paths::SYSFS_ROOT_ENV;

/// One row of the table.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Row {
    pub device: String,
    pub entry: GidEntry,
    pub addr: IpAddr,
    pub ifname: String,
}

/// The netns of pod `ns/name` from the meta-plugin's cache in `cni_dir` (its head names the
/// pod and the namespace path).
pub fn pod_netns(cni_dir: &Path, pod: &str) -> Result<PathBuf> {
    let entries = std::fs::read_dir(cni_dir).with_context(|| format!("read the plexus cache {}", cni_dir.display()))?;
    for e in entries.flatten() {
        let Ok(bytes) = std::fs::read(e.path()) else { continue };
        let Some(Ok(head)) = serde_json::Deserializer::from_slice(&bytes).into_iter::<serde_json::Value>().next()
        else {
            continue;
        };
        if head["podRef"].as_str() == Some(pod)
            && let Some(netns) = head["netns"].as_str()
        {
            return Ok(PathBuf::from(netns));
        }
    }
    bail!("no attachment of pod {pod} in {} (is it running on this node?)", cni_dir.display())
}

/// The pod's interfaces' addresses (loopback and link-local left out): address → interface.
fn pod_addresses(netns: &Netns) -> Result<BTreeMap<IpAddr, String>> {
    configure::runtime()?.block_on(async {
        let sock = LinkSocket::open(netns)?;
        let mut out = BTreeMap::new();
        for link in sock.links().await? {
            if link.name == "lo" {
                continue;
            }
            for plexus_net::Address { net, .. } in sock.addresses(link.index).await? {
                let a = net.ip();
                let link_local = matches!(a, IpAddr::V6(v6) if v6.is_unicast_link_local());
                if !a.is_loopback() && !link_local {
                    out.insert(a, link.name.clone());
                }
            }
        }
        Ok::<_, anyhow::Error>(out)
    })
}

fn rows_of(sysfs: &Sysfs, addrs: &BTreeMap<IpAddr, String>) -> Vec<Row> {
    let mut rows = Vec::new();
    for device in sysfs.rdma_devices() {
        for entry in sysfs.gid_table(&device) {
            if let Some((addr, ifname)) = addrs.iter().find(|(a, _)| roce::gid_of(**a) == entry.gid) {
                rows.push(Row { device: device.clone(), entry, addr: *addr, ifname: ifname.clone() });
            }
        }
    }
    rows
}

/// Every GID table entry, of every RDMA device the pod can use, that carries one of its addresses.
pub fn rows(netns_path: &Path) -> Result<Vec<Row>> {
    let netns = Netns::open(netns_path).with_context(|| format!("open {}", netns_path.display()))?;
    let addrs = pod_addresses(&netns)?;
    let mut rows =
        rows_of(&Sysfs::new(plexus_node::paths::sysfs_root(std::env::var(SYSFS_ROOT_ENV).ok().as_deref())), &addrs);
    // Exclusive mode: devices moved into the pod show only in a sysfs of its namespace (a fake
    // tree, when PLEXUS_SYSFS_ROOT names one, stands for both views).
    if std::env::var_os(SYSFS_ROOT_ENV).is_none_or(|v| v.is_empty()) {
        let pod_addrs = addrs.clone();
        rows.extend(roce::in_netns(&netns, move |s| rows_of(s, &pod_addrs))?);
    }
    rows.sort();
    rows.dedup();
    Ok(rows)
}

/// The table, `show_gids` style.
pub fn print(rows: &[Row]) {
    println!("{:<10} {:<5} {:<6} {:<40} {:<40} {:<4} NETDEV", "DEV", "PORT", "INDEX", "GID", "ADDRESS", "VER");
    for r in rows {
        let ver = match r.entry.kind {
            roce::GidType::RoceV2 => "v2",
            roce::GidType::RoceV1 => "v1",
        };
        println!(
            "{:<10} {:<5} {:<6} {:<40} {:<40} {:<4} {}",
            r.device,
            r.entry.port,
            r.entry.index,
            r.entry.gid,
            r.addr,
            ver,
            // A pod's interface name is its own (tenant) choice: escaped for the terminal.
            plexus_plugin::logging::escape_controls(&r.ifname)
        );
    }
}
