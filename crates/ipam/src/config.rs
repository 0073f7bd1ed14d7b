//! The plexus-ipam configuration: whereabouts' keys with the same meaning, plus `store`,
//! `dataDir` and `nodeName`.
//!
//! Who may set what: a network config (a tenant's NetworkAttachmentDefinition) chooses ranges,
//! routes, DNS, `network_name`, static `addresses` (unreserved, as with the reference static
//! IPAM: they only ever reach the tenant's own interface), and a store — the file store in a `dataDir` beneath the node
//! policy's `dataRoots`, or a store profile the admin named in the policy (`"store": "fabric"`).
//! etcd endpoints, prefixes and credential files come only from the policy.

use std::path::PathBuf;

use std::net::IpAddr;

use plexus_cni::{CniResult, Dns, IpConfig, NetConf, Route};
use plexus_node::Policy;
use serde::Deserialize;
use serde_json::Value;

use crate::error::IpamError;
use crate::range::{IpRange, RangeSpec};

/// Where the file store lives unless `dataDir` says otherwise.
pub const DEFAULT_DATA_DIR: &str = plexus_node::paths::IPAM_DATA_DIR;
/// The allocation domain of ranges without `network_name`.
pub const DEFAULT_DOMAIN: &str = "default";

#[derive(Debug, Default, Deserialize)]
struct RangeKeys {
    #[serde(default)]
    range: String,
    #[serde(default)]
    range_start: Option<String>,
    #[serde(default)]
    range_end: Option<String>,
    #[serde(default)]
    exclude: Vec<String>,
    #[serde(default)]
    gateway: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Keys {
    #[serde(flatten)]
    top: RangeKeys,
    #[serde(default)]
    ip_ranges: Vec<RangeKeys>,
    #[serde(default)]
    routes: Vec<Route>,
    #[serde(default)]
    dns: Option<Dns>,
    /// whereabouts' static addresses, added to the result after the allocated ones.
    #[serde(default)]
    addresses: Vec<StaticAddress>,
    #[serde(default, rename = "network_name")]
    network_name: Option<String>,
    #[serde(default = "yes", rename = "enable_overlapping_ranges")]
    enable_overlapping_ranges: bool,
    #[serde(default)]
    store: Option<Value>,
    #[serde(default)]
    data_dir: Option<PathBuf>,
    #[serde(default)]
    node_name: Option<String>,
    /// nv-ipam's keys: the IPPool(s) to take addresses from (comma-separated: one address of each).
    #[serde(default)]
    pool_name: Option<String>,
    #[serde(default)]
    pool_type: Option<String>,
}

fn yes() -> bool {
    true
}

/// One entry of `addresses`: a CIDR and an optional gateway (whereabouts' static passthrough).
#[derive(Debug, Deserialize)]
struct StaticAddress {
    address: String,
    #[serde(default)]
    gateway: Option<String>,
}

/// The etcd store settings (`"store": {"etcd": {...}}`).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EtcdConfig {
    pub endpoints: Vec<String>,
    #[serde(default = "default_prefix")]
    pub prefix: String,
    #[serde(default)]
    pub tls: Option<EtcdTls>,
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// Addresses a node reserves at a time.
    #[serde(default = "default_block")]
    pub block_size: u32,
    /// Deadline of each etcd call, in milliseconds.
    #[serde(default = "default_timeout")]
    pub timeout_ms: u64,
}

fn default_prefix() -> String {
    "/plexus-ipam".into()
}
fn default_block() -> u32 {
    16
}
fn default_timeout() -> u64 {
    2000
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EtcdTls {
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    #[serde(default)]
    pub key_file: Option<PathBuf>,
}

/// Which store holds the allocations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreConfig {
    /// The file store in `data_dir`: named by the network's config key `key` (opened by the
    /// node policy's rule for data directories), or by a store profile of the policy (`None`:
    /// the admin's, opened as it is).
    File {
        data_dir: PathBuf,
        key: Option<String>,
    },
    Etcd(EtcdConfig),
    /// whereabouts' objects on the Kubernetes API (`"store": "kubernetes"`).
    Kubernetes(KubernetesStoreConfig),
    /// The node's blocks of nv-ipam `IPPool`s (`"poolName"`), held in node-local files.
    Pools(PoolsConfig),
}

/// The pools a network names (`poolName`, `poolType`) and where the node keeps its blocks. The
/// network chooses only the pool names (among the admin's pools); the API, the pools' namespace
/// and the directory are the node policy's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolsConfig {
    pub pools: Vec<String>,
    pub kubeconfig: PathBuf,
    pub namespace: String,
    /// The policy's first data root: the blocks' files ([`crate::pools::store::POOLS_DIR`]).
    pub data_root: PathBuf,
}

/// Pools one network may name at most (one address of each: nv-ipam's dual stack is two).
pub const MAX_POOLS: usize = 8;
/// The longest pool name: a block's directory is `<pool>@<address>`, one path component.
const MAX_POOL_NAME: usize = 200;

/// The `kubernetes` store: the API and namespace come from the node policy; a network may only
/// choose `leaderElection`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubernetesStoreConfig {
    pub kubeconfig: PathBuf,
    pub namespace: String,
    /// Take whereabouts' `whereabouts` Lease around each change, as whereabouts does.
    pub leader_election: bool,
    /// Where this node's writers take turns (the policy's first data root): the API server
    /// applies patches to one pool one at a time anyway, and a node's concurrent writers would
    /// only make it retry them.
    pub node_lock_dir: PathBuf,
    /// The most IPPools the namespace may hold before a node refuses to create another (the
    /// policy's `limits.kubernetesPools`).
    pub max_pools: usize,
}

/// The parsed IPAM configuration of one network.
#[derive(Clone, Debug)]
pub struct IpamConfig {
    /// The CNI network name (recorded with each allocation; GC and DEL stay within it).
    pub network: String,
    /// The allocation domain: `network_name`, or the shared default. An address is given at
    /// most once per domain (per range, with `enable_overlapping_ranges: false`).
    pub domain: String,
    pub overlapping: bool,
    pub ranges: Vec<IpRange>,
    /// Static addresses (`addresses`), added to every result after the allocated ones; never
    /// reserved (as in whereabouts).
    pub addresses: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Dns,
    pub store: StoreConfig,
    pub node: String,
}

fn name_ok(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && c.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        && s.len() <= 253
}

impl IpamConfig {
    pub fn from_netconf(conf: &NetConf, policy: &Policy) -> Result<IpamConfig, IpamError> {
        let ipam = conf.ipam.as_ref().ok_or_else(|| IpamError::Config("missing \"ipam\" section".into()))?;
        let keys: Keys = serde_json::from_value(Value::Object(ipam.extra.clone()))
            .map_err(|e| IpamError::Config(format!("invalid ipam config: {e}")))?;
        let mut specs = Vec::new();
        if !keys.top.range.is_empty() {
            specs.push(&keys.top);
        }
        specs.extend(keys.ip_ranges.iter());
        if let Some(names) = &keys.pool_name {
            if !specs.is_empty() || keys.store.is_some() {
                return Err(IpamError::Config(format!(
                    "poolName {names:?} with {}: a pool's subnet is its range and the pools are its store",
                    if specs.is_empty() { "store" } else { "range or ipRanges" }
                )));
            }
            return pool_config(conf, &keys, names, policy);
        }
        if specs.is_empty() {
            return Err(IpamError::Config("ipam needs \"range\" or \"ipRanges\"".into()));
        }
        let store = parse_store(keys.store.as_ref(), keys.data_dir.clone(), policy)?;
        let mut ranges = Vec::new();
        for k in specs {
            if k.range.is_empty() {
                return Err(IpamError::Config("every ipRanges entry needs \"range\"".into()));
            }
            // An entry without its own gateway inherits the top-level one of the same family.
            let is_v6 = k.range.contains(':');
            let inherited = keys.top.gateway.as_deref().filter(|g| g.contains(':') == is_v6);
            let range = IpRange::parse(&RangeSpec {
                range: &k.range,
                range_start: k.range_start.as_deref(),
                range_end: k.range_end.as_deref(),
                exclude: &k.exclude,
                gateway: k.gateway.as_deref().or(inherited),
            })?;
            ranges.push(match &store {
                // whereabouts reads offsets back as int64: the store never holds larger ones, and
                // a range with none below that is refused here, before any lock or API call.
                StoreConfig::Kubernetes(_) => range
                    .capped(
                        crate::store::kubernetes::MAX_OFFSET,
                        "the kubernetes store holds offsets below 2^63 only (whereabouts reads them as int64)",
                    )
                    .map_err(|e| IpamError::Refused(e.to_string()))?,
                _ => range,
            });
        }
        let domain = match keys.network_name.as_deref().filter(|n| !n.is_empty()) {
            Some(n) if name_ok(n) => n.to_string(),
            Some(n) => {
                return Err(IpamError::Config(format!(
                    "invalid network_name {n:?}: letters, digits, '.', '-', '_' only"
                )));
            }
            None => DEFAULT_DOMAIN.into(),
        };
        let addresses = keys.addresses.iter().map(static_address).collect::<Result<Vec<_>, _>>()?;
        let node = match keys.node_name {
            Some(n) if name_ok(&n) => n,
            Some(n) => return Err(IpamError::Config(format!("invalid nodeName {n:?}"))),
            None => host_name(),
        };
        Ok(IpamConfig {
            network: conf.name.clone(),
            domain,
            overlapping: keys.enable_overlapping_ranges,
            ranges,
            addresses,
            routes: keys.routes,
            dns: keys.dns.unwrap_or_default(),
            store,
            node,
        })
    }
}

fn static_address(a: &StaticAddress) -> Result<IpConfig, IpamError> {
    let bad = |why: &str| IpamError::Config(format!("invalid addresses entry {:?}: {why}", a.address));
    if !a.address.contains('/') {
        return Err(bad("a CIDR such as 198.18.0.5/24 is required"));
    }
    let address = crate::range::parse_cidr(&a.address).ok_or_else(|| bad("not a CIDR"))?;
    let gateway = match &a.gateway {
        Some(g) => Some(crate::range::parse_addr(g).ok_or_else(|| {
            IpamError::Config(format!("invalid addresses gateway {g:?} for {:?}: not an IP address", a.address))
        })?),
        None => None,
    };
    Ok(IpConfig { interface: None, address, gateway })
}

impl IpamConfig {
    /// Refuse a range the node policy's `allow.ranges` does not give pods of `namespace` (code 7,
    /// before any store is opened): shared pools are the admin's to hand out.
    pub fn check_ranges_allowed(&self, policy: &Policy, namespace: Option<&str>) -> Result<(), plexus_cni::Error> {
        for r in &self.ranges {
            policy.check_range("range", r.network, namespace)?;
        }
        Ok(())
    }

    /// The result of an ADD: one address per range (with the range's gateway), then the static
    /// `addresses`, routes and DNS. `CNI_ARGS` `GATEWAY=` entries (whereabouts) become the gateway
    /// of every address whose network contains them.
    pub fn result(&self, allocated: &[IpAddr], cni_gateways: &[IpAddr]) -> CniResult {
        let mut ips: Vec<IpConfig> = allocated
            .iter()
            .zip(&self.ranges)
            .map(|(ip, r)| IpConfig { interface: None, address: r.with_prefix(*ip), gateway: r.gateway })
            .collect();
        ips.extend(self.addresses.iter().cloned());
        for ip in &mut ips {
            if let Some(gw) = cni_gateways.iter().find(|g| ip.address.contains(**g)) {
                ip.gateway = Some(*gw);
            }
        }
        CniResult { interfaces: Vec::new(), ips, routes: self.routes.clone(), dns: self.dns.clone() }
    }
}

/// The file store a config names: `key`'s directory must lie beneath the policy's `dataRoots`.
fn tenant_file_store(key: &str, data_dir: Option<PathBuf>, policy: &Policy) -> Result<StoreConfig, IpamError> {
    let (key, data_dir) = match data_dir {
        Some(d) => (key, d),
        None => ("dataDir", PathBuf::from(DEFAULT_DATA_DIR)),
    };
    policy.data_root(key, &data_dir).map_err(|e| IpamError::Refused(e.to_string()))?;
    Ok(StoreConfig::File { data_dir, key: Some(key.to_string()) })
}

/// A store profile of the node policy (`stores.<name>`): trusted, the admin wrote it.
fn profile_store(name: &str, v: &Value) -> Result<StoreConfig, IpamError> {
    let bad = |why: String| IpamError::Config(format!("node policy stores.{name}: {why}"));
    let Some((kind, body)) = v.as_object().filter(|m| m.len() == 1).and_then(|m| m.iter().next()) else {
        return Err(bad("must be {\"etcd\": {...}} or {\"file\": {\"dataDir\": ...}}".into()));
    };
    match kind.as_str() {
        "etcd" => {
            let etcd: EtcdConfig = serde_json::from_value(body.clone()).map_err(|e| bad(format!("etcd: {e}")))?;
            if etcd.endpoints.is_empty() {
                return Err(bad("etcd.endpoints is empty".into()));
            }
            if etcd.block_size == 0 {
                return Err(bad("etcd.blockSize must be at least 1".into()));
            }
            Ok(StoreConfig::Etcd(etcd))
        }
        "file" => {
            let dir = body.get("dataDir").and_then(Value::as_str).map(PathBuf::from);
            let dir = dir
                .filter(|d| plexus_node::files::is_clean_absolute(d))
                .ok_or_else(|| bad("file.dataDir must be an absolute path without . or ..".into()))?;
            Ok(StoreConfig::File { data_dir: dir, key: None })
        }
        other => Err(bad(format!("unknown store kind {other:?}: use \"etcd\" or \"file\""))),
    }
}

fn parse_store(v: Option<&Value>, data_dir: Option<PathBuf>, policy: &Policy) -> Result<StoreConfig, IpamError> {
    match v {
        None => tenant_file_store("dataDir", data_dir, policy),
        Some(Value::String(s)) if s == "file" => tenant_file_store("dataDir", data_dir, policy),
        Some(Value::Object(m)) if m.len() == 1 && m.contains_key("file") => {
            let dir = m["file"].get("dataDir").and_then(Value::as_str).map(PathBuf::from);
            match dir {
                Some(d) => tenant_file_store("store.file.dataDir", Some(d), policy),
                None => tenant_file_store("dataDir", data_dir, policy),
            }
        }
        Some(Value::String(s)) if s == "kubernetes" => kubernetes_store(&Value::Object(Default::default()), policy),
        Some(Value::Object(m)) if m.len() == 1 && m.contains_key("kubernetes") => {
            kubernetes_store(&m["kubernetes"], policy)
        }
        Some(Value::Object(m)) if m.len() == 1 && m.contains_key("etcd") => Err(IpamError::Refused(format!(
            "store.etcd in a network config is refused: etcd endpoints and credentials come from the node policy; \
             define a profile under \"stores\" in the policy ({}) and select it with \"store\": \"<name>\"",
            policy.source
        ))),
        Some(Value::String(name)) => match policy.store(name) {
            Some(profile) => profile_store(name, profile),
            None => Err(IpamError::Refused(format!(
                "store {name:?} is neither \"file\" nor a store profile of the node policy ({}): profiles {:?}",
                policy.source,
                policy.stores.keys().collect::<Vec<_>>()
            ))),
        },
        Some(other) => Err(IpamError::Config(format!(
            "unknown store {other}: use \"file\", {{\"file\": {{\"dataDir\": ...}}}} or the name of a store profile of the node policy"
        ))),
    }
}

/// The `kubernetes` store with a network's options (`leaderElection` only): the API credentials
/// and the namespace are the node policy's `kubernetes`.
fn kubernetes_store(options: &Value, policy: &Policy) -> Result<StoreConfig, IpamError> {
    let Some(k) = &policy.kubernetes else {
        return Err(IpamError::Refused(format!(
            "store \"kubernetes\" needs the node policy's \"kubernetes\" (kubeconfig, namespace), which {} does not set",
            policy.source
        )));
    };
    let Some(options) = options.as_object() else {
        return Err(IpamError::Config(format!("store.kubernetes must be an object, not {options}")));
    };
    let mut leader_election = false;
    for (key, value) in options {
        match (key.as_str(), value) {
            ("leaderElection", Value::Bool(b)) => leader_election = *b,
            ("leaderElection", other) => {
                return Err(IpamError::Config(format!("store.kubernetes.leaderElection {other} is not a boolean")));
            }
            ("kubeconfig" | "namespace", _) => {
                return Err(IpamError::Refused(format!(
                    "store.kubernetes.{key} in a network config is refused: the API and namespace come from the node \
                     policy's \"kubernetes\" ({})",
                    policy.source
                )));
            }
            (other, _) => {
                return Err(IpamError::Config(format!(
                    "unknown key store.kubernetes.{other}: a network may set only leaderElection"
                )));
            }
        }
    }
    Ok(StoreConfig::Kubernetes(KubernetesStoreConfig {
        kubeconfig: k.kubeconfig.clone(),
        namespace: k.namespace.clone(),
        leader_election,
        node_lock_dir: policy.data_roots.first().cloned().unwrap_or_else(|| DEFAULT_DATA_DIR.into()),
        max_pools: policy.limits.kubernetes_pools,
    }))
}

/// A network whose addresses come from nv-ipam pools (`poolName`).
fn pool_config(conf: &NetConf, keys: &Keys, names: &str, policy: &Policy) -> Result<IpamConfig, IpamError> {
    match keys.pool_type.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("ippool") => {}
        Some("cidrpool") => {
            return Err(IpamError::Refused(
                "poolType \"cidrpool\": this plexus-ipam reads nv-ipam IPPools only; CIDRPools are not read yet".into(),
            ));
        }
        Some(other) => {
            return Err(IpamError::Config(format!("invalid poolType {other:?}: \"ippool\" or \"cidrpool\"")));
        }
    }
    let pools: Vec<String> = names.split(',').map(|n| n.trim().to_string()).collect();
    if pools.len() > MAX_POOLS {
        return Err(IpamError::Config(format!("poolName {names:?}: at most {MAX_POOLS} pools")));
    }
    for p in &pools {
        if !pool_name_ok(p) {
            return Err(IpamError::Config(format!(
                "invalid poolName {p:?}: a Kubernetes object name (lowercase letters, digits, '-', '.') of at most \
                 {MAX_POOL_NAME} characters"
            )));
        }
    }
    let Some(k) = &policy.kubernetes else {
        return Err(IpamError::Refused(format!(
            "poolName needs the node policy's \"kubernetes\" (kubeconfig, poolNamespace), which {} does not set",
            policy.source
        )));
    };
    let node = match &keys.node_name {
        Some(n) if name_ok(n) => n.clone(),
        Some(n) => return Err(IpamError::Config(format!("invalid nodeName {n:?}"))),
        None => host_name(),
    };
    Ok(IpamConfig {
        network: conf.name.clone(),
        domain: DEFAULT_DOMAIN.into(),
        overlapping: true,
        ranges: Vec::new(),
        addresses: keys.addresses.iter().map(static_address).collect::<Result<Vec<_>, _>>()?,
        routes: keys.routes.clone(),
        dns: keys.dns.clone().unwrap_or_default(),
        store: StoreConfig::Pools(PoolsConfig {
            pools,
            kubeconfig: k.kubeconfig.clone(),
            namespace: k.pool_namespace.clone().unwrap_or_else(|| k.namespace.clone()),
            data_root: policy.data_roots.first().cloned().unwrap_or_else(|| DEFAULT_DATA_DIR.into()),
        }),
        node,
    })
}

/// A DNS-1123 subdomain no longer than a block's directory name allows.
fn pool_name_ok(name: &str) -> bool {
    name.len() <= MAX_POOL_NAME
        && !name.is_empty()
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// This node's name: the kernel's host name (nodes are named after their hosts).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conf(ipam: Value) -> Result<IpamConfig, IpamError> {
        let nc: NetConf =
            serde_json::from_value(json!({"cniVersion": "1.1.0", "name": "rail0", "ipam": ipam})).unwrap();
        IpamConfig::from_netconf(&nc, &Policy::default())
    }

    #[test]
    fn whereabouts_keys_build_ranges_for_dual_stack() {
        let c = conf(json!({"type": "plexus-ipam", "range": "198.18.0.0/24", "gateway": "198.18.0.1",
            "ipRanges": [{"range": "2001:db8::/64", "exclude": ["2001:db8::/120"]}], "nodeName": "n1"}))
        .unwrap();
        assert_eq!(c.ranges.len(), 2);
        assert_eq!(c.ranges[0].gateway.unwrap().to_string(), "198.18.0.1");
        assert_eq!(c.ranges[1].gateway, None, "an IPv4 gateway is not an IPv6 range's");
        assert_eq!((c.domain.as_str(), c.overlapping, c.node.as_str()), ("default", true, "n1"));
        assert_eq!(c.store, StoreConfig::File { data_dir: DEFAULT_DATA_DIR.into(), key: Some("dataDir".into()) });
    }

    #[test]
    fn stores_parse_and_unknown_ones_are_refused_by_name() {
        let c = conf(json!({"range": "198.18.0.0/24", "store": {"file": {"dataDir": "/var/lib/cni/plexus-ipam/x"}}}))
            .unwrap();
        assert_eq!(
            c.store,
            StoreConfig::File { data_dir: "/var/lib/cni/plexus-ipam/x".into(), key: Some("store.file.dataDir".into()) }
        );
        let e = conf(json!({"range": "198.18.0.0/24", "store": "redis"})).unwrap_err();
        assert!(e.to_string().contains("store \"redis\" is neither \"file\" nor a store profile"), "{e}");
        let e = conf(json!({"range": "198.18.0.0/24", "network_name": "../x"})).unwrap_err();
        assert!(e.to_string().contains("invalid network_name \"../x\""), "{e}");
        assert!(conf(json!({"type": "plexus-ipam"})).is_err());
    }

    #[test]
    fn a_network_config_never_chooses_etcd_endpoints_or_credentials() {
        let e = conf(json!({"range": "198.18.0.0/24", "store": {"etcd": {"endpoints": ["http://198.18.9.9:2379"],
            "passwordFile": "/var/lib/kubelet/pki/kubelet-client-current.pem", "username": "x"}}}))
        .unwrap_err();
        assert!(e.to_string().starts_with("store.etcd in a network config is refused"), "{e}");
        assert_eq!(plexus_cni::Error::from(e).code, plexus_cni::code::INVALID_NETWORK_CONFIG);
    }

    #[test]
    fn store_profiles_come_from_the_policy() {
        let policy = Policy::parse(
            json!({"stores": {"fabric": {"etcd": {"endpoints": ["http://127.0.0.1:2379"], "blockSize": 8}},
                              "local": {"file": {"dataDir": "/srv/ipam"}}, "broken": {"etcd": {"endpoints": []}}}})
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        let with = |store: &str| {
            let nc: NetConf = serde_json::from_value(
                json!({"name": "n", "ipam": {"type": "plexus-ipam", "range": "198.18.0.0/24", "store": store}}),
            )
            .unwrap();
            IpamConfig::from_netconf(&nc, &policy)
        };
        assert!(matches!(with("fabric").unwrap().store, StoreConfig::Etcd(ref e) if e.block_size == 8));
        assert_eq!(with("local").unwrap().store, StoreConfig::File { data_dir: "/srv/ipam".into(), key: None });
        assert!(with("broken").unwrap_err().to_string().contains("stores.broken: etcd.endpoints is empty"));
    }

    #[test]
    fn a_data_dir_outside_the_policy_roots_is_refused_naming_key_and_value() {
        let e = conf(json!({"range": "198.18.0.0/24", "dataDir": "/etc"})).unwrap_err();
        assert!(e.to_string().starts_with("dataDir \"/etc\" is not beneath the node policy's dataRoots"), "{e}");
        let e = conf(json!({"range": "198.18.0.0/24", "store": {"file": {"dataDir": "/tmp/x"}}})).unwrap_err();
        assert!(e.to_string().starts_with("store.file.dataDir \"/tmp/x\""), "{e}");
    }

    #[test]
    fn a_network_names_pools_and_the_policy_says_where_they_are_and_where_the_blocks_live() {
        let with = |ipam: Value, k8s: bool| {
            let mut policy = Policy { data_roots: vec!["/var/lib/plexus".into()], ..Default::default() };
            if k8s {
                policy.kubernetes = Some(plexus_node::policy::KubernetesPolicy {
                    kubeconfig: "/etc/cni/net.d/plexus.d/plexus.kubeconfig".into(),
                    namespace: "kube-system".into(),
                    pool_namespace: Some("nvidia-network-operator".into()),
                });
            }
            let nc: NetConf =
                serde_json::from_value(json!({"cniVersion": "1.1.0", "name": "rail0", "ipam": ipam})).unwrap();
            IpamConfig::from_netconf(&nc, &policy)
        };
        let cfg =
            with(json!({"type": "plexus-ipam", "poolName": "rail0-v4, rail0-v6", "poolType": "IPPool"}), true).unwrap();
        assert_eq!(
            cfg.store,
            StoreConfig::Pools(PoolsConfig {
                pools: vec!["rail0-v4".into(), "rail0-v6".into()],
                kubeconfig: "/etc/cni/net.d/plexus.d/plexus.kubeconfig".into(),
                namespace: "nvidia-network-operator".into(),
                data_root: "/var/lib/plexus".into(),
            })
        );
        assert!(cfg.ranges.is_empty());
        let err = |ipam: Value, k8s: bool| with(ipam, k8s).unwrap_err();
        let e = err(json!({"poolName": "rail0", "range": "198.18.0.0/24"}), true);
        assert!(matches!(e, IpamError::Config(_)) && e.to_string().contains("poolName \"rail0\" with range"), "{e}");
        let e = err(json!({"poolName": "rail0", "store": "kubernetes"}), true);
        assert!(e.to_string().contains("with store"), "{e}");
        let e = err(json!({"poolName": "rail0", "poolType": "cidrpool"}), true);
        assert!(matches!(e, IpamError::Refused(_)) && e.to_string().contains("CIDRPools are not read yet"), "{e}");
        let e = err(json!({"poolName": "rail0", "poolType": "subnet"}), true);
        assert!(e.to_string().contains("invalid poolType \"subnet\""), "{e}");
        for bad in ["../etc", "Rail0", "a@b", "", &"a".repeat(201)] {
            let e = err(json!({"poolName": bad}), true);
            assert!(e.to_string().contains("invalid poolName"), "{bad}: {e}");
        }
        let e = err(json!({"poolName": (0..9).map(|i| format!("p{i}")).collect::<Vec<_>>().join(",")}), true);
        assert!(e.to_string().contains("at most 8 pools"), "{e}");
        let e = err(json!({"poolName": "rail0"}), false);
        assert!(matches!(e, IpamError::Refused(_)) && e.to_string().contains("node policy's \"kubernetes\""), "{e}");
    }

    #[test]
    fn the_kubernetes_store_takes_the_api_from_the_policy_and_only_leader_election_from_the_network() {
        let with_policy = |ipam: Value| {
            let mut policy = Policy::default();
            policy.kubernetes = Some(plexus_node::policy::KubernetesPolicy {
                kubeconfig: "/etc/cni/net.d/plexus.d/plexus.kubeconfig".into(),
                namespace: "kube-system".into(),
                pool_namespace: None,
            });
            let nc: NetConf =
                serde_json::from_value(json!({"cniVersion": "1.1.0", "name": "rail0", "ipam": ipam})).unwrap();
            IpamConfig::from_netconf(&nc, &policy)
        };
        let c = with_policy(json!({"range": "198.18.0.0/24", "store": "kubernetes"})).unwrap();
        assert_eq!(
            c.store,
            StoreConfig::Kubernetes(KubernetesStoreConfig {
                kubeconfig: "/etc/cni/net.d/plexus.d/plexus.kubeconfig".into(),
                namespace: "kube-system".into(),
                leader_election: false,
                node_lock_dir: DEFAULT_DATA_DIR.into(),
                max_pools: 256,
            })
        );
        let c =
            with_policy(json!({"range": "198.18.0.0/24", "store": {"kubernetes": {"leaderElection": true}}})).unwrap();
        assert!(matches!(c.store, StoreConfig::Kubernetes(KubernetesStoreConfig { leader_election: true, .. })));
        let e = with_policy(
            json!({"range": "198.18.0.0/24", "store": {"kubernetes": {"kubeconfig": "/root/.kube/config"}}}),
        )
        .unwrap_err();
        assert!(matches!(e, IpamError::Refused(_)));
        assert!(e.to_string().starts_with("store.kubernetes.kubeconfig in a network config is refused"), "{e}");
        let e = with_policy(json!({"range": "198.18.0.0/24", "store": {"kubernetes": {"leaderElection": "yes"}}}))
            .unwrap_err();
        assert_eq!(e.to_string(), "store.kubernetes.leaderElection \"yes\" is not a boolean");
        let e = conf(json!({"range": "198.18.0.0/24", "store": "kubernetes"})).unwrap_err();
        assert!(e.to_string().starts_with("store \"kubernetes\" needs the node policy's \"kubernetes\""), "{e}");
    }
}
