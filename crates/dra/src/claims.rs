//! Prepared claims: what `NodePrepareResources` worked out from a ResourceClaim, kept on the node
//! for the meta-plugin's ADD of the pods that use it.
//!
//! A claim's devices are the allocation's results of this driver in this node's pool; each
//! device's config is the opaque parameters of this driver that apply to its request (the
//! allocation lists the DeviceClass's first, then the claim's: later keys win). The config is
//! tenant input — a claim is written in its namespace — and chooses only what a NAD may: the
//! interface name in the pod, MTU, `multiRail`, IPAM (any plexus-ipam store the node policy
//! allows), the macvlan mode of a shared port, or a NAD of the claim's namespace to take the rest
//! from. The attaching plugins check it against the node policy as for any NAD.
//!
//! Kept in a root-only directory, one file per claim UID (0600, replaced atomically), removed at
//! unprepare: `{"version": 1, "namespace", "name", "uid", "pods": [pod UIDs], "devices": [...]}`.

use std::path::{Path, PathBuf};

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::DRIVER;
use crate::error::{DraError, Result};
use crate::nics::{Mode, Nic};

/// The version of the prepared-claim file this build writes and reads.
pub const PREPARED_VERSION: u32 = 1;
/// The most prepared claims a directory listing reads (a node has far fewer).
const MAX_CLAIMS: usize = 4096;
/// The largest prepared-claim file read.
const MAX_BYTES: u64 = 256 * 1024;

/// The opaque parameters of this driver, as a claim (or its DeviceClass) gives them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimConfig {
    /// The interface's name in the pod (default: the port's name on the node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multi_rail: Option<bool>,
    /// A plexus-ipam (or any IPAM plugin's) config, as in a NAD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipam: Option<Value>,
    /// The macvlan mode on a shared port (the node policy's `allow.macvlanModes` holds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub macvlan_mode: Option<String>,
    /// A NetworkAttachmentDefinition of the claim's namespace whose config is used, its device
    /// (`device`/`master`) replaced by the allocated port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
}

/// One allocated device of a prepared claim.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    pub request: String,
    pub pool: String,
    pub device: String,
    /// The port on the node.
    pub ifname: String,
    pub mode: Mode,
    pub pci_address: String,
    pub rdma_device: String,
    /// KEP-5075: which share of a shared port this is (its status entry names it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    pub config: ClaimConfig,
    pub cdi_device_ids: Vec<String>,
}

/// A prepared claim.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Prepared {
    pub version: u32,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The pods the claim is reserved for (their UIDs).
    pub pods: Vec<String>,
    pub devices: Vec<PreparedDevice>,
}

impl PreparedDevice {
    /// The interface name in the pod.
    pub fn ifname_in_pod(&self) -> &str {
        self.config.interface.as_deref().unwrap_or(&self.ifname)
    }
}

/// Why a claim cannot be prepared here (the kubelet shows it in the pod's events).
fn refuse(claim: &ResourceClaim, why: impl std::fmt::Display) -> DraError {
    DraError::Claim {
        namespace: claim.metadata.namespace.clone().unwrap_or_default(),
        name: claim.metadata.name.clone().unwrap_or_default(),
        why: why.to_string(),
    }
}

/// Whether a config for `requests` applies to the result of request `request` (a subrequest
/// `parent/sub` is also named by its parent).
fn applies(requests: &Option<Vec<String>>, request: &str) -> bool {
    let parent = request.split('/').next().unwrap_or(request);
    requests.as_ref().is_none_or(|r| r.is_empty() || r.iter().any(|x| x == request || x == parent))
}

/// The config of request `request`: this driver's opaque parameters that apply, merged in the
/// order the allocation lists them (the class's, then the claim's).
fn config_for(claim: &ResourceClaim, request: &str) -> Result<ClaimConfig> {
    let configs = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.config.as_ref());
    let mut merged = Map::new();
    for c in configs.into_iter().flatten() {
        let Some(opaque) = c.opaque.as_ref().filter(|o| o.driver == DRIVER) else { continue };
        if !applies(&c.requests, request) {
            continue;
        }
        match &opaque.parameters.0 {
            Value::Object(o) => merged.extend(o.clone()),
            Value::Null => {}
            other => {
                return Err(refuse(
                    claim,
                    format!("the parameters of {DRIVER} ({} config) are not an object: {other}", c.source),
                ));
            }
        }
    }
    serde_json::from_value(Value::Object(merged)).map_err(|e| refuse(claim, format!("the parameters of {DRIVER}: {e}")))
}

/// The smallest MTU a port is given (IPv4's minimum; the kernel refuses less).
const MTU_MIN: u32 = 68;
/// The largest MTU an exclusive port may be asked for (a netdev's MTU is 16 bits in practice).
const MTU_MAX: u32 = 65535;

/// Refuse at prepare what the attaching plugins would refuse at the pod's sandbox: an interface
/// name that is not one, an MTU the port cannot have (a shared port's macvlans at most the
/// port's own), a `network` that is not a NAD's name (it becomes part of an API path).
fn check_config(config: &ClaimConfig, nic: &Nic) -> std::result::Result<(), String> {
    if let Some(i) = &config.interface {
        plexus_cni::env::validate_ifname(i).map_err(|e| format!("interface {i:?}: {}", e.msg))?;
    }
    if let Some(mtu) = config.mtu {
        let max = match nic.mode {
            Mode::Shared => nic.mtu,
            Mode::Exclusive => MTU_MAX,
        };
        if !(MTU_MIN..=max).contains(&mtu) {
            return Err(format!("mtu {mtu}: port {} takes {MTU_MIN} to {max}", nic.ifname));
        }
    }
    if let Some(n) = &config.network {
        plexus_k8s::names::object("network-attachment-definition", n).map_err(|e| format!("network: {e}"))?;
    }
    Ok(())
}

/// Work out claim `claim` on node `node` offering `nics`: its devices and their configs. What this
/// driver was not allocated is not its concern; a device of this pool that the node does not offer
/// (any more) is an error.
pub fn prepare(claim: &ResourceClaim, node: &str, nics: &[Nic]) -> Result<Prepared> {
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    if !crate::cdi::valid_uid(&uid) {
        return Err(refuse(claim, format!("UID {uid:?} is not a UID")));
    }
    let status = claim.status.as_ref();
    let Some(results) =
        status.and_then(|s| s.allocation.as_ref()).and_then(|a| a.devices.as_ref()).and_then(|d| d.results.as_ref())
    else {
        return Err(refuse(claim, "not allocated"));
    };
    let pods = status
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or_default().is_empty())
        .map(|r| r.uid.clone())
        .collect();
    let mut devices = Vec::new();
    for r in results.iter().filter(|r| r.driver == DRIVER) {
        if r.pool != node {
            return Err(refuse(claim, format!("device {} is in pool {}, not this node's ({node})", r.device, r.pool)));
        }
        let Some(nic) = nics.iter().find(|n| n.device == r.device) else {
            return Err(refuse(claim, format!("device {} is not offered on node {node} (any more)", r.device)));
        };
        let config = config_for(claim, &r.request)?;
        check_config(&config, nic).map_err(|why| refuse(claim, format!("request {}: {why}", r.request)))?;
        devices.push(PreparedDevice {
            request: r.request.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
            ifname: nic.ifname.clone(),
            mode: nic.mode,
            pci_address: nic.pci_address.clone(),
            rdma_device: nic.rdma_device.clone(),
            share_id: r.share_id.clone(),
            config,
            cdi_device_ids: Vec::new(),
        });
    }
    let mut names: Vec<&str> = devices.iter().map(PreparedDevice::ifname_in_pod).collect();
    names.sort();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(refuse(
            claim,
            format!("two devices would be {} in the pod: give each request its own interface", w[0]),
        ));
    }
    Ok(Prepared {
        version: PREPARED_VERSION,
        namespace: claim.metadata.namespace.clone().unwrap_or_default(),
        name: claim.metadata.name.clone().unwrap_or_default(),
        uid,
        pods,
        devices,
    })
}

/// The prepared claims of a node: a root-only directory of one file per claim.
#[derive(Clone, Debug)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    pub fn new(dir: impl Into<PathBuf>) -> Store {
        Store { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, uid: &str) -> Option<PathBuf> {
        crate::cdi::valid_uid(uid).then(|| self.dir.join(format!("{uid}.json")))
    }

    /// Keep `p` (replacing an earlier file of the claim).
    pub fn save(&self, p: &Prepared) -> Result<()> {
        let path = self.path(&p.uid).ok_or_else(|| DraError::File(format!("claim UID {:?} is not a UID", p.uid)))?;
        let file = |e: plexus_cni::Error| DraError::File(e.to_string());
        plexus_node::files::ensure_private_dir(&self.dir).map_err(file)?;
        plexus_node::files::write_private_atomic(&path, &serde_json::to_vec(p).expect("json")).map_err(file)
    }

    /// Claim `uid`, when prepared.
    pub fn load(&self, uid: &str) -> Result<Option<Prepared>> {
        let Some(path) = self.path(uid) else { return Ok(None) };
        let file = |why: String| DraError::File(format!("{}: {why}", path.display()));
        let Some(bytes) =
            plexus_node::files::read_regular(&path, MAX_BYTES).map_err(|e| DraError::File(e.to_string()))?
        else {
            return Ok(None);
        };
        let value: Value = serde_json::from_slice(&bytes).map_err(|e| file(e.to_string()))?;
        let version = plexus_node::format::version_of(&value);
        if version > PREPARED_VERSION {
            return Err(DraError::LaterFormat { path: path.display().to_string(), version });
        }
        serde_json::from_value(value).map(Some).map_err(|e| file(e.to_string()))
    }

    /// Forget claim `uid`; not prepared is success.
    pub fn remove(&self, uid: &str) -> Result<()> {
        match self.path(uid) {
            Some(path) => plexus_node::files::remove_if_present(&path).map_err(|e| DraError::File(e.to_string())),
            None => Ok(()),
        }
    }

    /// The prepared claims reserved for pod `pod_uid`, sorted by claim name (one order for the
    /// pod's interfaces); what cannot be read is logged and left out.
    pub fn for_pod(&self, pod_uid: &str) -> Vec<Prepared> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut found: Vec<Prepared> = entries
            .flatten()
            .take(MAX_CLAIMS)
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".json").map(str::to_string))
            .filter_map(|uid| match self.load(&uid) {
                Ok(p) => p,
                Err(why) => {
                    tracing::warn!("prepared claim {uid}: {why}");
                    None
                }
            })
            .filter(|p| p.pods.iter().any(|u| u == pod_uid))
            .collect();
        found.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        found
    }
}

#[cfg(test)]
mod tests;
