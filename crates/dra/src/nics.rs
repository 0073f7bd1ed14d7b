//! Which of the node's netdevs plexus offers as DRA devices, and what it says about each.
//!
//! A netdev is offered when sysfs shows it an RDMA device (a RoCE port: a PF, VF or SF), it does
//! not carry the node's default route, it shares no PCI function with the interface that does (a
//! sub-function of the uplink would take the node off the network), it is not enslaved to a bridge
//! or bond, and the node policy's node-wide lists allow it for its mode: `allow.devices` and
//! `allow.pciAddresses` for an exclusive port (moved into a pod whole), `allow.parents` for a
//! shared one (the parent of pods' macvlans). Which ports are shared is the admin's choice.

use plexus_net::Link;
use plexus_net::sysfs::Sysfs;
use plexus_node::Policy;
use plexus_node::policy::Allowed;

/// How a port is handed to pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The whole netdev (and its RDMA device) moved into one pod: plexus-host-device.
    Exclusive,
    /// A macvlan on the port for each claim, the RDMA device shared: plexus-macvlan.
    Shared,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
        }
    }
}

/// A RoCE port the node offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nic {
    /// The DRA device name: the netdev's name made a DNS label ([`device_name`]).
    pub device: String,
    pub ifname: String,
    pub mode: Mode,
    pub pci_address: String,
    pub pcie_root: Option<String>,
    pub numa_node: Option<i64>,
    /// `pf`, `vf` or `sf`.
    pub function: &'static str,
    pub rdma_device: String,
    /// `uverbsN` of the RDMA device (`/dev/infiniband/uverbsN`).
    pub uverbs: Vec<String>,
    pub mac: Option<String>,
    pub mtu: u32,
    pub speed_mbps: Option<i64>,
}

/// What the node's kernel says, read once per scan.
pub struct NodeView<'a> {
    pub links: &'a [Link],
    /// Indexes of the links that carry a default route.
    pub default_route: &'a [u32],
    pub sysfs: &'a Sysfs,
    pub policy: &'a Policy,
    /// The netdevs the admin shares (macvlans) rather than hands out whole.
    pub shared: &'a [String],
}

/// Why a netdev is not offered (logged once per change by the publisher).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub ifname: String,
    pub why: String,
}

/// The ports offered, sorted by name, and the RDMA-capable netdevs left out with why.
pub fn discover(view: &NodeView<'_>) -> (Vec<Nic>, Vec<Skipped>) {
    let uplink_pci: Vec<String> = view
        .links
        .iter()
        .filter(|l| view.default_route.contains(&l.index))
        .filter_map(|l| view.sysfs.netdev_hardware(&l.name).pci_address)
        .collect();
    let mut nics = Vec::new();
    let mut skipped = Vec::new();
    for link in view.links {
        let Some(dev) = view.sysfs.netdev_device(&link.name) else { continue };
        let hw = view.sysfs.device_hardware(&dev);
        let (Some(rdma), Some(pci)) = (hw.rdma_device.clone(), hw.pci_address.clone()) else { continue };
        let mode = if view.shared.contains(&link.name) { Mode::Shared } else { Mode::Exclusive };
        let refused = if view.default_route.contains(&link.index) {
            Some("carries the node's default route".to_string())
        } else if uplink_pci.contains(&pci) {
            Some(format!("shares PCI function {pci} with the node's default-route interface"))
        } else if link.master.is_some() {
            Some("is enslaved to another device (a bridge or bond port)".to_string())
        } else {
            allowed(view.policy, mode, &link.name, &pci).err()
        };
        if let Some(why) = refused {
            skipped.push(Skipped { ifname: link.name.clone(), why });
            continue;
        }
        let topology = view.sysfs.topology(&dev, Some(&rdma));
        nics.push(Nic {
            device: device_name(&link.name),
            ifname: link.name.clone(),
            mode,
            pci_address: pci,
            pcie_root: topology.pcie_root,
            numa_node: topology.numa_node,
            function: topology.function,
            rdma_device: rdma,
            uverbs: topology.uverbs,
            mac: link.mac_string(),
            mtu: link.mtu,
            speed_mbps: view.sysfs.link_speed_mbps(&link.name),
        });
    }
    nics.sort_by(|a, b| a.device.cmp(&b.device));
    // Two netdevs whose names map to one device name: neither is offered (which one a claim
    // meant could not be told).
    let mut i = 0;
    while i + 1 < nics.len() {
        if nics[i].device == nics[i + 1].device {
            let dup = nics[i].device.clone();
            for n in nics.iter().filter(|n| n.device == dup) {
                skipped
                    .push(Skipped { ifname: n.ifname.clone(), why: format!("its device name {dup} is another's too") });
            }
            nics.retain(|n| n.device != dup);
        } else {
            i += 1;
        }
    }
    (nics, skipped)
}

/// Scan this thread's network namespace (its links and default routes over netlink, `sysfs` for
/// the hardware) under the node policy `policy`. Call within a tokio runtime.
pub async fn scan(sysfs: &Sysfs, policy: &Policy, shared: &[String]) -> crate::error::Result<(Vec<Nic>, Vec<Skipped>)> {
    use crate::DraError::Scan;
    let socket = plexus_net::LinkSocket::current().map_err(|e| Scan(e.to_string()))?;
    let links = socket.links().await.map_err(|e| Scan(e.to_string()))?;
    let default_route: Vec<u32> = socket
        .all_routes()
        .await
        .map_err(|e| Scan(e.to_string()))?
        .into_iter()
        .filter(|r| r.dst.prefix() == 0 && r.table == plexus_net::link::MAIN_TABLE)
        .filter_map(|r| r.oif)
        .collect();
    Ok(discover(&NodeView { links: &links, default_route: &default_route, sysfs, policy, shared }))
}

/// The node's RDMA netns mode (`shared`, `exclusive`), when the kernel has RDMA netlink.
pub fn rdma_netns_mode() -> Option<String> {
    let mode = plexus_net::rdma::RdmaSocket::open().ok()?.netns_mode().ok()?;
    Some(
        match mode {
            plexus_net::rdma::NetnsMode::Exclusive => "exclusive",
            plexus_net::rdma::NetnsMode::Shared => "shared",
        }
        .to_string(),
    )
}

/// The node policy's node-wide word on offering `ifname` (PCI function `pci`) in `mode`.
fn allowed(policy: &Policy, mode: Mode, ifname: &str, pci: &str) -> Result<(), String> {
    let checks: &[(Allowed, &str, &str)] = match mode {
        Mode::Exclusive => &[(Allowed::Device, "device", ifname), (Allowed::PciAddress, "pciBusID", pci)],
        Mode::Shared => &[(Allowed::Parent, "master", ifname)],
    };
    checks
        .iter()
        .try_for_each(|(what, key, value)| policy.check_allowed(*what, key, value, None))
        .map_err(|e| format!("not allowed by the node policy: {}", e.msg))
}

/// A netdev name as a DRA device name (a DNS label: at most 63 lower-case letters, digits and
/// `-`, starting and ending with a letter or digit): lower-cased, any other character `-`. A name
/// that had to change gets a short digest of the original, so `eth_0` and `eth.0` stay apart.
pub fn device_name(ifname: &str) -> String {
    let mapped: String =
        ifname.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    let trimmed = mapped.trim_matches('-');
    if trimmed == ifname && !trimmed.is_empty() {
        return trimmed.to_string();
    }
    let digest: u32 = ifname.bytes().fold(2166136261u32, |h, b| (h ^ u32::from(b)).wrapping_mul(16777619));
    let base = if trimmed.is_empty() { "nic" } else { trimmed };
    format!("{base}-{:08x}", digest)
}

/// A port for the other modules' tests: `name` ends in its number `n` (`rail1`): a PF on
/// `pci0000:3a`, NUMA node 0, RDMA device `mlx5_<n>` with `uverbs<n>`, MTU 9000.
#[cfg(test)]
pub(crate) fn sample(name: &str, mode: Mode) -> Nic {
    let n: String = name.chars().filter(char::is_ascii_digit).collect();
    Nic {
        device: name.into(),
        ifname: name.into(),
        mode,
        pci_address: "0000:3b:00.0".into(),
        pcie_root: Some("pci0000:3a".into()),
        numa_node: Some(0),
        function: "pf",
        rdma_device: format!("mlx5_{n}"),
        uverbs: vec![format!("uverbs{n}")],
        mac: Some("02:00:00:00:00:01".into()),
        mtu: 9000,
        speed_mbps: Some(400_000),
    }
}

#[cfg(test)]
mod tests;
