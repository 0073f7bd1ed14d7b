//! The meta-plugin's configuration: Multus's thin-plugin keys with their meaning and defaults,
//! plus plexus's `nadDir`, `networks`, `apiTimeout` and `kubeletCheckpoint`.
//!
//! Who may set these: the admin, who writes the meta config in the CNI conf dir. Its path keys
//! (`binDir`, `kubeconfig`, `cniDir`, `nadDir`, `confDir`, `readinessindicatorfile`,
//! `kubeletCheckpoint`, `logFile`, `multusCacheDir`) say where root executes, connects, writes
//! and reads. A config a network chose never reaches them: the delegation seam never runs the
//! meta-plugin as a delegate (`plexus_plugin::delegate::resolve`, by name and by the binary's
//! role note), and a plexus whose request was made by a delegation anyway (a binary the seam
//! does not know ran it: `Request::delegated`) refuses before it reads any of them.

use std::path::PathBuf;
use std::time::Duration;

use plexus_cni::Error;
use plexus_plugin::Request;
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MetaConf {
    #[serde(default)]
    pub kubeconfig: Option<PathBuf>,
    #[serde(default)]
    pub cluster_network: Option<String>,
    #[serde(default)]
    pub default_networks: Vec<String>,
    #[serde(default)]
    pub delegates: Vec<Value>,
    #[serde(default = "default_conf_dir")]
    pub conf_dir: PathBuf,
    #[serde(default = "default_cni_dir")]
    pub cni_dir: PathBuf,
    #[serde(default = "default_bin_dir")]
    pub bin_dir: PathBuf,
    #[serde(default)]
    pub namespace_isolation: bool,
    /// Comma-separated namespaces exempt from isolation (replaces the default `default`), read
    /// as a list.
    #[serde(default = "default_global_namespaces", deserialize_with = "comma_separated")]
    pub global_namespaces: Vec<String>,
    #[serde(default = "default_system_namespaces")]
    pub system_namespaces: Vec<String>,
    #[serde(default = "default_multus_namespace")]
    pub multus_namespace: String,
    #[serde(default, rename = "readinessindicatorfile")]
    pub readiness_indicator_file: Option<PathBuf>,
    #[serde(default)]
    pub retry_delete_on_error: bool,
    /// plexus: NetworkAttachmentDefinition manifests, used when no Kubernetes API is configured.
    #[serde(default)]
    pub nad_dir: Option<PathBuf>,
    /// plexus: the selection (annotation syntax) when there is no pod annotation to read.
    #[serde(default)]
    pub networks: Option<String>,
    /// plexus: deadline of each Kubernetes API call, in seconds (none or not above 0: 5 s).
    #[serde(default = "default_api_timeout", deserialize_with = "seconds")]
    pub api_timeout: Duration,
    /// plexus: the kubelet device-plugin checkpoint (device IDs of `resourceName` NADs), read
    /// when the pod-resources API does not answer.
    #[serde(default)]
    pub kubelet_checkpoint: Option<PathBuf>,
    /// plexus: the kubelet's pod-resources socket (device IDs of `resourceName` NADs; the
    /// admin's key, as every meta config key).
    #[serde(default)]
    pub pod_resources_socket: Option<PathBuf>,
    /// plexus: ADD and DEL a pod's attachments concurrently (the cluster network on its own,
    /// first on ADD and last on DEL); `false` runs them one after another as Multus does. The
    /// admin's key, as every meta config key.
    #[serde(default = "default_parallel")]
    pub parallel: bool,
    /// plexus: the unix socket of `plexus-daemon`. When set, the shim sends each request there
    /// and runs it itself (thin mode) when the daemon is not there, does not take it within
    /// [`crate::shim::ANSWER_DEADLINE`] or is busy. The admin's key, as every meta config key.
    #[serde(default)]
    pub daemon_socket: Option<PathBuf>,
    /// plexus: where Multus keeps the delegates of the sandboxes it attached (its `cniDir`), read
    /// by DEL and GC for a container plexus has no cache of — a pod attached before the node
    /// switched from Multus (`crate::multus`). `null` reads none. The admin's key, as every meta
    /// config key.
    #[serde(default = "default_multus_cache_dir")]
    pub multus_cache_dir: Option<PathBuf>,
    /// plexus: also write, in `multusCacheDir`, the cache Multus would have written for each pod
    /// plexus attaches, so that a node switched back to Multus deletes those pods as Multus
    /// deletes its own (`crate::multus::write`). Off by default: one file more per ADD. The
    /// admin's key, as every meta config key.
    #[serde(default)]
    pub write_multus_cache: bool,
    /// plexus: where plexus's DRA driver (`plexus-daemon --dra`) keeps the claims it prepared:
    /// ADD attaches the devices of the claims reserved for the pod, next to its annotation's
    /// networks (`crate::plan`). `null` reads none. The admin's key, as every meta config key.
    #[serde(default = "default_dra_claims_dir")]
    pub dra_claims_dir: Option<PathBuf>,
}

fn default_dra_claims_dir() -> Option<PathBuf> {
    Some(plexus_node::paths::DRA_CLAIMS_DIR.into())
}

fn default_multus_cache_dir() -> Option<PathBuf> {
    Some(plexus_node::paths::MULTUS_CACHE_DIR.into())
}

fn default_parallel() -> bool {
    true
}

fn default_global_namespaces() -> Vec<String> {
    vec![plexus_k8s::DEFAULT_NAMESPACE.into()]
}

/// `globalNamespaces`: the namespaces of a comma-separated list (`null`: the default's).
fn comma_separated<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(match Option::<String>::deserialize(d)? {
        Some(list) => list.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
        None => default_global_namespaces(),
    })
}

fn default_api_timeout() -> Duration {
    DEFAULT_API_TIMEOUT
}

/// `apiTimeout`: seconds; none, not a finite number above 0, or too large: the default.
fn seconds<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let secs = Option::<f64>::deserialize(d)?;
    Ok(secs.filter(|t| *t > 0.0).and_then(|t| Duration::try_from_secs_f64(t).ok()).unwrap_or(DEFAULT_API_TIMEOUT))
}

fn default_conf_dir() -> PathBuf {
    "/etc/cni/multus/net.d".into()
}
fn default_cni_dir() -> PathBuf {
    plexus_node::paths::META_CACHE_DIR.into()
}
fn default_bin_dir() -> PathBuf {
    plexus_node::paths::CNI_BIN_DIR.into()
}

fn default_system_namespaces() -> Vec<String> {
    vec!["kube-system".into()]
}
fn default_multus_namespace() -> String {
    "kube-system".into()
}

/// How long the readiness indicator file is waited for (Multus: 45 s).
pub const READINESS_WAIT: Duration = Duration::from_secs(45);
/// Default deadline of each API call.
pub const DEFAULT_API_TIMEOUT: Duration = Duration::from_secs(5);

impl MetaConf {
    pub fn load(req: &Request) -> Result<MetaConf, Error> {
        if req.delegated {
            return Err(Error::invalid_config(format!(
                "network {:?}: plexus runs as a delegate of plexus, with a config a network attachment chose: refused",
                req.config.name
            ))
            .with_details("a network's \"type\" may not be the meta-plugin"));
        }
        let mut conf: MetaConf = req.config_as()?;
        if conf.cluster_network.as_deref().is_some_and(|c| !c.is_empty()) && !conf.delegates.is_empty() {
            // Multus ignores "delegates" when "clusterNetwork" is set: a config that works
            // there works here.
            tracing::warn!("\"delegates\" ignored: \"clusterNetwork\" is set (as Multus does)");
            conf.delegates.clear();
        }
        // Multus's cache of a container and plexus's own would be one file.
        if conf.write_multus_cache && conf.multus_cache_dir.as_ref() == Some(&conf.cni_dir) {
            return Err(Error::invalid_config(format!(
                "\"writeMultusCache\": \"multusCacheDir\" {} is \"cniDir\": plexus's cache would be written over",
                conf.cni_dir.display()
            )));
        }
        Ok(conf)
    }

    /// [`MetaConf::load`] for an ADD: once the readiness indicator file is there.
    pub fn for_add(req: &Request) -> Result<MetaConf, Error> {
        let conf = MetaConf::load(req)?;
        conf.wait_ready(req.env.deadline)?;
        Ok(conf)
    }

    /// Wait for the readiness indicator file (ADD), at most until the request's deadline; DEL does not wait.
    fn wait_ready(&self, request: plexus_cni::Deadline) -> Result<(), Error> {
        let Some(file) = &self.readiness_indicator_file else { return Ok(()) };
        let deadline = request.within(READINESS_WAIT).instant();
        while !file.exists() {
            if std::time::Instant::now() >= deadline {
                return Err(Error::try_again_later(format!(
                    "readinessindicatorfile {} did not appear within {READINESS_WAIT:?}",
                    file.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(keys: Value) -> Result<MetaConf, serde_json::Error> {
        let mut v = serde_json::json!({"cniVersion": "1.0.0", "name": "plexus", "type": "plexus"});
        v.as_object_mut().unwrap().extend(keys.as_object().unwrap().clone());
        serde_json::from_value(v)
    }

    #[test]
    fn api_timeout_and_global_namespaces_are_read_as_a_duration_and_a_list_with_their_defaults() {
        let secs = |v: Value| conf(serde_json::json!({"apiTimeout": v})).unwrap().api_timeout;
        assert_eq!(secs(Value::Null), DEFAULT_API_TIMEOUT);
        assert_eq!(secs(2.5.into()), Duration::from_millis(2500));
        for unusable in [0.0, -3.0, 1e300] {
            assert_eq!(secs(unusable.into()), DEFAULT_API_TIMEOUT, "{unusable}");
        }
        assert_eq!(conf(serde_json::json!({})).unwrap().api_timeout, DEFAULT_API_TIMEOUT);
        let globals = |v: Value| conf(serde_json::json!({"globalNamespaces": v})).unwrap().global_namespaces;
        assert_eq!(globals("kube-system, team-a,,".into()), ["kube-system", "team-a"]);
        assert_eq!(globals(Value::Null), ["default"]);
        assert_eq!(conf(serde_json::json!({})).unwrap().global_namespaces, ["default"]);
        assert!(conf(serde_json::json!({"apiTimeout": "5"})).is_err(), "a string is no number of seconds");
    }
}
