//! Stores hold the allocations. One trait, so the node-local file store, the etcd store and a
//! Kubernetes store later answer the plugin the same way.

#[cfg(feature = "etcd")]
pub mod etcd;
pub mod file;
pub mod kubernetes;

use std::net::IpAddr;
use std::path::Path;

use plexus_cni::Deadline;
use plexus_node::Policy;
use plexus_node::datadir::{DataDir, Kind};
use serde::{Deserialize, Serialize};

use crate::config::{IpamConfig, StoreConfig};
use crate::error::IpamError;
use crate::range::IpRange;

/// What opening a store takes besides the network's config: the node policy (where a network's
/// data directory may be), the pod's namespace (whose a tenant's directory is) and the request's
/// deadline (no lock or API call is waited for past it).
#[derive(Clone, Copy, Debug)]
pub struct Context<'a> {
    pub policy: &'a Policy,
    pub namespace: Option<&'a str>,
    pub deadline: Deadline,
}

impl<'a> Context<'a> {
    /// A plugin invocation's.
    pub fn of(req: &'a plexus_plugin::Request) -> Context<'a> {
        Context { policy: &req.policy, namespace: req.pod_namespace(), deadline: req.env.deadline }
    }
}

/// A refusal of the policy as the store's error: code 7 stays a refusal (DEL finds nothing held
/// there), code 11 a retry.
pub(crate) fn refusal(e: plexus_cni::Error) -> IpamError {
    let text = if e.details.is_empty() { e.msg.clone() } else { format!("{} ({})", e.msg, e.details) };
    match e.code {
        plexus_cni::code::INVALID_NETWORK_CONFIG => IpamError::Refused(text),
        plexus_cni::code::TRY_AGAIN_LATER => IpamError::Unavailable(text),
        _ => IpamError::Store(text),
    }
}

/// The file store's directory: a network's (by the policy's rule) or a store profile's.
fn data_dir(data_dir: &Path, key: Option<&str>, cx: &Context<'_>, create: bool) -> Result<Option<DataDir>, IpamError> {
    match key {
        Some(key) => {
            cx.policy.data_dir(key, data_dir, Kind::IpamFileStore, cx.namespace, create, cx.deadline).map_err(refusal)
        }
        None => DataDir::admin(data_dir, create)
            .map_err(|e| IpamError::Store(format!("open store {}: {e}", data_dir.display()))),
    }
}

/// The store a network's configuration names (the plugin and plexusctl open it alike).
pub fn open<'a>(cfg: &IpamConfig, cx: &Context<'a>) -> Result<Box<dyn Store + 'a>, IpamError> {
    match &cfg.store {
        StoreConfig::File { data_dir: dir, key } => {
            let data = data_dir(dir, key.as_deref(), cx, true)?.expect("created");
            Ok(Box::new(file::FileStore::open(data, &cfg.domain, cx.deadline)?))
        }
        _ => connect(cfg, cx),
    }
}

/// The store to release from: `None` when a file store was never created (nothing is held; a
/// read-only or missing data directory is then no error).
pub fn open_for_release<'a>(cfg: &IpamConfig, cx: &Context<'a>) -> Result<Option<Box<dyn Store + 'a>>, IpamError> {
    match &cfg.store {
        StoreConfig::File { data_dir: dir, key } => Ok(match data_dir(dir, key.as_deref(), cx, false)? {
            Some(data) => Some(Box::new(file::FileStore::open(data, &cfg.domain, cx.deadline)?)),
            None => None,
        }),
        _ => connect(cfg, cx).map(Some),
    }
}

/// A store on a server: etcd's or the API server's. Each is a feature of this crate (both on by
/// default; the fuzz targets build without them, they parse what the stores read back).
fn connect<'a>(cfg: &IpamConfig, cx: &Context<'a>) -> Result<Box<dyn Store + 'a>, IpamError> {
    let _ = cx;
    match &cfg.store {
        #[cfg(feature = "kubernetes")]
        StoreConfig::Pools(p) => Ok(Box::new(crate::pools::store::PoolStore::open(p, &cfg.node, &cfg.network, *cx))),
        #[cfg(feature = "etcd")]
        StoreConfig::Etcd(etcd) => Ok(Box::new(etcd::EtcdStore::connect(etcd, &cfg.domain, cx.deadline)?)),
        #[cfg(feature = "kubernetes")]
        StoreConfig::Kubernetes(k) => {
            Ok(Box::new(kubernetes::KubernetesStore::connect(k, &cfg.domain, &cfg.network, &cfg.ranges, cx.deadline)?))
        }
        other => Err(IpamError::Refused(format!(
            "ipam.store: this build of plexus-ipam has no {} store",
            match other {
                StoreConfig::File { .. } => "file",
                StoreConfig::Etcd(_) => "etcd",
                StoreConfig::Kubernetes(_) => "kubernetes",
                StoreConfig::Pools(_) => "pool (poolName)",
            }
        ))),
    }
}

/// A number that sets concurrent requests apart, to spread their choices and pauses: the calling
/// thread's id (plexus-daemon serves many requests in one process, so not the pid).
#[cfg(any(feature = "etcd", feature = "kubernetes"))]
pub(crate) fn spread() -> u32 {
    nix::unistd::gettid().as_raw().unsigned_abs()
}

/// Who holds an allocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
    /// `namespace/name` of the pod, when the runtime said (K8S_POD_NAMESPACE/K8S_POD_NAME).
    #[serde(rename = "podRef", default, skip_serializing_if = "Option::is_none")]
    pub pod_ref: Option<String>,
    pub node: String,
    /// The CNI network name the allocation was made for.
    pub network: String,
}

impl Owner {
    /// The attachment's key (`<containerID>=<ifname>`), as every store files it.
    pub fn key(&self) -> String {
        plexus_cni::env::attachment_key(&self.container_id, &self.ifname)
    }

    /// The pod's interface key (`<namespace>=<name>=<ifname>`), by which an ADD of the pod's
    /// new sandbox finds what its old one holds; None when the runtime named no pod.
    pub fn pod_key(&self) -> Option<String> {
        let (ns, name) = self.pod_ref.as_deref()?.split_once('/')?;
        Some(format!("{ns}={name}={}", self.ifname))
    }
}

/// A range key (`198.18.0.0/24`, or with bounds) as one path component or key segment.
pub(crate) fn key_safe(range: &str) -> String {
    range.replace('/', "_")
}

impl Owner {
    pub fn same_attachment(&self, container_id: &str, ifname: &str) -> bool {
        self.container_id == container_id && self.ifname == ifname
    }
}

/// One address held by one attachment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    pub ip: IpAddr,
    /// The key of the range it came from ([`IpRange::key`]).
    pub range: String,
    #[serde(flatten)]
    pub owner: Owner,
}

/// What an attachment holds, as both stores record it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Record {
    /// The version of its format (`plexus_node::format::IPAM_RECORD`; none in records written
    /// before formats carried one: 1).
    #[serde(default = "plexus_node::format::first")]
    pub(crate) version: u32,
    pub(crate) owner: Owner,
    pub(crate) ips: Vec<Held>,
}

impl Record {
    pub(crate) fn new(owner: Owner, ips: Vec<Held>) -> Record {
        Record { version: plexus_node::format::IPAM_RECORD.current, owner, ips }
    }

    /// Refuse the record `bytes` at `key` when a later plexus wrote it (code 105), before it is
    /// read as this build's record; what does not parse at all is each store's to judge.
    pub(crate) fn refuse_later_format(bytes: &[u8], key: &str) -> Result<(), IpamError> {
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) else { return Ok(()) };
        plexus_node::format::IPAM_RECORD.check_json(key, &value).map_err(IpamError::Format)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Held {
    pub(crate) ip: IpAddr,
    pub(crate) range: String,
}

/// An ADD: one address from each range (`requested[i]` = a specific address for range `i`).
#[derive(Clone, Debug)]
pub struct AllocRequest<'a> {
    pub owner: Owner,
    pub ranges: &'a [IpRange],
    pub requested: Vec<Option<IpAddr>>,
    /// Whether the address is unique across every range of the domain (whereabouts'
    /// `enable_overlapping_ranges`, default) or only within its range.
    pub overlapping: bool,
}

pub trait Store {
    /// One address per range for the owner; the same ones again when this attachment (or, after
    /// a sandbox re-creation, this pod's interface) already holds them.
    fn allocate(&self, req: &AllocRequest<'_>) -> Result<Vec<IpAddr>, IpamError>;
    /// Release what (container ID, ifname) holds; nothing held is success.
    fn release(&self, container_id: &str, ifname: &str) -> Result<Vec<Allocation>, IpamError>;
    /// What (container ID, ifname) holds.
    fn holdings(&self, container_id: &str, ifname: &str) -> Result<Vec<Allocation>, IpamError>;
    /// Every allocation of the domain.
    fn list(&self) -> Result<Vec<Allocation>, IpamError>;

    /// The node an allocation belongs to, for GC: the one recorded with it, or — for stores
    /// whose records name no node (whereabouts' objects) — the node of its pod; `None` when its
    /// pod is gone (stale wherever GC runs).
    fn node_of(&self, a: &Allocation) -> Result<Option<String>, IpamError> {
        Ok(Some(a.owner.node.clone()))
    }
}

/// The order in which next-fit tries offsets: after the cursor to the end, then from the start
/// up to the cursor, stepping over excluded spans. A just-released address comes round last.
pub struct Candidates<'a> {
    range: &'a IpRange,
    /// The two spans still to walk, in order (inclusive bounds).
    spans: [Option<(u128, u128)>; 2],
    span: usize,
    next: Option<u128>,
}

impl<'a> Candidates<'a> {
    /// Candidates after `cursor` (the offset handed out last), or from the start.
    pub fn after(range: &'a IpRange, cursor: Option<u128>) -> Candidates<'a> {
        let start = match cursor {
            Some(c) if c >= range.first && c < range.last => c + 1,
            _ => range.first,
        };
        let head = (start > range.first).then(|| (range.first, start - 1));
        let spans = [Some((start, range.last)), head];
        Candidates { range, spans, span: 0, next: Some(start) }
    }
}

impl Iterator for Candidates<'_> {
    type Item = u128;

    fn next(&mut self) -> Option<u128> {
        while self.span < 2 {
            let Some((_, hi)) = self.spans[self.span] else {
                self.span += 1;
                continue;
            };
            match self.next.map(|n| self.range.skip_excluded(n)) {
                Some(o) if o <= hi => {
                    self.next = o.checked_add(1);
                    return Some(o);
                }
                _ => {
                    self.span += 1;
                    self.next = self.spans.get(self.span).copied().flatten().map(|(lo, _)| lo);
                }
            }
        }
        None
    }
}

/// Entry points for the fuzz targets (`fuzz/`): the store records as read back after a crash or
/// from another writer. Built only with the `fuzzing` feature.
#[cfg(feature = "fuzzing")]
pub mod fuzzing {
    use super::*;

    /// Every way a store reads a record or an allocation back; a record that parses prints and
    /// parses to the same.
    pub fn read_records(bytes: &[u8], range: &IpRange) {
        if let Ok(record) = serde_json::from_slice::<Record>(bytes) {
            let again: Record = serde_json::from_slice(&serde_json::to_vec(&record).expect("prints")).expect("parses");
            assert_eq!(again.owner, record.owner);
            assert_eq!(again.ips.len(), record.ips.len());
        }
        if let Ok(a) = serde_json::from_slice::<Allocation>(bytes) {
            let again: Allocation = serde_json::from_slice(&serde_json::to_vec(&a).expect("prints")).expect("parses");
            assert_eq!(again, a);
        }
        if let Ok(obj) = serde_json::from_slice::<serde_json::Value>(bytes) {
            kubernetes::read_back(&obj, range);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::range::RangeSpec;

    fn range(r: &str, exclude: &[String]) -> IpRange {
        IpRange::parse(&RangeSpec { range: r, exclude, ..Default::default() }).unwrap()
    }

    #[test]
    fn candidates_visit_every_usable_offset_once_starting_after_the_cursor() {
        let r = range("198.18.0.0/29", &["198.18.0.3".into()]); // usable 1..=6 minus 3
        let all: Vec<u128> = Candidates::after(&r, None).collect();
        assert_eq!(all, vec![1, 2, 4, 5, 6]);
        let from4: Vec<u128> = Candidates::after(&r, Some(4)).collect();
        assert_eq!(from4, vec![5, 6, 1, 2, 4]);
        let from6: Vec<u128> = Candidates::after(&r, Some(6)).collect();
        assert_eq!(from6, vec![1, 2, 4, 5, 6]);
        let from2: Vec<u128> = Candidates::after(&r, Some(2)).collect();
        assert_eq!(from2, vec![4, 5, 6, 1, 2]);
    }
}
