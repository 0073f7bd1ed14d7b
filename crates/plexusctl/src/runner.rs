//! The cnitool-compatible runner: the same environment (`NETCONFPATH`, `CNI_PATH`, `CNI_ARGS`,
//! `CAP_ARGS`, `CNI_IFNAME`), the same container ID (`cnitool-` + the first 10 bytes of the
//! SHA-512 of the absolute netns path, in hex) and libcni's result cache
//! (`<cacheDir>/results/<network>-<containerID>-<ifname>`, kind `cniCacheV1`), so cnitool and
//! plexusctl add and delete each other's attachments.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use plexus_cni::{CniArgs, CniEnv, Command, ConfList};
use plexus_node::files;
use plexus_plugin::builtin::Runner;
use plexus_plugin::chain;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha512};

/// libcni's default cache directory.
pub const DEFAULT_CACHE_DIR: &str = "/var/lib/cni";

/// libcni's `cachedInfo`.
#[derive(Debug, Serialize, Deserialize)]
pub struct CachedInfo {
    pub kind: String,
    #[serde(rename = "containerId")]
    pub container_id: String,
    /// The conflist as it was loaded (base64 in JSON, a Go `[]byte`).
    #[serde(with = "bytes_b64")]
    pub config: Vec<u8>,
    #[serde(rename = "ifName")]
    pub if_name: String,
    #[serde(rename = "networkName")]
    pub network_name: String,
    #[serde(rename = "cniArgs", default, skip_serializing_if = "Vec::is_empty")]
    pub cni_args: Vec<[String; 2]>,
    #[serde(rename = "capabilityArgs", default, skip_serializing_if = "Map::is_empty")]
    pub capability_args: Map<String, Value>,
    #[serde(rename = "result", default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

mod bytes_b64 {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(b))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD.decode(s).map_err(serde::de::Error::custom)
    }
}

/// One invocation as cnitool would make it.
pub struct Invocation {
    pub list: ConfList,
    pub raw: Vec<u8>,
    pub env: CniEnv,
    pub caps: Map<String, Value>,
    pub cache_dir: PathBuf,
}

/// cnitool's container ID for `netns` (an absolute path).
pub fn container_id(netns: &Path) -> String {
    let digest = Sha512::digest(netns.as_os_str().as_encoded_bytes());
    let hex: String = digest[..10].iter().map(|b| format!("{b:02x}")).collect();
    format!("cnitool-{hex}")
}

/// libcni `LoadConfList`: the `.conflist` named `name` in `dir`, else a single `.conf`/`.json`
/// of that name as a list of one.
pub fn load_conf_list(dir: &Path, name: &str) -> Result<(ConfList, Vec<u8>)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("NETCONFPATH {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    let ext = |p: &PathBuf| p.extension().and_then(|e| e.to_str()).unwrap_or_default().to_string();
    for f in files.iter().filter(|p| ext(p) == "conflist") {
        let raw = std::fs::read(f)?;
        if let Ok(list) = ConfList::parse(&raw)
            && list.name == name
        {
            return Ok((list, raw));
        }
    }
    for f in files.iter().filter(|p| matches!(ext(p).as_str(), "conf" | "json")) {
        let raw = std::fs::read(f)?;
        if let Ok(list) = ConfList::from_single(&raw)
            && list.name == name
        {
            let raw = serde_json::to_vec(&list)?;
            return Ok((list, raw));
        }
    }
    bail!("no net configuration with name {name:?} in {}", dir.display())
}

/// Where network configs are read from: `NETCONFPATH`, as cnitool, else the CNI conf dir.
pub fn conf_dir() -> PathBuf {
    std::env::var_os("NETCONFPATH").map(PathBuf::from).unwrap_or_else(|| plexus_node::paths::CNI_CONF_DIR.into())
}

impl Invocation {
    /// From the process environment, like cnitool.
    pub fn from_env(network: &str, netns: &Path, ifname_flag: Option<&str>) -> Result<Invocation> {
        let (list, raw) = load_conf_list(&conf_dir(), network)?;
        let netns = std::path::absolute(netns)?;
        let args = CniArgs::parse(&std::env::var("CNI_ARGS").unwrap_or_default())
            .map_err(|e| anyhow!("CNI_ARGS: {}", e.msg))?;
        let caps: Map<String, Value> = match std::env::var("CAP_ARGS") {
            Ok(s) if !s.is_empty() => serde_json::from_str(&s).context("CAP_ARGS is not a JSON object")?,
            _ => Map::new(),
        };
        let ifname =
            ifname_flag.map(String::from).or_else(|| std::env::var("CNI_IFNAME").ok()).unwrap_or_else(|| "eth0".into());
        let path = std::env::var_os("CNI_PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
        Ok(Invocation {
            list,
            raw,
            env: CniEnv {
                command: Command::Add,
                container_id: container_id(&netns),
                netns: Some(netns),
                ifname,
                args,
                path,
                netns_override: false,
                // A trace context in plexusctl's environment reaches the plugins, as cnitool's
                // whole environment does.
                vars: plexus_plugin::trace::carried(|k| std::env::var(k).ok()),
                // The node policy's request limit, as a runtime's request gets it.
                deadline: plexus_cni::Deadline::from_env(
                    |k| std::env::var(k).ok(),
                    plexus_node::Policy::load(|k| std::env::var(k).ok())
                        .map(|p| p.limits)
                        .unwrap_or_default()
                        .request_timeout(),
                ),
            },
            caps,
            cache_dir: std::env::var_os("CNI_CACHE_DIR").map(PathBuf::from).unwrap_or_else(|| DEFAULT_CACHE_DIR.into()),
        })
    }

    pub fn cache_path(&self) -> PathBuf {
        self.cache_dir.join("results").join(format!("{}-{}-{}", self.list.name, self.env.container_id, self.env.ifname))
    }

    fn cached(&self) -> Option<CachedInfo> {
        serde_json::from_slice(&std::fs::read(self.cache_path()).ok()?).ok()
    }

    pub fn add(&self) -> Result<Value> {
        let (_, printed) = chain::add(&Runner::runtime(), &self.list, &self.caps, &self.env).map_err(cni)?;
        let info = CachedInfo {
            kind: "cniCacheV1".into(),
            container_id: self.env.container_id.clone(),
            config: self.raw.clone(),
            if_name: self.env.ifname.clone(),
            network_name: self.list.name.clone(),
            cni_args: self.env.args.pairs().iter().map(|(k, v)| [k.clone(), v.clone()]).collect(),
            capability_args: self.caps.clone(),
            result: Some(printed.clone()),
        };
        files::write_private_atomic(&self.cache_path(), &serde_json::to_vec(&info)?).map_err(cni)?;
        Ok(printed)
    }

    pub fn check(&self) -> Result<()> {
        chain::check(
            &Runner::runtime(),
            &self.list,
            &self.caps,
            &self.env,
            self.cached().and_then(|c| c.result).as_ref(),
        )
        .map_err(cni)
    }

    pub fn del(&self) -> Result<()> {
        let cached = self.cached().and_then(|c| c.result);
        chain::del(&Runner::runtime(), &self.list, &self.caps, &self.env, cached.as_ref()).map_err(cni)?;
        files::remove_if_present(&self.cache_path()).map_err(cni)
    }

    pub fn status(&self) -> Result<()> {
        chain::status_or_gc(&Runner::runtime(), &self.list, &self.env, Command::Status, None).map_err(cni)
    }

    /// GC with every attachment libcni's cache still holds for this network as valid.
    pub fn gc(&self) -> Result<()> {
        let prefix = format!("{}-", self.list.name);
        let valid: Vec<Value> = std::fs::read_dir(self.cache_dir.join("results"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .filter_map(|e| serde_json::from_slice::<CachedInfo>(&std::fs::read(e.path()).ok()?).ok())
            .filter(|c| c.network_name == self.list.name)
            .map(|c| serde_json::json!({"containerID": c.container_id, "ifname": c.if_name}))
            .collect();
        chain::status_or_gc(&Runner::runtime(), &self.list, &self.env, Command::Gc, Some(&Value::Array(valid)))
            .map_err(cni)
    }
}

fn cni(e: plexus_cni::Error) -> anyhow::Error {
    anyhow!("{} (CNI code {})", e, e.code)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The interop tests (tests/tests/plexusctl.rs) prove the IDs equal cnitool's own; this pins
    /// the shape: `cnitool-` and 20 hex digits, one per netns path.
    #[test]
    fn container_ids_have_cnitools_shape() {
        let id = container_id(Path::new("/var/run/netns/testing"));
        assert!(id.starts_with("cnitool-") && id.len() == 28, "{id}");
        assert!(id[8..].chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(id, container_id(Path::new("/var/run/netns/testing")));
        assert_ne!(id, container_id(Path::new("/var/run/netns/other")));
    }
}
