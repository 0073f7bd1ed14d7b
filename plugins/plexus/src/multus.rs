//! Sandboxes Multus attached. A node switched from Multus (v4, thin or thick) to plexus still runs
//! pods Multus attached; their DEL, and the runtime's GC, now come to plexus. Multus keeps, per
//! container, the delegates it ran — `<its cniDir>/<containerID>`, a JSON list (its
//! `DelegateNetConf`s: the conf as it ran it in `Bytes`, the selection's interface name, MAC, IPs,
//! gateways, the device ID) — and libcni keeps each delegate's result in
//! `<cniDir>/results/<network>-<containerID>-<ifname>`. plexus reads that list as Multus's own DEL
//! does: the first delegate is the cluster network on the runtime's interface, the others on the
//! name the selection asked for or `net<index>`, each with the capability arguments Multus gave it
//! and its cached result as prevResult. It runs their DELs by its own rules (the node policy's
//! plugins, in reverse, past errors) and, once they succeeded, removes Multus's files of that
//! container, as Multus does. What plexus finds there is never a plexus cache: plexus writes its
//! own format only, so a node switched back to Multus has Multus rebuild from the pod and its NADs
//! (docs/migrating.md).
//!
//! The other way: with `writeMultusCache`, plexus also writes, for each pod it attaches, the cache
//! Multus would have written ([`write`]): a node switched back to Multus then deletes plexus's
//! pods from it as Multus deletes its own — also once a pod is gone from the API, where Multus
//! has nothing else to go by, and without rebuilding a conflist from its typed copy (Multus v4's
//! rebuild drops the plugins' own keys: the reference bridge's DEL then fails with "no IP ranges
//! specified"). Multus runs what plexus ran, so plexus's plugins stay installed until the last
//! of those pods is gone. plexus removes that file with its own cache.
//!
//! The directory is the admin's (`multusCacheDir`, Multus's default `/var/lib/cni/multus`); the
//! container ID, validated by the entry point, is the only name taken from a request.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use base64::Engine;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::attachment::Attachment;

/// A cache or cached result larger than this is not Multus's (a pod's delegates are a few KiB).
const MAX_BYTES: u64 = 4 << 20;

/// One delegate as Multus v4 caches it (its `types.DelegateNetConf`). The conf it ran: a list's
/// from `CNINetworkConfigList.Bytes` when there (Multus v4.2's top-level `Bytes` of a list are
/// re-marshalled from its typed copy, which drops the plugins' own keys), else `Bytes`. The typed
/// `Conf`/`ConfList` copies are not read.
#[derive(Deserialize)]
struct Delegate {
    #[serde(rename = "CNINetworkConfigList", default)]
    list: Option<ConfigList>,
    #[serde(rename = "Name", default)]
    name: String,
    #[serde(rename = "ifnameRequest", default)]
    ifname_request: String,
    #[serde(rename = "macRequest", default)]
    mac_request: String,
    #[serde(rename = "ipRequest", default)]
    ip_request: Option<Vec<String>>,
    #[serde(rename = "default-route", default)]
    default_route: Option<Vec<IpAddr>>,
    #[serde(rename = "deviceID", default)]
    device_id: String,
    #[serde(rename = "resourceName", default)]
    resource_name: String,
    #[serde(rename = "Bytes", default)]
    bytes: Option<String>,
}

/// libcni's `NetworkConfigList` as Go encodes it: the list's own bytes.
#[derive(Deserialize)]
struct ConfigList {
    #[serde(rename = "Bytes", default)]
    bytes: Option<String>,
}

/// A container's sandbox as Multus left it: the attachments to DEL and the files to remove after.
#[derive(Debug)]
pub struct Sandbox {
    pub container_id: String,
    pub attachments: Vec<Attachment>,
    files: Vec<PathBuf>,
}

impl Sandbox {
    /// Multus's cache of `container_id` in `dir`: `Ok(None)` when there is none, `Err` (why) when
    /// there is one that is not Multus's list of delegates. `ifname` is the runtime's interface
    /// (the cluster network's).
    pub fn load(dir: &Path, container_id: &str, ifname: &str) -> Result<Option<Sandbox>, String> {
        let path = dir.join(container_id);
        let Some(bytes) = read_bounded(&path)? else { return Ok(None) };
        let delegates: Vec<Delegate> = serde_json::from_slice(&bytes)
            .map_err(|e| format!("{}: not a Multus delegate cache: {e}", path.display()))?;
        if delegates.is_empty() {
            return Err(format!("{}: a Multus delegate cache with no delegate", path.display()));
        }
        let mut sandbox = Sandbox { container_id: container_id.into(), attachments: Vec::new(), files: vec![path] };
        for (i, d) in delegates.into_iter().enumerate() {
            let conf = d.conf().map_err(|why| format!("{}: delegate {i}: {why}", sandbox.files[0].display()))?;
            let ifname = match (d.ifname_request.as_str(), i) {
                ("", 0) => ifname.to_string(),
                ("", _) => format!("net{i}"),
                (requested, _) => requested.to_string(),
            };
            let network = conf.get("name").and_then(Value::as_str).unwrap_or(&d.name).to_string();
            // libcni's result of it, named after the network and interface — names a NAD and an
            // annotation chose: only valid ones become a path (read, then removed).
            let valid = plexus_cni::env::validate_network_name(&network).is_ok()
                && plexus_cni::env::validate_ifname(&ifname).is_ok();
            let cached = valid.then(|| dir.join("results").join(format!("{network}-{container_id}-{ifname}")));
            let result = cached
                .as_deref()
                .and_then(|c| read_bounded(c).ok().flatten())
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .and_then(|v| v.get("result").cloned());
            sandbox.files.extend(cached);
            let attachment = Attachment {
                network,
                ifname,
                cluster_network: i == 0,
                conf,
                capability_args: d.capability_args(),
                result,
                device_info_file: None,
                resource_name: Some(d.resource_name.clone()).filter(|r| !r.is_empty()),
                device_id: Some(d.device_id.clone()).filter(|r| !r.is_empty()),
                cni_args: Vec::new(),
                default_route: d.default_route.clone(),
                claim: None,
            };
            sandbox.attachments.push(attachment);
        }
        Ok(Some(sandbox))
    }

    /// Every Multus cache in `dir` (GC): those read, and the names of files that are not Multus
    /// caches (logged). The interface of each cluster network is not recorded by Multus: `eth0`,
    /// what the kubelet asks for.
    pub fn all(dir: &Path) -> (Vec<Sandbox>, Vec<String>) {
        let (mut read, mut unread) = (Vec::new(), Vec::new());
        let Ok(entries) = std::fs::read_dir(dir) else { return (read, unread) };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || plexus_cni::env::validate_container_id(&name).is_err() {
                continue;
            }
            if !e.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            match Sandbox::load(dir, &name, "eth0") {
                Ok(Some(s)) => read.push(s),
                Ok(None) => {}
                Err(why) => {
                    tracing::debug!("not a Multus cache: {why}");
                    unread.push(name);
                }
            }
        }
        (read, unread)
    }

    /// The cache file alone (one plexus wrote: it has no results).
    pub fn remove_cache(&self) {
        if let Err(e) = plexus_node::files::remove_if_present(&self.files[0]) {
            tracing::warn!("{e}");
        }
    }

    /// After the DELs succeeded: Multus's cache of this container and its cached results.
    pub fn remove(&self) {
        for f in &self.files {
            if let Err(e) = plexus_node::files::remove_if_present(f) {
                tracing::warn!("{e}");
            }
        }
    }
}

impl Delegate {
    /// The conf Multus ran (a single plugin's or a list), base64 as Go encodes a byte slice.
    fn conf(&self) -> Result<Value, String> {
        let list = self.list.as_ref().and_then(|l| l.bytes.as_deref()).filter(|b| !b.is_empty());
        let b64 = list
            .or(self.bytes.as_deref().filter(|b| !b.is_empty()))
            .ok_or("no \"Bytes\": the conf it ran is not known")?;
        let raw = base64::engine::general_purpose::STANDARD.decode(b64).map_err(|e| format!("\"Bytes\": {e}"))?;
        let conf: Value = serde_json::from_slice(&raw).map_err(|e| format!("\"Bytes\" is not a conf: {e}"))?;
        if !conf.is_object() {
            return Err("\"Bytes\" is not a conf object".into());
        }
        Ok(conf)
    }

    /// The capability arguments Multus's runtime config gave this delegate on ADD (its
    /// `CreateCNIRuntimeConf`: `mac`, `ips`, `deviceID`).
    fn capability_args(&self) -> Map<String, Value> {
        let mut args = Map::new();
        if !self.mac_request.is_empty() {
            args.insert("mac".into(), json!(self.mac_request));
        }
        if let Some(ips) = self.ip_request.as_ref().filter(|ips| !ips.is_empty()) {
            args.insert("ips".into(), json!(ips));
        }
        if !self.device_id.is_empty() {
            args.insert("deviceID".into(), json!(self.device_id));
        }
        args
    }
}

/// The cache Multus v4 would have written for `attachments` of `container_id` (its
/// `DelegateNetConf` list, the cluster network first): each conf as plexus runs it in `Bytes`,
/// its typed copy where Multus's DEL looks for a list's plugins, and the interface name, MAC,
/// IPs, device ID and gateways it was attached with. Written atomically, 0600 in a 0700
/// directory; its path is returned.
pub fn write(dir: &Path, container_id: &str, attachments: &[Attachment]) -> Result<PathBuf, plexus_cni::Error> {
    let delegates: Vec<Value> = attachments
        .iter()
        .map(|a| {
            let conf = &a.conf;
            let is_list = conf.get("plugins").is_some_and(Value::is_array);
            let mut d = json!({
                "Conf": if is_list { json!({}) } else { conf.clone() },
                "ConfList": if is_list { conf.clone() } else { json!({"plugins": null}) },
                "Name": conf.get("name").cloned().unwrap_or_else(|| json!(a.network)),
                "ifnameRequest": a.ifname,
                "IsFilterV4Gateway": false,
                "IsFilterV6Gateway": false,
                "Bytes": base64::engine::general_purpose::STANDARD.encode(conf.to_string()),
            });
            let o = d.as_object_mut().expect("object");
            if let Some(mac) = a.capability_args.get("mac") {
                o.insert("macRequest".into(), mac.clone());
            }
            if let Some(ips) = a.capability_args.get("ips") {
                o.insert("ipRequest".into(), ips.clone());
            }
            if let Some(id) = &a.device_id {
                o.insert("deviceID".into(), json!(id));
            }
            if let Some(r) = &a.resource_name {
                o.insert("resourceName".into(), json!(r));
            }
            if let Some(gw) = &a.default_route {
                o.insert("default-route".into(), json!(gw));
            }
            d
        })
        .collect();
    plexus_node::files::ensure_private_dir(dir)?;
    let path = dir.join(container_id);
    let bytes = serde_json::to_vec(&delegates).expect("json");
    plexus_node::files::replace_private(&path, &bytes).map_err(|e| e.context("write Multus's cache"))?;
    Ok(path)
}

/// The file's bytes, `None` when there is none: not through a symlink, at most [`MAX_BYTES`].
fn read_bounded(path: &Path) -> Result<Option<Vec<u8>>, String> {
    plexus_node::files::read_regular(path, MAX_BYTES).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests;
