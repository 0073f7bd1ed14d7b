//! NetworkAttachmentDefinitions: their CNI configuration (nad-client `GetCNIConfig` rules), and a
//! source of them — a directory of manifests for standalone use, or the Kubernetes API.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::K8sError;

/// The NAD annotation naming the device-plugin resource its attachments use.
pub const RESOURCE_NAME_ANNOTATION: &str = "k8s.v1.cni.cncf.io/resourceName";

/// A NetworkAttachmentDefinition, as much of it as plexus reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Nad {
    pub namespace: String,
    pub name: String,
    /// `k8s.v1.cni.cncf.io/resourceName`
    pub resource_name: Option<String>,
    /// `spec.config` (a JSON text), empty when the config lives in `confDir`.
    pub config: String,
}

impl Nad {
    /// From a NAD object (API JSON or a parsed manifest).
    pub fn from_object(obj: &Value) -> Result<Nad, K8sError> {
        let meta = obj
            .get("metadata")
            .ok_or_else(|| K8sError::Config("NetworkAttachmentDefinition without metadata".into()))?;
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
        let name = text(meta.get("name"))
            .ok_or_else(|| K8sError::Config("NetworkAttachmentDefinition without metadata.name".into()))?;
        Ok(Nad {
            namespace: text(meta.get("namespace")).unwrap_or_else(|| crate::DEFAULT_NAMESPACE.into()),
            name,
            resource_name: text(meta.get("annotations").and_then(|a| a.get(RESOURCE_NAME_ANNOTATION))),
            config: text(obj.get("spec").and_then(|s| s.get("config"))).unwrap_or_default(),
        })
    }

    /// The delegate configuration: `spec.config`, or the file in `conf_dir` whose `name` is the
    /// NAD's; a config without `name` gets the NAD's name. A conflist stays a conflist.
    pub fn cni_config(&self, conf_dir: &Path) -> Result<Value, K8sError> {
        let mut conf: Value = if self.config.trim().is_empty() {
            find_conf_by_name(conf_dir, &self.name)?.ok_or_else(|| {
                K8sError::Config(format!(
                    "network-attachment-definition {}/{} has no spec.config and no conf named {:?} is in {}",
                    self.namespace,
                    self.name,
                    self.name,
                    conf_dir.display()
                ))
            })?
        } else {
            serde_json::from_str(&self.config).map_err(|e| {
                K8sError::Config(format!(
                    "network-attachment-definition {}/{}: spec.config: {e}",
                    self.namespace, self.name
                ))
            })?
        };
        let obj = conf.as_object_mut().ok_or_else(|| {
            K8sError::Config(format!(
                "network-attachment-definition {}/{}: spec.config is not an object",
                self.namespace, self.name
            ))
        })?;
        if obj.get("name").and_then(Value::as_str).is_none_or(str::is_empty) {
            obj.insert("name".into(), self.name.clone().into());
        }
        Ok(conf)
    }
}

/// A CNI conf (`.conf`, `.json`, `.conflist`) in `dir` whose `name` is `name` (first by file name).
pub fn find_conf_by_name(dir: &Path, name: &str) -> Result<Option<Value>, K8sError> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(None) };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("conf" | "json" | "conflist")))
        .collect();
    files.sort();
    for f in files {
        let Ok(text) = std::fs::read(&f) else { continue };
        let Ok(v) = serde_json::from_slice::<Value>(&text) else { continue };
        if v.get("name").and_then(Value::as_str) == Some(name) {
            return Ok(Some(v));
        }
    }
    Ok(None)
}

/// Where NADs come from.
pub trait NadSource {
    fn nad(&self, namespace: &str, name: &str) -> Result<Nad, K8sError>;
}

/// NADs of `source` whose `spec.config` is at most `max` bytes (the node policy's
/// `limits.nadConfigBytes`): a larger one is a config error naming it, its size and the limit.
pub struct SizeCapped<'a> {
    pub source: &'a dyn NadSource,
    pub max: usize,
}

impl NadSource for SizeCapped<'_> {
    fn nad(&self, namespace: &str, name: &str) -> Result<Nad, K8sError> {
        let nad = self.source.nad(namespace, name)?;
        if nad.config.len() > self.max {
            return Err(K8sError::Config(format!(
                "network-attachment-definition {namespace}/{name}: spec.config is {} bytes, the node policy allows at \
                 most {} (limits.nadConfigBytes)",
                nad.config.len(),
                self.max
            )));
        }
        Ok(nad)
    }
}

/// NAD manifests in a directory (`nadDir`): YAML or JSON files, one or several documents each
/// (`---`), or a `List`. Read on every invocation: no daemon, no cache to go stale.
///
/// The files are tenants' (one per network, often), so one file never decides another network's
/// ADD: a NAD is looked for first in the files named after it (`<name>.yaml`, `.yml`, `.json`),
/// and only when it is not there in the others, in file-name order, until it is found. Each
/// file is parsed at most once, only when looked in, and read only when it is a regular file no
/// larger than the cap (its size checked before it is read). A file that cannot be read or
/// parsed is that file's network's error when the file is named after the network, and is
/// otherwise passed over (logged).
#[derive(Debug)]
pub struct DirSource {
    /// The manifest files, sorted; none is read until a NAD is looked for.
    files: Vec<PathBuf>,
    /// The largest manifest file read.
    max_bytes: u64,
    /// What each file looked in held, or why it could not be read.
    parsed: std::sync::Mutex<BTreeMap<PathBuf, Result<Vec<Nad>, String>>>,
}

impl DirSource {
    /// The manifests in `dir`, none of them read yet; a file larger than `max_bytes` is never read.
    pub fn load(dir: &Path, max_bytes: u64) -> Result<DirSource, K8sError> {
        let entries = std::fs::read_dir(dir).map_err(|e| K8sError::Io(format!("nadDir {}: {e}", dir.display())))?;
        let mut files: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json")))
            .collect();
        files.sort();
        Ok(DirSource { files, max_bytes, parsed: Default::default() })
    }

    /// The number of manifest files.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// The NADs of manifest `file` (parsed once), or why it has none to give.
    fn read(&self, file: &Path) -> Result<Vec<Nad>, String> {
        let mut parsed = self.parsed.lock().unwrap_or_else(|p| p.into_inner());
        parsed
            .entry(file.to_path_buf())
            .or_insert_with(|| {
                let bytes = plexus_node::files::read_regular(file, self.max_bytes)
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| format!("{}: gone", file.display()))?;
                let text = String::from_utf8(bytes).map_err(|e| format!("{}: {e}", file.display()))?;
                let json = file.extension().is_some_and(|e| e == "json");
                parse_manifest(&text, json).map_err(|e| format!("{}: {e}", file.display()))
            })
            .clone()
    }
}

/// Whether manifest `file` is named after NAD `name` (`<name>.yaml`, `.yml`, `.json`).
fn named_after(file: &Path, name: &str) -> bool {
    file.file_stem().and_then(|s| s.to_str()) == Some(name)
}

/// The NADs in one manifest's text: a JSON document, or YAML documents (`---`); a `List` is
/// opened; other kinds are skipped.
pub fn parse_manifest(text: &str, json: bool) -> Result<Vec<Nad>, String> {
    let docs: Vec<Value> = if json {
        vec![serde_json::from_str(text).map_err(|e| e.to_string())?]
    } else {
        serde_saphyr::from_multiple(text).map_err(|e| e.to_string())?
    };
    docs.iter()
        .flat_map(list_items)
        .filter(|doc| doc.get("kind").and_then(Value::as_str) == Some("NetworkAttachmentDefinition"))
        .map(|doc| Nad::from_object(doc).map_err(|e| e.to_string()))
        .collect()
}

fn list_items(doc: &Value) -> Vec<&Value> {
    match doc.get("items").and_then(Value::as_array) {
        Some(items) if doc.get("kind").and_then(Value::as_str).is_some_and(|k| k.ends_with("List")) => {
            items.iter().collect()
        }
        _ => vec![doc],
    }
}

impl NadSource for DirSource {
    fn nad(&self, namespace: &str, name: &str) -> Result<Nad, K8sError> {
        let (own, others): (Vec<&PathBuf>, Vec<&PathBuf>) = self.files.iter().partition(|f| named_after(f, name));
        for file in own.into_iter().chain(others) {
            match self.read(file) {
                Ok(nads) => {
                    if let Some(nad) = nads.into_iter().find(|n| n.namespace == namespace && n.name == name) {
                        return Ok(nad);
                    }
                }
                // The network's own file: its error is this network's.
                Err(why) if named_after(file, name) => {
                    return Err(K8sError::Config(format!(
                        "network-attachment-definition {namespace}/{name}: manifest {why}"
                    )));
                }
                Err(why) => tracing::warn!("nadDir: passed over {why}"),
            }
        }
        Err(K8sError::NadNotFound { namespace: namespace.into(), name: name.into() })
    }
}

/// Whether `conf` is a conflist (has `plugins`).
pub fn is_conflist(conf: &Value) -> bool {
    conf.get("plugins").is_some_and(Value::is_array)
}

/// Copy `deviceID`/`pciBusID` into a delegate config: the top level of a single conf, every plugin
/// of a conflist (so a chained RDMA plugin sees it too; Multus #448).
pub fn inject_device_id(conf: &mut Value, device_id: &str) {
    let put = |m: &mut Map<String, Value>| {
        m.insert("deviceID".into(), device_id.into());
        m.insert("pciBusID".into(), device_id.into());
    };
    match conf.get_mut("plugins").and_then(Value::as_array_mut) {
        Some(plugins) => plugins.iter_mut().filter_map(Value::as_object_mut).for_each(put),
        None => {
            if let Some(m) = conf.as_object_mut() {
                put(m)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nads_load_from_yaml_and_json_manifests_with_several_documents() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("rails.yaml"),
            r#"apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata:
  name: rail0
  namespace: ml
  annotations:
    k8s.v1.cni.cncf.io/resourceName: nvidia.com/hostdev
spec:
  config: '{"cniVersion":"1.0.0","type":"plexus-macvlan","master":"ens1f0"}'
---
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata:
  name: rail1
spec:
  config: |
    {"cniVersion": "1.0.0", "name": "custom", "plugins": [{"type": "plexus-macvlan"}]}
"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("empty.json"),
            r#"{"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition","metadata":{"name":"fromfile","namespace":"ml"}}"#,
        )
        .unwrap();
        let src = DirSource::load(dir.path(), 1 << 20).unwrap();
        assert_eq!(src.len(), 2, "two files");
        let rail0 = src.nad("ml", "rail0").unwrap();
        assert_eq!(rail0.resource_name.as_deref(), Some("nvidia.com/hostdev"));
        let conf = rail0.cni_config(dir.path()).unwrap();
        assert_eq!(conf["name"], "rail0", "a config without name gets the NAD's");
        let rail1 = src.nad("default", "rail1").unwrap().cni_config(dir.path()).unwrap();
        assert!(is_conflist(&rail1));
        assert_eq!(rail1["name"], "custom");
        let confs = tempfile::tempdir().unwrap();
        std::fs::write(confs.path().join("10-x.conf"), r#"{"cniVersion":"1.0.0","name":"fromfile","type":"static"}"#)
            .unwrap();
        assert_eq!(src.nad("ml", "fromfile").unwrap().cni_config(confs.path()).unwrap()["type"], "static");
        let e = src.nad("ml", "nope").unwrap_err();
        assert_eq!(e.to_string(), "cannot find a network-attachment-definition (nope) in namespace (ml)");
    }

    fn manifest(name: &str) -> String {
        format!(
            "apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata:\n  name: {name}\nspec:\n  config: '{{\"cniVersion\":\"1.0.0\",\"type\":\"plexus-macvlan\"}}'\n"
        )
    }

    #[test]
    fn a_nad_is_read_from_its_own_file_and_no_other_file_is_read_or_parsed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("rail0.yaml"), manifest("rail0")).unwrap();
        std::fs::write(dir.path().join("a-junk.yaml"), "{{{ not yaml").unwrap();
        // Larger than the cap: never read (its size is checked first), and it passes nothing on.
        std::fs::File::create(dir.path().join("huge.yaml")).unwrap().set_len(64 << 20).unwrap();
        let src = DirSource::load(dir.path(), 64 * 1024).unwrap();
        assert_eq!(src.nad("default", "rail0").unwrap().name, "rail0");
        let parsed = src.parsed.lock().unwrap();
        assert_eq!(parsed.keys().collect::<Vec<_>>(), [&dir.path().join("rail0.yaml")], "only the selected file");
    }

    #[test]
    fn a_broken_manifest_is_its_own_networks_error_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("broken.yaml"), "{{{ not yaml").unwrap();
        std::fs::File::create(dir.path().join("huge.yaml")).unwrap().set_len(64 << 20).unwrap();
        // Several NADs in one file not named after them: found by looking past the broken ones.
        std::fs::write(dir.path().join("rails.yaml"), format!("{}---\n{}", manifest("rail1"), manifest("rail2")))
            .unwrap();
        let src = DirSource::load(dir.path(), 64 * 1024).unwrap();
        assert_eq!(src.nad("default", "rail2").unwrap().name, "rail2");
        let e = src.nad("default", "broken").unwrap_err().to_string();
        assert!(e.starts_with("network-attachment-definition default/broken: manifest "), "{e}");
        assert!(e.contains("broken.yaml"), "{e}");
        let e = src.nad("default", "huge").unwrap_err().to_string();
        assert!(e.contains("larger than 65536 bytes (67108864 bytes)"), "{e}");
        assert_eq!(
            src.nad("default", "nope").unwrap_err().to_string(),
            "cannot find a network-attachment-definition (nope) in namespace (default)",
            "nothing of the broken files in another network's error"
        );
    }

    #[test]
    fn device_ids_reach_every_plugin_of_a_chain() {
        let mut list = serde_json::json!({"plugins": [{"type": "a"}, {"type": "b"}]});
        inject_device_id(&mut list, "0000:3b:00.2");
        assert_eq!(list["plugins"][1]["pciBusID"], "0000:3b:00.2");
        let mut single = serde_json::json!({"type": "a"});
        inject_device_id(&mut single, "mlx5_core.sf.4");
        assert_eq!(single["deviceID"], "mlx5_core.sf.4");
    }
}
