//! The node policy: what only root (the cluster admin) decides on a node, read by every plexus
//! binary. A network config (a NetworkAttachmentDefinition is tenant-written) chooses *what* to
//! attach among what this policy allows; it never chooses where root writes, reads, logs,
//! connects or what it executes.
//!
//! The file is `/etc/cni/plexus/policy.json`, or the file `PLEXUS_POLICY` names (the runtime's
//! environment, which tenants do not control). It must be a regular file owned by root (or by
//! the user running the plugin) and writable by no one else. No file: the defaults below, which
//! allow what a node needs with plexus's default paths.
//!
//! ```json
//! {
//!   "dataRoots": ["/var/lib/cni/plexus-ipam", "/var/lib/cni/plexus-host-device"],
//!   "log": {"file": "/var/log/plexus.log", "level": "info"},
//!   "stores": {"fabric": {"etcd": {"endpoints": ["https://10.0.0.5:2379"], "prefix": "/plexus-ipam",
//!              "tls": {"caFile": "/etc/plexus/etcd-ca.pem"}}}},
//!   "allow": {"parents": ["ens1f0np0", "ens2f0np0"], "devices": ["ens1f0v*"],
//!             "pciAddresses": ["0000:3b:00.*"], "ranges": ["198.18.0.0/16"],
//!             "namespaces": {"team-a": {"parents": ["ens1f0np0"], "macvlanModes": ["bridge", "passthru"],
//!                                       "ranges": ["198.18.4.0/22"]}}},
//!   "maxAttachments": 64,
//!   "limits": {"requestTimeoutSeconds": 110, "nadConfigBytes": 65536, "kubernetesPools": 256,
//!              "bcQueueLen": 10000},
//!   "deviceInfoDir": "/var/run/k8s.cni.cncf.io/devinfo/cni",
//!   "kubernetes": {"kubeconfig": "/etc/cni/net.d/plexus.d/plexus.kubeconfig", "namespace": "kube-system"}
//! }
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::files::is_clean_absolute;
use crate::paths;
use plexus_cni::error::Error;

/// The largest policy file read.
const POLICY_MAX_BYTES: u64 = 1024 * 1024;

/// The node policy (see the module documentation for the file).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Policy {
    /// Directories beneath which a config's `dataDir` (plexus-ipam's file store, its
    /// `store.file.dataDir`, plexus-host-device's state) may live.
    #[serde(default = "default_data_roots")]
    pub data_roots: Vec<PathBuf>,
    /// Where the delegates log (the meta-plugin's own `logFile` comes from its admin config).
    #[serde(default)]
    pub log: LogPolicy,
    /// Named store profiles for plexus-ipam (`"store": "<name>"`): etcd endpoints, prefix and
    /// credential files live only here. Parsed by plexus-ipam when a config selects one.
    #[serde(default)]
    pub stores: BTreeMap<String, Value>,
    /// Which node devices a config may use; an absent list restricts nothing.
    #[serde(default)]
    pub allow: Allow,
    /// The most attachments one pod may ask the meta-plugin for.
    #[serde(default = "default_max_attachments")]
    pub max_attachments: usize,
    /// The directory `runtimeConfig.CNIDeviceInfoFile` must name a file in.
    #[serde(default = "default_device_info_dir")]
    pub device_info_dir: PathBuf,
    /// The Kubernetes API plexus-ipam's `kubernetes` store uses (`"store": "kubernetes"`): the
    /// node's credentials and the namespace of the IPAM objects. Only here, never in a config.
    #[serde(default)]
    pub kubernetes: Option<KubernetesPolicy>,
    /// The bounds of what one request (and so one tenant) may take of what the node shares.
    #[serde(default)]
    pub limits: Limits,
    /// The file this policy came from (messages say which rule refused what).
    #[serde(skip)]
    pub source: String,
}

/// The Kubernetes API of plexus-ipam's `kubernetes` store.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubernetesPolicy {
    /// A kubeconfig with the node's credentials (the DaemonSet's service-account kubeconfig).
    pub kubeconfig: PathBuf,
    /// The namespace of the IPPool and OverlappingRangeIPReservation objects (whereabouts'
    /// default: `kube-system`).
    #[serde(default = "default_ipam_namespace")]
    pub namespace: String,
    /// The namespace of nv-ipam's `IPPool` objects a network names with `poolName` (where the
    /// NVIDIA Network Operator keeps them); none: `namespace`. The admin's, as the rest of this.
    #[serde(default)]
    pub pool_namespace: Option<String>,
}

fn default_ipam_namespace() -> String {
    "kube-system".into()
}

/// The log destination of plexus's delegates.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LogPolicy {
    #[serde(default)]
    pub file: Option<PathBuf>,
    #[serde(default)]
    pub level: Option<String>,
}

/// The bounds a tenant's requests stay within (`limits`), each the admin's.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Limits {
    /// The longest one CNI request may take, in seconds, delegates included: every wait for a
    /// lock, the API or a delegate ends there (code 11), a delegate process still running then is
    /// killed, and plexus-daemon gives the request's slot back.
    #[serde(default = "default_request_timeout")]
    pub request_timeout_seconds: u64,
    /// The largest `spec.config` of a NetworkAttachmentDefinition plexus reads, in bytes: a pod
    /// selecting a larger one gets code 7, and plexus-daemon's cache keeps only its size.
    #[serde(default = "default_nad_config_bytes")]
    pub nad_config_bytes: usize,
    /// The most IPPools the `kubernetes` store's namespace may hold before a node refuses to
    /// create another (code 7): tenants choose range and `network_name`, the node's credentials
    /// create the object.
    #[serde(default = "default_kubernetes_pools")]
    pub kubernetes_pools: usize,
    /// The largest macvlan `bcqueuelen` a config may ask for: the broadcast queue is the
    /// parent's, shared by every macvlan on it, and the kernel keeps the largest any asked for.
    #[serde(default = "default_bc_queue_len")]
    pub bc_queue_len: u32,
}

fn default_request_timeout() -> u64 {
    110
}
fn default_nad_config_bytes() -> usize {
    64 * 1024
}
fn default_kubernetes_pools() -> usize {
    256
}
fn default_bc_queue_len() -> u32 {
    10_000
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            request_timeout_seconds: default_request_timeout(),
            nad_config_bytes: default_nad_config_bytes(),
            kubernetes_pools: default_kubernetes_pools(),
            bc_queue_len: default_bc_queue_len(),
        }
    }
}

impl Limits {
    /// [`Limits::request_timeout_seconds`] as a duration.
    pub fn request_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.request_timeout_seconds)
    }
}

/// Allow-lists, node-wide and per pod namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(from = "AllowKeys")]
pub struct Allow {
    /// The node-wide lists.
    pub lists: AllowLists,
    /// Lists for pods of one namespace; a list absent there falls back to the node-wide one.
    pub namespaces: BTreeMap<String, AllowLists>,
}

/// `allow` as written: the node-wide lists beside `namespaces` (spelled out rather than
/// flattened, which would let a misspelt key through).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AllowKeys {
    #[serde(default)]
    parents: Option<Vec<String>>,
    #[serde(default)]
    devices: Option<Vec<String>>,
    #[serde(default)]
    pci_addresses: Option<Vec<String>>,
    #[serde(default)]
    macvlan_modes: Option<Vec<String>>,
    #[serde(default)]
    ranges: Option<Vec<String>>,
    #[serde(default)]
    namespaces: BTreeMap<String, AllowLists>,
}

impl From<AllowKeys> for Allow {
    fn from(k: AllowKeys) -> Allow {
        Allow {
            lists: AllowLists {
                parents: k.parents,
                devices: k.devices,
                pci_addresses: k.pci_addresses,
                macvlan_modes: k.macvlan_modes,
                ranges: k.ranges,
            },
            namespaces: k.namespaces,
        }
    }
}

/// The lists of one scope (the node, or one namespace). An absent list restricts nothing, except
/// `macvlanModes`, whose absence allows every mode that does not take the parent over.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AllowLists {
    #[serde(default)]
    pub parents: Option<Vec<String>>,
    #[serde(default)]
    pub devices: Option<Vec<String>>,
    #[serde(default)]
    pub pci_addresses: Option<Vec<String>>,
    /// macvlan modes; `passthru` (the parent's MAC and all its unicast traffic) only when named.
    #[serde(default)]
    pub macvlan_modes: Option<Vec<String>>,
    /// CIDRs every range of a plexus-ipam config must lie inside (any store).
    #[serde(default)]
    pub ranges: Option<Vec<String>>,
}

/// What an allow-list governs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allowed {
    /// A macvlan parent (`master`).
    Parent,
    /// A netdev plexus-host-device moves.
    Device,
    /// The PCI address of a device plexus-host-device hands to a pod.
    PciAddress,
    /// A macvlan mode.
    MacvlanMode,
}

/// The macvlan modes allowed where no `macvlanModes` list says otherwise: every mode but
/// `passthru`, which gives the macvlan the parent's MAC and all of its unicast traffic.
pub const DEFAULT_MACVLAN_MODES: &[&str] = &["bridge", "private", "vepa"];

impl Allowed {
    fn key(self) -> &'static str {
        match self {
            Allowed::Parent => "parents",
            Allowed::Device => "devices",
            Allowed::PciAddress => "pciAddresses",
            Allowed::MacvlanMode => "macvlanModes",
        }
    }

    fn pick(self, lists: &AllowLists) -> Option<&Vec<String>> {
        match self {
            Allowed::Parent => lists.parents.as_ref(),
            Allowed::Device => lists.devices.as_ref(),
            Allowed::PciAddress => lists.pci_addresses.as_ref(),
            Allowed::MacvlanMode => lists.macvlan_modes.as_ref(),
        }
    }
}

/// The macvlan modes plexus knows.
pub const MACVLAN_MODES: &[&str] = &["bridge", "private", "vepa", "passthru"];

/// The longest `limits.requestTimeoutSeconds` a policy may set (a runtime gives up long before).
pub const MAX_REQUEST_TIMEOUT_SECONDS: u64 = 3600;

fn default_data_roots() -> Vec<PathBuf> {
    vec![paths::IPAM_DATA_DIR.into(), paths::HOST_DEVICE_DATA_DIR.into()]
}
fn default_max_attachments() -> usize {
    64
}
fn default_device_info_dir() -> PathBuf {
    paths::DEVICE_INFO_CNI_DIR.into()
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            data_roots: default_data_roots(),
            log: LogPolicy::default(),
            stores: BTreeMap::new(),
            allow: Allow::default(),
            max_attachments: default_max_attachments(),
            device_info_dir: default_device_info_dir(),
            kubernetes: None,
            limits: Limits::default(),
            source: format!("defaults (no {})", paths::POLICY_FILE),
        }
    }
}

/// The policies a long-running process read (plexus-daemon, whose in-process delegates load
/// their request's policy on every request), each kept with its file's device, inode, size,
/// times, owner and mode, and read again only when the file changed. Held by whoever serves the
/// requests (plexus-plugin's `Runner` of plexus-daemon), never by
/// the process: two memos never share what they read. Bounded: requests name only the files
/// their runtime's environment names (`PLEXUS_POLICY`, which tenants do not set), and at most
/// [`PolicyMemo::KEPT`] are kept.
#[derive(Debug, Default)]
pub struct PolicyMemo {
    kept: std::sync::Mutex<Vec<(PathBuf, crate::files::FileStamp, Policy)>>,
}

impl PolicyMemo {
    /// How many policy files are kept at most (the oldest goes first).
    pub const KEPT: usize = 4;

    /// [`Policy::load`], from what this memo kept while the file is unchanged.
    pub fn load(&self, getenv: impl Fn(&str) -> Option<String>) -> Result<Policy, Error> {
        match Policy::path(getenv) {
            Some(p) => self.from_file(&p),
            None => Ok(Policy::default()),
        }
    }

    /// [`Policy::from_file`], from what this memo kept while the file is unchanged.
    pub fn from_file(&self, path: &Path) -> Result<Policy, Error> {
        use crate::files::FileStamp;
        let kept = || self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(stamp) = FileStamp::of_path(path)
            && let Some((_, _, policy)) = kept().iter().find(|(p, known, _)| p == path && *known == stamp)
        {
            return Ok(policy.clone());
        }
        let (meta, policy) = Policy::read_file(path)?;
        let mut kept = kept();
        kept.retain(|(p, _, _)| p != path);
        if kept.len() >= PolicyMemo::KEPT {
            kept.remove(0);
        }
        kept.push((path.to_path_buf(), FileStamp::of(&meta), policy.clone()));
        Ok(policy)
    }
}

/// An entry matches a name exactly, or by prefix when it ends in `*` (`ens1f0v*`).
fn matches(entry: &str, value: &str) -> bool {
    match entry.strip_suffix('*') {
        Some(prefix) => value.starts_with(prefix),
        None => entry == value,
    }
}

fn policy_error(path: &Path, why: impl std::fmt::Display) -> Error {
    Error::invalid_config(format!("node policy {}: {why}", path.display()))
}

impl Policy {
    /// The policy of this node: `PLEXUS_POLICY`'s file, else the default file, else defaults.
    /// Read every time: a long-running process keeps what it read in a [`PolicyMemo`].
    pub fn load(getenv: impl Fn(&str) -> Option<String>) -> Result<Policy, Error> {
        match Policy::path(getenv) {
            Some(p) => Policy::from_file(&p),
            None => Ok(Policy::default()),
        }
    }

    /// The file [`Policy::load`] reads, if any.
    fn path(getenv: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
        match getenv(paths::POLICY_ENV).filter(|v| !v.is_empty()) {
            Some(p) => Some(PathBuf::from(p)),
            None if Path::new(paths::POLICY_FILE).exists() => Some(PathBuf::from(paths::POLICY_FILE)),
            None => None,
        }
    }

    /// Read and check a policy file: a regular file, owned by root or by this user, writable by
    /// no one else.
    pub fn from_file(path: &Path) -> Result<Policy, Error> {
        Policy::read_file(path).map(|(_, policy)| policy)
    }

    fn read_file(path: &Path) -> Result<(std::fs::Metadata, Policy), Error> {
        use std::os::unix::fs::MetadataExt;
        let file = std::fs::File::open(path).map_err(|e| policy_error(path, e))?;
        let meta = file.metadata().map_err(|e| policy_error(path, e))?;
        let me = nix::unistd::geteuid().as_raw();
        if !meta.is_file() {
            return Err(policy_error(path, "not a regular file"));
        }
        if meta.uid() != 0 && meta.uid() != me {
            return Err(policy_error(path, format!("owned by uid {}: only root may write the policy", meta.uid())));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(policy_error(
                path,
                format!("mode {:o} lets others write it: only root may (chmod go-w)", meta.mode() & 0o777),
            ));
        }
        let text = crate::files::read_capped(file, POLICY_MAX_BYTES)
            .map_err(|e| policy_error(path, e))?
            .ok_or_else(|| policy_error(path, format!("larger than {POLICY_MAX_BYTES} bytes")))?;
        let mut policy = Policy::parse(&text).map_err(|e| policy_error(path, e.msg))?;
        policy.source = path.display().to_string();
        Ok((meta, policy))
    }

    /// Parse and check a policy document.
    pub fn parse(text: &[u8]) -> Result<Policy, Error> {
        let de = &mut serde_json::Deserializer::from_slice(text);
        let policy: Policy = serde_path_to_error::deserialize(de)
            .map_err(|e| Error::invalid_config(format!("{}: {}", e.path(), e.inner())))?;
        for root in &policy.data_roots {
            if !is_clean_absolute(root) {
                return Err(Error::invalid_config(format!(
                    "dataRoots: {:?} is not an absolute path without . or ..",
                    root.display().to_string()
                )));
            }
        }
        if !is_clean_absolute(&policy.device_info_dir) {
            return Err(Error::invalid_config(format!(
                "deviceInfoDir: {:?} is not an absolute path without . or ..",
                policy.device_info_dir.display().to_string()
            )));
        }
        if policy.max_attachments == 0 {
            return Err(Error::invalid_config("maxAttachments: must be at least 1"));
        }
        let limits = &policy.limits;
        if !(1..=MAX_REQUEST_TIMEOUT_SECONDS).contains(&limits.request_timeout_seconds) {
            return Err(Error::invalid_config(format!(
                "limits.requestTimeoutSeconds: {} is not between 1 and {MAX_REQUEST_TIMEOUT_SECONDS}",
                limits.request_timeout_seconds
            )));
        }
        if limits.nad_config_bytes == 0 || limits.kubernetes_pools == 0 {
            return Err(Error::invalid_config("limits.nadConfigBytes and limits.kubernetesPools: must be at least 1"));
        }
        let scopes = std::iter::once(("allow".to_string(), &policy.allow.lists))
            .chain(policy.allow.namespaces.iter().map(|(ns, l)| (format!("allow.namespaces.{ns}"), l)));
        for (scope, lists) in scopes {
            for mode in lists.macvlan_modes.iter().flatten() {
                if !MACVLAN_MODES.contains(&mode.as_str()) {
                    return Err(Error::invalid_config(format!(
                        "{scope}.macvlanModes: {mode:?} is not one of {MACVLAN_MODES:?}"
                    )));
                }
            }
            for cidr in lists.ranges.iter().flatten() {
                if cidr.parse::<ipnetwork::IpNetwork>().is_err() {
                    return Err(Error::invalid_config(format!("{scope}.ranges: {cidr:?} is not a CIDR")));
                }
            }
        }
        Ok(policy)
    }

    /// The root of `dataRoots` that `path` (config key `key`) lies beneath: a code-7 error
    /// naming the key, the value and the rule otherwise.
    pub fn data_root(&self, key: &str, path: &Path) -> Result<&Path, Error> {
        let shown = path.display().to_string();
        if !is_clean_absolute(path) {
            return Err(Error::invalid_config(format!("{key} {shown:?} must be an absolute path without . or ..")));
        }
        self.data_roots.iter().find(|r| path.starts_with(r)).map(PathBuf::as_path).ok_or_else(|| {
            Error::invalid_config(format!("{key} {shown:?} is not beneath the node policy's dataRoots"))
                .with_details(format!("dataRoots {:?} (policy: {})", self.data_roots, self.source))
        })
    }

    /// The list of `what` that applies to a pod in `namespace` (its namespace's, else the
    /// node-wide one) and the scope it came from (for messages); `None` when there is none.
    fn list_for(&self, what: Allowed, namespace: Option<&str>) -> Option<(&Vec<String>, String)> {
        let ns = namespace.and_then(|n| self.allow.namespaces.get(n).map(|l| (n, l)));
        match ns.and_then(|(n, l)| what.pick(l).map(|list| (list, format!(" for namespace {n}")))) {
            Some(found) => Some(found),
            None => what.pick(&self.allow.lists).map(|list| (list, String::new())),
        }
    }

    fn refused(&self, what: Allowed, key: &str, value: &str, list: &[String], scope: &str) -> Error {
        Error::invalid_config(format!("{key} {value:?} is not allowed by the node policy")).with_details(format!(
            "allow.{}{scope}: {list:?} (policy: {})",
            what.key(),
            self.source
        ))
    }

    /// Check that `value` (config key `key`) is on the allow-list of `what` for a pod in
    /// `namespace`; no list means no restriction (macvlan modes: [`DEFAULT_MACVLAN_MODES`]).
    pub fn check_allowed(&self, what: Allowed, key: &str, value: &str, namespace: Option<&str>) -> Result<(), Error> {
        let Some((list, scope)) = self.list_for(what, namespace) else {
            if what == Allowed::MacvlanMode && !DEFAULT_MACVLAN_MODES.contains(&value) {
                let defaults: Vec<String> = DEFAULT_MACVLAN_MODES.iter().map(|m| m.to_string()).collect();
                return Err(self
                    .refused(what, key, value, &defaults, " (not set: the modes that share the parent)")
                    .with_details(format!(
                        "mode {value:?} takes the parent over: name it in allow.macvlanModes (node-wide) or \
                         allow.namespaces.<namespace>.macvlanModes (policy: {})",
                        self.source
                    )));
            }
            return Ok(());
        };
        if list.iter().any(|e| matches(e, value)) {
            return Ok(());
        }
        Err(self.refused(what, key, value, list, &scope))
    }

    /// Whether `value` is named by the list of `what` for a pod in `namespace` (a list that
    /// exists and matches it; no list names nothing).
    pub fn names(&self, what: Allowed, value: &str, namespace: Option<&str>) -> bool {
        self.list_for(what, namespace).is_some_and(|(list, _)| list.iter().any(|e| matches(e, value)))
    }

    /// Check that `network` (an IPAM range of config key `key`) lies inside one of the CIDRs of
    /// `allow.ranges` for a pod in `namespace`; no list means no restriction.
    pub fn check_range(&self, key: &str, network: ipnetwork::IpNetwork, namespace: Option<&str>) -> Result<(), Error> {
        let ns = namespace.and_then(|n| self.allow.namespaces.get(n).map(|l| (n, l)));
        let (list, scope) = match ns.and_then(|(n, l)| l.ranges.as_ref().map(|r| (r, format!(" for namespace {n}")))) {
            Some(found) => found,
            None => match &self.allow.lists.ranges {
                Some(list) => (list, String::new()),
                None => return Ok(()),
            },
        };
        let inside = |cidr: &String| {
            cidr.parse::<ipnetwork::IpNetwork>().is_ok_and(|allowed| {
                allowed.is_ipv4() == network.is_ipv4()
                    && allowed.prefix() <= network.prefix()
                    && allowed.contains(network.network())
            })
        };
        if list.iter().any(inside) {
            return Ok(());
        }
        Err(Error::invalid_config(format!("{key} {:?} is not allowed by the node policy", network.to_string()))
            .with_details(format!("allow.ranges{scope}: {list:?} (policy: {})", self.source)))
    }

    /// Whether `path` names a file directly in the device-info directory (also when spelled
    /// through `/run` for `/var/run`, which links there).
    pub fn device_info_file_allowed(&self, path: &Path) -> bool {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { return false };
        if !is_clean_absolute(path) || name.starts_with('.') {
            return false;
        }
        let parent = path.parent().unwrap_or(Path::new("/"));
        let dir = &self.device_info_dir;
        let run = |p: &Path| p.strip_prefix("/var/run").ok().map(|rest| Path::new("/run").join(rest));
        parent == dir || run(dir).is_some_and(|d| d == parent) || run(parent).is_some_and(|p| p == *dir)
    }

    /// A named store profile (`stores.<name>`).
    pub fn store(&self, name: &str) -> Option<&Value> {
        self.stores.get(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(v: Value) -> Policy {
        Policy::parse(v.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn no_policy_means_plexus_default_paths_and_no_device_restriction() {
        let p = Policy::default();
        assert!(p.data_root("dataDir", Path::new("/var/lib/cni/plexus-ipam/x")).is_ok());
        let e = p.data_root("dataDir", Path::new("/etc/cni")).unwrap_err();
        assert_eq!(e.code, plexus_cni::code::INVALID_NETWORK_CONFIG);
        assert!(e.msg.contains("dataDir \"/etc/cni\" is not beneath the node policy's dataRoots"), "{e}");
        assert!(p.check_allowed(Allowed::Parent, "master", "eth9", Some("ns")).is_ok());
        assert_eq!(p.max_attachments, 64);
    }

    #[test]
    fn data_dirs_with_parent_steps_are_refused_even_beneath_a_root() {
        let p = Policy::default();
        let e = p.data_root("dataDir", Path::new("/var/lib/cni/plexus-ipam/../../../etc")).unwrap_err();
        assert!(e.msg.contains("absolute path without . or .."), "{e}");
        assert!(p.data_root("dataDir", Path::new("relative")).is_err());
        assert!(p.data_root("dataDir", Path::new("/var/lib/cni/plexus-ipamX")).is_err(), "component-wise");
    }

    #[test]
    fn allow_lists_apply_per_namespace_then_node_wide_with_prefix_entries() {
        let p = policy(json!({"allow": {"parents": ["ens1f0np0"], "devices": ["ens1f0v*"],
            "namespaces": {"team-a": {"parents": ["ens2f0np0"]}}}}));
        assert!(p.check_allowed(Allowed::Parent, "master", "ens1f0np0", None).is_ok());
        assert!(p.check_allowed(Allowed::Parent, "master", "ens1f0np0", Some("other")).is_ok());
        let e = p.check_allowed(Allowed::Parent, "master", "ens1f0np0", Some("team-a")).unwrap_err();
        assert_eq!(e.msg, "master \"ens1f0np0\" is not allowed by the node policy");
        assert!(e.details.contains("allow.parents for namespace team-a: [\"ens2f0np0\"]"), "{}", e.details);
        assert!(p.check_allowed(Allowed::Device, "device", "ens1f0v3", Some("team-a")).is_ok(), "falls back");
        assert!(p.check_allowed(Allowed::Device, "device", "ens2f0v3", None).is_err());
        assert!(p.check_allowed(Allowed::PciAddress, "pciBusID", "0000:3b:00.2", None).is_ok(), "no list");
    }

    #[test]
    fn device_info_files_only_directly_in_the_device_info_dir_spelled_either_way() {
        let p = Policy::default();
        let ok = ["/var/run/k8s.cni.cncf.io/devinfo/cni/net-c1_net1", "/run/k8s.cni.cncf.io/devinfo/cni/x.json"];
        for path in ok {
            assert!(p.device_info_file_allowed(Path::new(path)), "{path}");
        }
        let bad = [
            "/var/lib/kubelet/kubeconfig",
            "/var/run/k8s.cni.cncf.io/devinfo/cni/../../../../etc/passwd",
            "/var/run/k8s.cni.cncf.io/devinfo/cni/sub/x",
            "/var/run/k8s.cni.cncf.io/devinfo/cni/",
            "/var/run/k8s.cni.cncf.io/devinfo/cni/.hidden",
            "k8s.cni.cncf.io/devinfo/cni/x",
        ];
        for path in bad {
            assert!(!p.device_info_file_allowed(Path::new(path)), "{path}");
        }
    }

    #[test]
    fn a_policy_with_unknown_keys_or_bad_values_is_refused_by_name() {
        let e = Policy::parse(br#"{"dataRoot": ["/x"]}"#).unwrap_err();
        assert!(e.msg.contains("unknown field `dataRoot`"), "{e}");
        let e = Policy::parse(br#"{"dataRoots": ["x"]}"#).unwrap_err();
        assert!(e.msg.contains("dataRoots: \"x\""), "{e}");
        let e = Policy::parse(br#"{"allow": {"parents": "eth0"}}"#).unwrap_err();
        assert!(e.msg.starts_with("allow.parents"), "{e}");
        let e = Policy::parse(br#"{"allow": {"namespaces": {"a": {"parent": ["eth0"]}}}}"#).unwrap_err();
        assert!(e.msg.contains("unknown field `parent`"), "a typo never loosens the policy: {e}");
        assert!(Policy::parse(br#"{"maxAttachments": 0}"#).is_err());
    }

    #[test]
    fn a_policy_file_others_may_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("policy.json");
        std::fs::write(&f, br#"{"maxAttachments": 8}"#).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let p = Policy::from_file(&f).unwrap();
        assert_eq!((p.max_attachments, p.source.clone()), (8, f.display().to_string()));
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = Policy::from_file(&f).unwrap_err();
        assert!(e.msg.contains("lets others write it"), "{e}");
    }

    #[test]
    fn a_memo_reads_a_policy_file_again_once_it_changed_and_shares_nothing_with_another() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, max: u32| {
            let f = dir.path().join(name);
            let tmp = dir.path().join(format!("{name}.new"));
            std::fs::write(&tmp, format!(r#"{{"maxAttachments": {max}}}"#)).unwrap();
            std::fs::rename(&tmp, &f).unwrap();
            f
        };
        let (one, two) = (write("one.json", 8), write("two.json", 9));
        let (a, b) = (PolicyMemo::default(), PolicyMemo::default());
        let max = |m: &PolicyMemo, f: &Path| m.from_file(f).unwrap().max_attachments;
        assert_eq!((max(&a, &one), max(&a, &two), max(&a, &one)), (8, 9, 8), "two files, each its own");
        assert_eq!(max(&b, &two), 9);
        write("one.json", 7);
        assert_eq!(max(&a, &one), 7, "a changed file is read again");
        assert_eq!(a.kept.lock().unwrap().len(), 2);
        assert_eq!(b.kept.lock().unwrap().len(), 1, "another memo keeps only what it read");
        for n in 0..PolicyMemo::KEPT + 2 {
            max(&a, &write(&format!("more{n}.json"), 8));
        }
        assert_eq!(a.kept.lock().unwrap().len(), PolicyMemo::KEPT, "bounded");
        let via_env = a.load(|k| (k == paths::POLICY_ENV).then(|| one.display().to_string())).unwrap();
        assert_eq!(via_env.max_attachments, 7);
    }
}
