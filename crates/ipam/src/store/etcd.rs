//! The etcd store: cluster-wide pools without any global lock.
//!
//! ```text
//! <prefix>/<domain>/ips/<v4|v6>/<hex address>       one key per allocated address (JSON Allocation)
//! <prefix>/<domain>/attachments/<cid>=<ifname>      the attachment's record (what it holds)
//! <prefix>/<domain>/pods/<ns>=<pod>=<ifname>        record name of a pod's interface
//! <prefix>/<domain>/blocks/<range>/<index>          a node's reserved block of `blockSize` addresses
//! <prefix>/<domain>/cursors/<node>/<range>          the node's next-fit cursor (a hint)
//! ```
//!
//! An address is held only through its key, created in a transaction that also writes the record
//! and compares that every new address key is absent: two nodes can never hold one address, and a
//! failed transaction writes nothing. Nodes allocate inside blocks they reserved (also by a
//! create-if-absent transaction), so concurrent nodes rarely meet; when no block is left they take
//! any free address. Address keys are fixed-width hex, so a block is one ordered range read.
//! Every call has a deadline; a store that does not answer is `Unavailable` (CNI code 11).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, TlsOptions, Txn, TxnOp,
};

use super::{AllocRequest, Allocation, Candidates, Held, Owner, Record, Store, key_safe};
use crate::config::EtcdConfig;
use crate::error::{Holder, IpamError};
use crate::range::{IpRange, to_u128};
use plexus_cni::env::attachment_key;

/// Transactions retried after a conflict before giving up.
const MAX_ATTEMPTS: usize = 64;

pub struct EtcdStore {
    rt: tokio::runtime::Runtime,
    client: Client,
    root: String,
    timeout: Duration,
    block_size: u128,
    /// The request's deadline: every walk over a range's blocks or addresses ends there.
    request: plexus_cni::Deadline,
}

fn unavailable(e: impl std::fmt::Display) -> IpamError {
    IpamError::Unavailable(e.to_string())
}

impl EtcdStore {
    pub fn connect(cfg: &EtcdConfig, domain: &str, request: plexus_cni::Deadline) -> Result<EtcdStore, IpamError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| IpamError::Store(format!("start runtime: {e}")))?;
        let timeout = Duration::from_millis(cfg.timeout_ms);
        let mut opts = ConnectOptions::new().with_timeout(timeout).with_connect_timeout(timeout);
        if let Some(user) = &cfg.username {
            let file = cfg
                .password_file
                .as_ref()
                .ok_or_else(|| IpamError::Config("store.etcd.username needs store.etcd.passwordFile".into()))?;
            let password = std::fs::read_to_string(file)
                .map_err(|e| IpamError::Config(format!("store.etcd.passwordFile {}: {e}", file.display())))?;
            opts = opts.with_user(user.clone(), password.trim_end_matches('\n').to_string());
        }
        if let Some(tls) = &cfg.tls {
            let read = |key: &str, p: &std::path::Path| {
                std::fs::read(p).map_err(|e| IpamError::Config(format!("store.etcd.tls.{key} {}: {e}", p.display())))
            };
            let mut t = TlsOptions::new();
            if let Some(ca) = &tls.ca_file {
                t = t.ca_certificate(Certificate::from_pem(read("caFile", ca)?));
            }
            match (&tls.cert_file, &tls.key_file) {
                (Some(c), Some(k)) => t = t.identity(Identity::from_pem(read("certFile", c)?, read("keyFile", k)?)),
                (None, None) => {}
                _ => return Err(IpamError::Config("store.etcd.tls needs both certFile and keyFile".into())),
            }
            opts = opts.with_tls(t);
        }
        let endpoints = cfg.endpoints.clone();
        let client = rt
            .block_on(async { tokio::time::timeout(timeout, Client::connect(endpoints, Some(opts))).await })
            .map_err(|_| unavailable(format!("connecting to etcd {:?} timed out after {timeout:?}", cfg.endpoints)))?
            .map_err(|e| unavailable(format!("connecting to etcd {:?}: {e}", cfg.endpoints)))?;
        let root = format!("{}/{domain}", cfg.prefix.trim_end_matches('/'));
        Ok(EtcdStore { rt, client, root, timeout, block_size: u128::from(cfg.block_size), request })
    }

    fn ip_key(&self, ip: IpAddr, range: &str, overlapping: bool) -> String {
        let hex = match ip {
            IpAddr::V4(v4) => format!("v4/{:08x}", u32::from(v4)),
            IpAddr::V6(v6) => format!("v6/{:032x}", u128::from(v6)),
        };
        if overlapping {
            format!("{}/ips/{hex}", self.root)
        } else {
            format!("{}/ips/{}/{hex}", self.root, key_safe(range))
        }
    }

    fn record_key(&self, cid: &str, ifname: &str) -> String {
        format!("{}/attachments/{}", self.root, attachment_key(cid, ifname))
    }

    fn pod_key(&self, owner: &Owner) -> Option<String> {
        Some(format!("{}/pods/{}", self.root, owner.pod_key()?))
    }

    fn block_prefix(&self, range: &IpRange) -> String {
        format!("{}/blocks/{}/", self.root, key_safe(&range.key()))
    }

    fn cursor_key(&self, node: &str, range: &IpRange) -> String {
        format!("{}/cursors/{node}/{}", self.root, key_safe(&range.key()))
    }

    async fn call<T>(
        &self,
        what: &str,
        fut: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, IpamError> {
        plexus_node::fault::at(plexus_node::fault::Point::Etcd)
            .map_err(|e| unavailable(format!("etcd {what}: {e}")))?;
        match tokio::time::timeout(self.timeout, fut).await {
            Err(_) => Err(unavailable(format!("etcd {what}: no answer within {:?}", self.timeout))),
            Ok(Err(e)) => Err(unavailable(format!("etcd {what}: {e}"))),
            Ok(Ok(v)) => Ok(v),
        }
    }

    /// (value, mod revision) of `key`; revision 0 when absent.
    async fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, i64), IpamError> {
        let mut kv = self.client.kv_client();
        let resp = self.call("get", kv.get(key, None)).await?;
        Ok(match resp.kvs().first() {
            Some(kv) => (Some(kv.value().to_vec()), kv.mod_revision()),
            None => (None, 0),
        })
    }

    async fn get_range(&self, from: &str, to: &str) -> Result<Vec<(String, Vec<u8>)>, IpamError> {
        let mut kv = self.client.kv_client();
        let resp = self.call("range", kv.get(from, Some(GetOptions::new().with_range(to)))).await?;
        Ok(resp.kvs().iter().map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.value().to_vec())).collect())
    }

    async fn get_prefix(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, IpamError> {
        let mut kv = self.client.kv_client();
        let resp = self.call("list", kv.get(prefix, Some(GetOptions::new().with_prefix()))).await?;
        Ok(resp.kvs().iter().map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.value().to_vec())).collect())
    }

    async fn txn(&self, txn: Txn) -> Result<bool, IpamError> {
        let mut kv = self.client.kv_client();
        Ok(self.call("transaction", kv.txn(txn)).await?.succeeded())
    }

    fn holder_of(value: &[u8]) -> Option<String> {
        serde_json::from_slice::<Allocation>(value).ok().map(|a| a.owner.key())
    }

    /// A free address for `range`, inside this node's blocks (reserving one when they are full),
    /// else anywhere in the range.
    async fn pick(
        &self,
        req: &AllocRequest<'_>,
        range: &IpRange,
        skip: &BTreeSet<IpAddr>,
    ) -> Result<IpAddr, IpamError> {
        let key = range.key();
        let node = &req.owner.node;
        let cursor =
            self.get(&self.cursor_key(node, range)).await?.0.and_then(|v| String::from_utf8(v).ok()?.parse().ok());
        let blocks: BTreeMap<u128, String> = self
            .get_prefix(&self.block_prefix(range))
            .await?
            .into_iter()
            .filter_map(|(k, v)| Some((k.rsplit('/').next()?.parse().ok()?, String::from_utf8(v).ok()?)))
            .collect();
        let span = range.last - range.first + 1;
        let n_blocks = span.div_ceil(self.block_size);
        let block_of = |o: u128| (o - range.first) / self.block_size;
        let bounds = |b: u128| {
            let lo = range.first + b * self.block_size;
            (lo, (lo + self.block_size - 1).min(range.last))
        };
        let mut mine: Vec<u128> = blocks.iter().filter(|(_, n)| *n == node).map(|(b, _)| *b).collect();
        // Start with the block of the cursor, so next-fit goes on where it stopped.
        if let Some(c) = cursor.filter(|c| *c >= range.first && *c <= range.last) {
            mine.sort_by_key(|b| (*b < block_of(c), *b));
        }
        for b in &mine {
            if let Some(ip) = self.free_in(req, range, bounds(*b), cursor, skip).await? {
                return Ok(ip);
            }
        }
        // Reserve a new block, starting at a place derived from the node name so nodes spread out.
        let start = node.bytes().fold(0u128, |h, c| h.wrapping_mul(31).wrapping_add(u128::from(c))) % n_blocks;
        let mut tried = 0u128;
        let mut b = start;
        while tried < n_blocks.min(4096) {
            self.not_past(range)?;
            if !blocks.contains_key(&b) {
                let bkey = format!("{}{b}", self.block_prefix(range));
                let won = self
                    .txn(
                        Txn::new().when([Compare::version(bkey.as_str(), CompareOp::Equal, 0)]).and_then([TxnOp::put(
                            bkey.as_str(),
                            node.as_bytes(),
                            None,
                        )]),
                    )
                    .await?;
                if won && let Some(ip) = self.free_in(req, range, bounds(b), None, skip).await? {
                    return Ok(ip);
                }
            }
            b = (b + 1) % n_blocks;
            tried += 1;
        }
        // Every block is someone's: any free address will do (address keys keep it unique).
        for c in Candidates::after(range, cursor) {
            self.not_past(range)?;
            let ip = range.addr(c);
            if skip.contains(&ip) {
                continue;
            }
            if self.get(&self.ip_key(ip, &key, req.overlapping)).await?.0.is_none() {
                return Ok(ip);
            }
        }
        Err(IpamError::Exhausted { range: key })
    }

    /// A free address in block `(lo, hi)`: one ordered range read of its address keys. Among the
    /// first free ones, the process id chooses, so ADDs running at once on a node rarely collide.
    async fn free_in(
        &self,
        req: &AllocRequest<'_>,
        range: &IpRange,
        (lo, hi): (u128, u128),
        cursor: Option<u128>,
        skip: &BTreeSet<IpAddr>,
    ) -> Result<Option<IpAddr>, IpamError> {
        let key = range.key();
        let from = self.ip_key(range.addr(lo), &key, req.overlapping);
        let to = format!("{}\u{0}", self.ip_key(range.addr(hi), &key, req.overlapping));
        let used: BTreeSet<String> = self.get_range(&from, &to).await?.into_iter().map(|(k, _)| k).collect();
        let start = cursor.filter(|c| *c >= lo && *c < hi).map_or(lo, |c| c + 1);
        let free: Vec<IpAddr> = (start..=hi)
            .chain(lo..start)
            .filter(|o| !range.is_excluded(*o))
            .map(|o| range.addr(o))
            .filter(|ip| !skip.contains(ip) && !used.contains(&self.ip_key(*ip, &key, req.overlapping)))
            .take(8)
            .collect();
        Ok((!free.is_empty()).then(|| free[super::spread() as usize % free.len()]))
    }

    async fn allocate_once(
        &self,
        req: &AllocRequest<'_>,
        skip: &mut BTreeSet<IpAddr>,
    ) -> Result<Option<Vec<IpAddr>>, IpamError> {
        let owner = &req.owner;
        let me = owner.key();
        let record_key = self.record_key(&owner.container_id, &owner.ifname);
        let (rec_val, rec_rev) = self.get(&record_key).await?;
        if let Some(v) = &rec_val {
            Record::refuse_later_format(v, &record_key)?;
        }
        let mut previous: Option<Record> = rec_val.and_then(|v| serde_json::from_slice(&v).ok());
        let mut moved: Option<(String, i64, String)> = None; // (old record key, its revision, old holder)
        if previous.is_none()
            && let Some(pk) = self.pod_key(owner)
            && let (Some(v), _) = self.get(&pk).await?
            && let Ok(old) = String::from_utf8(v)
            && old != me
            && let Some((cid, ifn)) = old.split_once('=')
        {
            let old_key = self.record_key(cid, ifn);
            if let (Some(v), rev) = self.get(&old_key).await? {
                Record::refuse_later_format(&v, &old_key)?;
                previous = serde_json::from_slice(&v).ok();
                moved = Some((old_key, rev, old));
            }
        }
        let prior = moved.as_ref().map(|m| m.2.clone()).unwrap_or_else(|| me.clone());
        let mut compares = vec![Compare::mod_revision(record_key.as_str(), CompareOp::Equal, rec_rev)];
        let mut ops = Vec::new();
        let mut chosen = Vec::new();
        for (i, range) in req.ranges.iter().enumerate() {
            let key = range.key();
            let kept = previous.as_ref().and_then(|r| r.ips.iter().find(|h| h.range == key)).map(|h| h.ip);
            let candidate = match (req.requested[i], kept) {
                (Some(want), Some(k)) if want == k => Some(k),
                (None, Some(k)) => Some(k),
                (Some(want), _) => Some(want),
                (None, None) => None,
            };
            let mut ip = None;
            if let Some(c) = candidate {
                let ik = self.ip_key(c, &key, req.overlapping);
                let (val, rev) = self.get(&ik).await?;
                match val.as_deref().and_then(Self::holder_of) {
                    None => {
                        compares.push(Compare::version(ik.as_str(), CompareOp::Equal, 0));
                        ip = Some(c);
                    }
                    Some(h) if h == me || h == prior => {
                        compares.push(Compare::mod_revision(ik.as_str(), CompareOp::Equal, rev));
                        ip = Some(c);
                    }
                    Some(_) if req.requested[i] == Some(c) => {
                        let held_by = val.as_deref().and_then(|v| serde_json::from_slice::<Allocation>(v).ok());
                        let pod = held_by.as_ref().and_then(|a| a.owner.pod_ref.as_deref());
                        return Err(IpamError::InUse { ip: c, holder: Holder::as_seen_by(pod, &req.owner) });
                    }
                    Some(_) => {} // the kept address went to someone else: pick anew
                }
            }
            let ip = match ip {
                Some(ip) => ip,
                None => {
                    let ip = self.pick(req, range, skip).await?;
                    compares.push(Compare::version(
                        self.ip_key(ip, &key, req.overlapping).as_str(),
                        CompareOp::Equal,
                        0,
                    ));
                    ip
                }
            };
            let alloc = Allocation { ip, range: key.clone(), owner: owner.clone() };
            ops.push(TxnOp::put(
                self.ip_key(ip, &key, req.overlapping),
                serde_json::to_vec(&alloc).expect("json"),
                None,
            ));
            if let Some(o) = range.offset_of(ip) {
                ops.push(TxnOp::put(self.cursor_key(&owner.node, range), o.to_string(), None));
            }
            chosen.push(Held { ip, range: key });
        }
        let record = Record::new(owner.clone(), chosen.clone());
        ops.push(TxnOp::put(record_key.as_str(), serde_json::to_vec(&record).expect("json"), None));
        if let Some((old_key, old_rev, _)) = &moved {
            compares.push(Compare::mod_revision(old_key.as_str(), CompareOp::Equal, *old_rev));
            ops.push(TxnOp::delete(old_key.as_str(), None));
        }
        if let Some(pk) = self.pod_key(owner) {
            ops.push(TxnOp::put(pk, me.as_bytes(), None));
        }
        if self.txn(Txn::new().when(compares).and_then(ops)).await? {
            Ok(Some(chosen.into_iter().map(|h| h.ip).collect()))
        } else {
            // Someone took one of these addresses first: try others next time.
            skip.extend(chosen.iter().map(|h| h.ip));
            Ok(None)
        }
    }

    async fn release_once(&self, cid: &str, ifname: &str) -> Result<Option<Vec<Allocation>>, IpamError> {
        let me = attachment_key(cid, ifname);
        let record_key = self.record_key(cid, ifname);
        let (val, rev) = self.get(&record_key).await?;
        if let Some(v) = &val {
            Record::refuse_later_format(v, &record_key)?;
        }
        let Some(record) = val.and_then(|v| serde_json::from_slice::<Record>(&v).ok()) else {
            return Ok(Some(Vec::new()));
        };
        let mut compares = vec![Compare::mod_revision(record_key.as_str(), CompareOp::Equal, rev)];
        let mut ops = vec![TxnOp::delete(record_key.as_str(), None)];
        let mut released = Vec::new();
        for h in &record.ips {
            for overlapping in [true, false] {
                let ik = self.ip_key(h.ip, &h.range, overlapping);
                let (v, r) = self.get(&ik).await?;
                if v.as_deref().and_then(Self::holder_of).as_deref() == Some(me.as_str()) {
                    compares.push(Compare::mod_revision(ik.as_str(), CompareOp::Equal, r));
                    ops.push(TxnOp::delete(ik.as_str(), None));
                    released.push(Allocation { ip: h.ip, range: h.range.clone(), owner: record.owner.clone() });
                }
            }
        }
        if let Some(pk) = self.pod_key(&record.owner) {
            let (v, r) = self.get(&pk).await?;
            if v.as_deref() == Some(me.as_bytes()) {
                compares.push(Compare::mod_revision(pk.as_str(), CompareOp::Equal, r));
                ops.push(TxnOp::delete(pk.as_str(), None));
            }
        }
        Ok(self.txn(Txn::new().when(compares).and_then(ops)).await?.then_some(released))
    }

    fn deadline(&self) -> Instant {
        self.request.within(self.timeout * 5).instant()
    }

    /// Code 11 once the request's deadline passed while walking `range` (a wide range whose
    /// blocks or addresses are mostly taken is walked one key at a time).
    fn not_past(&self, range: &IpRange) -> Result<(), IpamError> {
        match self.request.passed() {
            true => {
                Err(unavailable(format!("etcd: no free address of {} found by this request's deadline", range.key())))
            }
            false => Ok(()),
        }
    }
}

impl Store for EtcdStore {
    fn allocate(&self, req: &AllocRequest<'_>) -> Result<Vec<IpAddr>, IpamError> {
        self.rt.block_on(async {
            let deadline = self.deadline();
            let mut skip = BTreeSet::new();
            for attempt in 0..MAX_ATTEMPTS {
                if let Some(ips) = self.allocate_once(req, &mut skip).await? {
                    return Ok(ips);
                }
                if Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1 + (attempt as u64 % 4) * u64::from(super::spread() % 3)))
                    .await;
            }
            Err(unavailable("etcd: too much contention, no allocation committed in time"))
        })
    }

    fn release(&self, container_id: &str, ifname: &str) -> Result<Vec<Allocation>, IpamError> {
        self.rt.block_on(async {
            for _ in 0..MAX_ATTEMPTS {
                if let Some(released) = self.release_once(container_id, ifname).await? {
                    return Ok(released);
                }
            }
            Err(unavailable("etcd: release kept conflicting"))
        })
    }

    fn holdings(&self, container_id: &str, ifname: &str) -> Result<Vec<Allocation>, IpamError> {
        let me = attachment_key(container_id, ifname);
        Ok(self.list()?.into_iter().filter(|a| a.owner.key() == me).collect())
    }

    fn list(&self) -> Result<Vec<Allocation>, IpamError> {
        self.rt.block_on(async {
            let mut out: Vec<Allocation> = self
                .get_prefix(&format!("{}/ips/", self.root))
                .await?
                .into_iter()
                .filter_map(|(_, v)| serde_json::from_slice(&v).ok())
                .collect();
            out.sort_by_key(|a| to_u128(a.ip));
            Ok(out)
        })
    }
}
