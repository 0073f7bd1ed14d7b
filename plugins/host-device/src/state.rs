//! The device's host state, recorded before it moves (a 0600 state file keyed by container ID and
//! ifname, and a marker on the link itself) and put back when it returns: name, MTU, MAC, admin
//! state, alias, addresses, and its RDMA device.

use std::path::{Path, PathBuf};

use ipnetwork::IpNetwork;
use plexus_cni::Error;
use plexus_net::{Dad, Kernel, Link, LinkChange, Netns};
use plexus_node::files;
use plexus_node::files::SafeDir;
use plexus_node::format::HOST_DEVICE_STATE;
use serde::{Deserialize, Serialize};

/// The marker a moved device carries, as an alternative name (it moves with the device):
/// `plexus-host-device:<host name>:<attachment tag>`, so DEL can find and name it even without
/// the state file (and after the pod renamed it, or the kernel returned it to the initial
/// namespace under its pod name) — and only the device of *that* attachment. Its alias is its
/// host name, as the reference host-device sets it: the reference plugin's DEL (a node switched
/// back to Multus) renames the device to its alias. Netdev names cannot contain `:`; alternative
/// names can. Devices moved by plexus before state format 2 carry the marker as their alias
/// instead, and are found by it too.
pub const MARKER_PREFIX: &str = "plexus-host-device:";

/// The attachment (container ID, ifname) a marker names.
pub use plexus_cni::env::attachment_tag;

/// The host name a marker records.
pub fn host_name_of(marker: &str) -> Option<&str> {
    let rest = marker.strip_prefix(MARKER_PREFIX)?;
    Some(rest.split_once(':').map_or(rest, |(name, _)| name)).filter(|n| !n.is_empty())
}

/// Which moved device an attachment owns: the exact marker its state file recorded, or (no state
/// file) any marker carrying its tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mark {
    Exact(String),
    Tag(String),
}

impl Mark {
    pub fn of(container_id: &str, ifname: &str, state: Option<&HostState>) -> Mark {
        match state {
            Some(s) => Mark::Exact(s.marker()),
            None => Mark::Tag(attachment_tag(container_id, ifname)),
        }
    }

    /// Whether `link` carries this marker: as an alternative name, or (moved before state format
    /// 2) as its alias.
    pub fn carried_by(&self, link: &Link) -> bool {
        markers(link).any(|m| self.matches(m))
    }

    fn matches(&self, marker: &str) -> bool {
        match self {
            Mark::Exact(m) => marker == m,
            Mark::Tag(t) => {
                marker.strip_prefix(MARKER_PREFIX).and_then(|r| r.split_once(':')).is_some_and(|(_, tag)| tag == t)
            }
        }
    }
}

/// The markers a link carries: its alternative names and its alias that are markers.
fn markers(link: &Link) -> impl Iterator<Item = &str> {
    link.alt_names.iter().map(String::as_str).chain(link.alias.as_deref()).filter(|m| m.starts_with(MARKER_PREFIX))
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostState {
    /// The version of its format (`plexus_node::format::HOST_DEVICE_STATE`; none in files
    /// written before formats carried one: 1).
    #[serde(default = "plexus_node::format::first")]
    pub version: u32,
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
    /// The marker alias it carries (absent in state files written before markers named their
    /// attachment: those devices carry `plexus-host-device:<name>`).
    #[serde(default)]
    pub marker: Option<String>,
}

impl HostState {
    pub async fn capture(sock: &impl Kernel, link: &Link, pci: Option<String>, tag: &str) -> Result<HostState, Error> {
        let addresses = sock
            .addresses(link.index)
            .await?
            .into_iter()
            .map(|a| a.net)
            // The kernel makes link-local IPv6 addresses itself.
            .filter(|a| !matches!(a, IpNetwork::V6(v6) if v6.ip().is_unicast_link_local()))
            .collect();
        Ok(HostState {
            version: HOST_DEVICE_STATE.current,
            name: link.name.clone(),
            mtu: link.mtu,
            mac: link.mac_string(),
            up: link.up,
            alias: link.alias.clone().filter(|a| !a.is_empty() && !a.starts_with(MARKER_PREFIX)),
            addresses,
            pci,
            rdma_moved: None,
            netns: None,
            marker: Some(format!("{MARKER_PREFIX}{}:{tag}", link.name)),
        })
    }

    pub fn marker(&self) -> String {
        self.marker.clone().unwrap_or_else(|| format!("{MARKER_PREFIX}{}", self.name))
    }
}

/// The state file of an attachment in the (policy-checked) data directory.
pub fn path(data_dir: &SafeDir, container_id: &str, ifname: &str) -> PathBuf {
    data_dir.join(plexus_cni::env::attachment_key(container_id, ifname))
}

pub fn save(path: &Path, state: &HostState) -> Result<(), Error> {
    files::replace_private(path, &serde_json::to_vec_pretty(state).expect("json"))
        .map_err(|e| e.context("write host state"))
}

/// The state at `path`: `None` when there is none or it does not parse (the device is then found
/// by its marker alone); code 105 when a later plexus wrote it (left as it is, never misread).
pub fn load(path: &Path) -> Result<Option<HostState>, Error> {
    let Ok(bytes) = std::fs::read(path) else { return Ok(None) };
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(&bytes) else { return Ok(None) };
    HOST_DEVICE_STATE.check_json(&path.display().to_string(), &value)?;
    Ok(serde_json::from_value(value).ok())
}

/// The moved device in the namespace of `sock`: only a link carrying this attachment's marker —
/// by its given name first, else by scanning (the pod may have renamed it). A link without the
/// marker is never taken, whatever its name: it is not a device this attachment moved.
pub async fn find(sock: &impl Kernel, ifname: &str, mark: &Mark) -> Result<Option<Link>, Error> {
    if let Some(l) = sock.link(ifname).await?
        && mark.carried_by(&l)
    {
        return Ok(Some(l));
    }
    Ok(sock.links().await?.into_iter().find(|l| mark.carried_by(l)))
}

/// The device an ADD moved into the pod (`sock`), also when the move went through but a later
/// attribute of the same request failed: by its marker (as [`find`]), else under its host name
/// with its host MAC — the kernel moves first and renames after, so a failed rename leaves it
/// there under the name it had on the node.
pub async fn find_moved(sock: &impl Kernel, ifname: &str, host: &HostState) -> Result<Option<Link>, Error> {
    if let Some(l) = find(sock, ifname, &Mark::Exact(host.marker())).await? {
        return Ok(Some(l));
    }
    Ok(sock.link(&host.name).await?.filter(|l| l.mac_string() == host.mac))
}

/// Move the device back from the pod into the node namespace under its host name, then restore
/// MTU, MAC, alias, addresses and admin state there. With `state` missing, the name comes from
/// the marker alias and the rest stays as it is (all that is known).
pub async fn return_to_host<K: Kernel>(
    pod_sock: Option<&K>,
    node_sock: &K,
    node: &Netns,
    link: &Link,
    state: Option<&HostState>,
) -> Result<(), Error> {
    let host_name = state
        .map(|s| s.name.clone())
        .or_else(|| markers(link).find_map(host_name_of).map(String::from))
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
        return remove_markers(node_sock, index, link).await;
    };
    // The markers go last: a DEL that fails half-way finds the device again by them.
    let mac = s.mac.as_deref().and_then(plexus_net::link::parse_mac);
    let restore = LinkChange { mtu: Some(s.mtu), mac, ..Default::default() };
    node_sock.set_link(index, &restore).await.map_err(|e| Error::from(e).context(format!("restore {}", s.name)))?;
    let present: Vec<IpNetwork> = node_sock.addresses(index).await?.into_iter().map(|a| a.net).collect();
    for a in &s.addresses {
        if !present.contains(a) {
            node_sock
                .add_address(index, *a, Dad::Skip)
                .await
                .map_err(|e| Error::from(e).context(format!("restore address {a}")))?;
        }
    }
    if s.up {
        node_sock.set_link(index, &LinkChange { up: Some(true), ..Default::default() }).await?;
    }
    let alias = LinkChange { alias: Some(s.alias.as_deref().unwrap_or("")), ..Default::default() };
    node_sock.set_link(index, &alias).await?;
    remove_markers(node_sock, index, link).await?;
    tracing::debug!(device = %s.name, "host state restored");
    Ok(())
}

/// The device of `host` still on the node (never moved) with its marker: the marker taken off.
pub async fn unmark(node_sock: &impl Kernel, host: &HostState) -> Result<(), Error> {
    let marker = host.marker();
    match node_sock.link(&host.name).await? {
        Some(l) if l.alt_names.contains(&marker) => Ok(node_sock.set_alt_name(l.index, &marker, false).await?),
        _ => Ok(()),
    }
}

/// The marker names `link` carried (as found before it moved back), taken off link `index`.
async fn remove_markers<K: Kernel>(node_sock: &K, index: u32, link: &Link) -> Result<(), Error> {
    for name in link.alt_names.iter().filter(|a| a.starts_with(MARKER_PREFIX)) {
        node_sock
            .set_alt_name(index, name, false)
            .await
            .map_err(|e| Error::from(e).context(format!("remove marker {name}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_names_its_attachment_and_no_other() {
        let tag = attachment_tag("c1", "net2");
        assert_eq!(tag.len(), 16);
        let alias = format!("{MARKER_PREFIX}hd0:{tag}");
        assert!(Mark::of("c1", "net2", None).matches(&alias));
        assert!(!Mark::of("c1", "net3", None).matches(&alias), "same container, other attachment");
        assert!(!Mark::of("c2", "net2", None).matches(&alias));
        assert!(!Mark::of("c1", "net2", None).matches("plexus-host-device:hd0"), "legacy needs its state");
        assert_eq!(host_name_of(&alias), Some("hd0"));
        assert_eq!(host_name_of("plexus-host-device:hd0"), Some("hd0"));
    }

    #[test]
    fn state_written_before_markers_named_attachments_still_finds_its_device() {
        let old: HostState = serde_json::from_str(
            r#"{"name":"hd0","mtu":1500,"mac":null,"up":false,"alias":null,"addresses":[],"pci":null,
                "rdma_moved":null,"netns":null}"#,
        )
        .unwrap();
        assert_eq!(old.marker(), "plexus-host-device:hd0");
        assert!(Mark::of("c1", "net2", Some(&old)).matches("plexus-host-device:hd0"));
    }

    /// The state files of every format version kept as fixtures (`tests/formats/`).
    const V1: &[u8] = include_bytes!("../tests/formats/host-device-state-v1.json");
    const V2: &[u8] = include_bytes!("../tests/formats/host-device-state-v2.json");
    /// A format this build does not know (what a later one might write).
    const V3: &[u8] = include_bytes!("../tests/formats/host-device-state-v3.json");

    #[test]
    fn a_state_file_of_every_version_this_build_knows_is_read_and_written_as_its_fixture() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c1=net1");
        for (version, fixture) in [(1, V1), (2, V2)] {
            std::fs::write(&path, fixture).unwrap();
            let host = load(&path).unwrap().unwrap();
            assert_eq!((host.version, host.name.as_str(), host.mtu), (version, "ens2f0np0", 9000));
            assert_eq!((host.rdma_moved.as_deref(), host.pci.as_deref()), (Some("mlx5_0"), Some("0000:3b:00.0")));
            assert_eq!(host.marker(), "plexus-host-device:ens2f0np0:0123456789abcdef");
            // A change to what the state holds shows here: keep the old fixture (it must still be
            // read) and add the new one, with a new version if an older build would misread it.
            save(&path, &host).unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), fixture);
        }
        assert_eq!(HOST_DEVICE_STATE.current, 2, "this build's version has its fixture");
    }

    #[test]
    fn a_state_file_of_a_later_format_is_refused_naming_the_file_never_taken_for_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c1=net1");
        std::fs::write(&path, V3).unwrap();
        let e = load(&path).unwrap_err();
        assert_eq!(e.code, plexus_cni::code::FORMAT_TOO_NEW);
        assert!(
            e.msg.starts_with(&format!("{}: plexus-host-device's state file of format version 3", path.display())),
            "{e}"
        );
        assert!(path.exists());
        // Without its version it would not parse as a state at all, and DEL would look for the
        // device by its marker alone.
        let unversioned = String::from_utf8(V3.to_vec()).unwrap().replace("\"version\": 3,", "");
        std::fs::write(&path, unversioned).unwrap();
        assert_eq!(load(&path).unwrap(), None);
    }
}
