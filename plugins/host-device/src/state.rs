//! The device's host state, recorded before it moves (a 0600 state file keyed by container ID and
//! ifname, and a marker alias on the link itself) and put back when it returns: name, MTU, MAC,
//! admin state, alias, addresses, and its RDMA device.

use std::path::{Path, PathBuf};

use ipnetwork::IpNetwork;
use plexus_cni::{Error, files};
use plexus_net::{Link, LinkChange, LinkSocket, Netns};
use serde::{Deserialize, Serialize};

/// The alias a moved device carries: `plexus-host-device:<host name>`, so DEL can find and name it
/// even without the state file (and after the pod renamed it, or the kernel returned it to the
/// initial namespace under its pod name).
pub const ALIAS_PREFIX: &str = "plexus-host-device:";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostState {
    pub name: String,
    pub mtu: u32,
    pub mac: Option<String>,
    pub up: bool,
    pub alias: Option<String>,
    pub addresses: Vec<IpNetwork>,
    pub pci: Option<String>,
    /// The RDMA device that moved with it.
    pub rdma_moved: Option<String>,
    /// The pod namespace it went to (GC finds it there).
    pub netns: Option<PathBuf>,
}

impl HostState {
    pub async fn capture(sock: &LinkSocket, link: &Link, pci: Option<String>) -> Result<HostState, Error> {
        let addresses = sock
            .addresses(link.index)
            .await?
            .into_iter()
            .map(|(a, _)| a)
            // The kernel makes link-local IPv6 addresses itself.
            .filter(|a| !matches!(a, IpNetwork::V6(v6) if v6.ip().segments()[0] & 0xffc0 == 0xfe80))
            .collect();
        Ok(HostState {
            name: link.name.clone(),
            mtu: link.mtu,
            mac: link.mac_string(),
            up: link.up,
            alias: link.alias.clone().filter(|a| !a.is_empty() && !a.starts_with(ALIAS_PREFIX)),
            addresses,
            pci,
            rdma_moved: None,
            netns: None,
        })
    }

    pub fn marker(&self) -> String {
        format!("{ALIAS_PREFIX}{}", self.name)
    }
}

pub fn path(data_dir: &Path, container_id: &str, ifname: &str) -> PathBuf {
    data_dir.join(format!("{container_id}={ifname}"))
}

pub fn save(path: &Path, state: &HostState) -> Result<(), Error> {
    files::replace_private(path, &serde_json::to_vec_pretty(state).expect("json"))
        .map_err(|e| e.context("write host state"))
}

pub fn load(path: &Path) -> Option<HostState> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// The moved device in the namespace of `sock`: a link carrying the marker alias (any plexus
/// marker when the state file is gone) — by its given name first, else by scanning (the pod may
/// have renamed it). In the pod namespace, a link named `ifname` without any marker is accepted
/// too (`trust_name`): it is the attachment the runtime asks about.
pub async fn find(
    sock: &LinkSocket,
    ifname: &str,
    marker: Option<&str>,
    trust_name: bool,
) -> Result<Option<Link>, Error> {
    let ours = |l: &Link| match (marker, l.alias.as_deref()) {
        (Some(m), Some(a)) => a == m,
        (None, Some(a)) => a.starts_with(ALIAS_PREFIX),
        _ => false,
    };
    if let Some(l) = sock.link(ifname).await?
        && (trust_name || ours(&l))
    {
        return Ok(Some(l));
    }
    Ok(sock.links().await?.into_iter().find(|l| ours(l)))
}

/// Move the device back from the pod into the node namespace under its host name, then restore
/// MTU, MAC, alias, addresses and admin state there. With `state` missing, the name comes from
/// the marker alias and the rest stays as it is (all that is known).
pub async fn return_to_host(
    pod_sock: Option<&LinkSocket>,
    node_sock: &LinkSocket,
    node: &Netns,
    link: &Link,
    state: Option<&HostState>,
) -> Result<(), Error> {
    let host_name = state
        .map(|s| s.name.clone())
        .or_else(|| link.alias.as_deref().and_then(|a| a.strip_prefix(ALIAS_PREFIX)).map(String::from))
        .unwrap_or_else(|| link.name.clone());
    let index = match pod_sock {
        Some(pod) => {
            // The kernel takes the device down for the move itself.
            let back = LinkChange { netns: Some(node), name: Some(&host_name), ..Default::default() };
            pod.set_link(link.index, &back)
                .await
                .map_err(|e| Error::from(e).context(format!("move {host_name} back to the node")))?;
            node_sock
                .link(&host_name)
                .await?
                .ok_or_else(|| Error::kernel(format!("{host_name} is not in the node namespace after the move")))?
                .index
        }
        None => {
            // Already in the node namespace (the kernel returned it, or it never left).
            if link.name != host_name {
                let down = LinkChange { up: Some(false), ..Default::default() };
                node_sock.set_link(link.index, &down).await?;
                let rename = LinkChange { name: Some(&host_name), ..Default::default() };
                node_sock
                    .set_link(link.index, &rename)
                    .await
                    .map_err(|e| Error::from(e).context(format!("rename to {host_name}")))?;
            }
            link.index
        }
    };
    let Some(s) = state else {
        let clear = LinkChange { alias: Some(""), ..Default::default() };
        node_sock.set_link(index, &clear).await?;
        return Ok(());
    };
    let mac = s.mac.as_deref().and_then(plexus_net::link::parse_mac);
    let restore =
        LinkChange { mtu: Some(s.mtu), mac, alias: Some(s.alias.as_deref().unwrap_or("")), ..Default::default() };
    node_sock.set_link(index, &restore).await.map_err(|e| Error::from(e).context(format!("restore {}", s.name)))?;
    let present: Vec<IpNetwork> = node_sock.addresses(index).await?.into_iter().map(|(a, _)| a).collect();
    for a in &s.addresses {
        if !present.contains(a) {
            node_sock
                .add_address(index, *a, true)
                .await
                .map_err(|e| Error::from(e).context(format!("restore address {a}")))?;
        }
    }
    if s.up {
        node_sock.set_link(index, &LinkChange { up: Some(true), ..Default::default() }).await?;
    }
    tracing::debug!(device = %s.name, "host state restored");
    Ok(())
}
