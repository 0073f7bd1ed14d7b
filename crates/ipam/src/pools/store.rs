//! The pool store: a node's addresses from its blocks of nv-ipam `IPPool`s, held in node-local
//! files. The API is read to learn the node's blocks (a process-wide cache answers most ADDs) and
//! written only to claim a block; a DEL never calls it.
//!
//! ```text
//! <data root>/.plexus-ipam-pools/<pool>@<block's first address>/   the file store of one block
//! ```
//!
//! Each block is a domain of the file store ([`crate::store::file`]): its guarantees — fsynced,
//! crash-safe, one file per address created with `link(2)` — hold per block, and blocks are
//! disjoint, so no address is held twice on the node. Across nodes the blocks keep them apart: a
//! block is claimed with a JSON Patch of the pool's `/status` that `test`s the resourceVersion the
//! claim was planned on, so two claims planned on one read cannot both land; the loser reads again
//! and plans again (optimistic, and it cannot lose a block: see docs/ARCHITECTURE.md).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::Method;
use plexus_cni::{CniResult, IpConfig};
use plexus_k8s::api::{ACCEPT_METADATA_LIST, ApiClient, Reply};
use plexus_k8s::names::ApiPath;
use plexus_node::datadir::DataDir;
use serde_json::{Value, json};

use super::ippool::{GROUP_PATH, IpPool, allocation_entry};
use super::selector;
use crate::config::PoolsConfig;
use crate::error::IpamError;
use crate::range::IpRange;
use crate::store::file::FileStore;
use crate::store::{AllocRequest, Allocation, Context, Owner, Store};

/// Beneath the policy's first data root; a name no tenant's directory may take (`.plexus*`).
pub const POOLS_DIR: &str = ".plexus-ipam-pools";
/// Per API call, as the other stores.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
const JSON: &str = "application/json";
const JSON_PATCH: &str = "application/json-patch+json";
/// How long a pool read answers ADDs of this process (plexus-daemon serves many). A node's own
/// blocks change only by this node's claims, which refresh it; an admin's edit of the pool
/// reaches ADDs this late at most.
const POOL_TTL: Duration = Duration::from_secs(30);
/// Pools the process remembers at most (each an admin's object; a name that is no pool is
/// never remembered).
const POOL_CACHE_CAP: usize = 1024;
/// Claims of one ADD planned again after another node's claim landed first, at most.
const CLAIM_ATTEMPTS: usize = 64;
/// The node's claim turns: pools share a fixed few lock files.
const TURNS: u8 = 16;
/// A claim lists the cluster's nodes (their metadata) this many at a time, at most
/// `NODE_PAGES` times.
const NODE_PAGE: usize = 1000;
const NODE_PAGES: usize = 20;

type CacheKey = (PathBuf, String, String);
/// One pool's copy: the read and when it was made; its lock is held while the pool is read, so a
/// process's concurrent ADDs read a pool once, not once each.
type PoolCopy = Arc<Mutex<Option<(Instant, IpPool)>>>;

fn copies() -> &'static Mutex<HashMap<CacheKey, PoolCopy>> {
    static POOL_COPIES: std::sync::OnceLock<Mutex<HashMap<CacheKey, PoolCopy>>> = std::sync::OnceLock::new();
    POOL_COPIES.get_or_init(Default::default)
}

/// The copy of pool `key` (made empty when there is none: the map is capped at
/// [`POOL_CACHE_CAP`], and emptied when full).
fn copy_of(key: &CacheKey) -> PoolCopy {
    let mut all = copies().lock().expect("pool copies");
    if all.len() >= POOL_CACHE_CAP && !all.contains_key(key) {
        all.clear();
    }
    all.entry(key.clone()).or_default().clone()
}

fn unavailable(e: impl std::fmt::Display) -> IpamError {
    IpamError::Unavailable(format!("Kubernetes: {e}"))
}

pub struct PoolStore<'a> {
    cfg: PoolsConfig,
    node: String,
    network: String,
    cx: Context<'a>,
}

/// A pool's addresses for one attachment: what [`PoolStore::add`] answers.
pub struct Given {
    pub ips: Vec<IpAddr>,
    pub result: CniResult,
}

impl<'a> PoolStore<'a> {
    pub fn open(cfg: &PoolsConfig, node: &str, network: &str, cx: Context<'a>) -> PoolStore<'a> {
        PoolStore { cfg: cfg.clone(), node: node.to_string(), network: network.to_string(), cx }
    }

    fn api(&self) -> Result<ApiClient, IpamError> {
        ApiClient::connect(Some(&self.cfg.kubeconfig), CALL_TIMEOUT)
            .map_err(|e| IpamError::Config(format!("poolName: {e}")))?
            .ok_or_else(|| IpamError::Config("poolName: no kubeconfig".into()))
    }

    fn pool_path(&self, name: &str) -> Result<ApiPath, IpamError> {
        ApiPath::object(GROUP_PATH, &self.cfg.namespace, "ippools", "IPPool", name)
            .map_err(|e| IpamError::Refused(e.to_string()))
    }

    /// Pool `name`: the process's copy while it is fresh, else the API server's watch cache's
    /// (a moment old at most: a block of this node's that it does not show yet only sends the
    /// ADD to claim, which reads etcd's); with `latest`, etcd's. One read at a time per pool in
    /// the process: the others wait for it (until their deadline) and take its copy.
    fn pool(&self, api: &ApiClient, name: &str, latest: bool) -> Result<IpPool, IpamError> {
        let copy = copy_of(&self.copy_key(name));
        let mut pause = Duration::from_millis(1);
        let mut held = loop {
            match copy.try_lock() {
                Ok(held) => break held,
                Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) if !self.cx.deadline.passed() => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(16));
                }
                Err(std::sync::TryLockError::WouldBlock) => {
                    return Err(unavailable(format!("pool {name}: not read by this request's deadline")));
                }
            }
        };
        if !latest
            && let Some((at, pool)) = held.as_ref()
            && at.elapsed() < POOL_TTL
        {
            return Ok(pool.clone());
        }
        let mut path = self.pool_path(name)?;
        if !latest {
            path = path.query("resourceVersion", 0);
        }
        let what = format!("get ippool {}/{name}", self.cfg.namespace);
        let obj = match api.send(&what, Method::GET, &path, JSON, None).map_err(unavailable)? {
            Reply::Ok(obj) => obj,
            Reply::NotFound => {
                return Err(IpamError::Config(format!(
                    "poolName {name:?}: no IPPool {name} (nv-ipam.nvidia.com) in namespace {}",
                    self.cfg.namespace
                )));
            }
            Reply::Conflict(m) => return Err(unavailable(m)),
        };
        let pool = IpPool::from_object(&obj)?;
        *held = Some((Instant::now(), pool.clone()));
        Ok(pool)
    }

    /// Whose copy of pool `name` this store's requests share: one API server's, one namespace's.
    fn copy_key(&self, name: &str) -> CacheKey {
        (self.cfg.kubeconfig.clone(), self.cfg.namespace.clone(), name.to_string())
    }

    /// Keep `pool` (as a claim's write answered it) as the process's copy.
    fn remember(&self, pool: &IpPool) {
        let copy = copy_of(&self.copy_key(&pool.name));
        let mut held = copy.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *held = Some((Instant::now(), pool.clone()));
    }

    /// The names of the nodes `pool` selects, sorted (one metadata-only list of the cluster's
    /// nodes, a page of [`NODE_PAGE`] at a time, at most [`NODE_PAGES`] pages).
    fn selected_nodes(&self, api: &ApiClient, pool: &IpPool) -> Result<Vec<String>, IpamError> {
        let mut out = Vec::new();
        let mut next: Option<String> = None;
        for _ in 0..NODE_PAGES {
            let mut path = ApiPath::cluster_collection("/api/v1", "nodes").query("limit", NODE_PAGE);
            if let Some(token) = &next {
                path = path.query("continue", token);
            }
            let list = match api.send_accepting("list nodes", Method::GET, &path, JSON, ACCEPT_METADATA_LIST, None) {
                Ok(Reply::Ok(list)) => list,
                Ok(other) => return Err(unavailable(format!("list nodes: {other:?}"))),
                Err(e) => return Err(unavailable(e)),
            };
            for item in list.get("items").and_then(Value::as_array).into_iter().flatten() {
                let Some(name) = item.pointer("/metadata/name").and_then(Value::as_str) else { continue };
                let labels: BTreeMap<String, String> = item
                    .pointer("/metadata/labels")
                    .and_then(Value::as_object)
                    .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect())
                    .unwrap_or_default();
                if selector::selects(pool.node_selector.as_ref(), name, &labels) {
                    out.push(name.to_string());
                }
            }
            next = list
                .pointer("/metadata/continue")
                .and_then(Value::as_str)
                .filter(|c| !c.is_empty())
                .map(str::to_string);
            if next.is_none() {
                out.sort();
                return Ok(out);
            }
        }
        Err(unavailable(format!("list nodes: more than {} nodes", NODE_PAGE * NODE_PAGES)))
    }

    /// The file store of the block starting at `first` of `pool`.
    fn block_store(&self, pool: &str, first: IpAddr, create: bool) -> Result<Option<FileStore>, IpamError> {
        let dir = self.cfg.data_root.join(POOLS_DIR);
        let data =
            DataDir::admin(&dir, create).map_err(|e| IpamError::Store(format!("open {}: {e}", dir.display())))?;
        data.map(|d| FileStore::open(d, &format!("{pool}@{first}"), self.cx.deadline)).transpose()
    }

    /// The block stores of `pool` on this node, as the local directory holds them.
    fn local_stores(&self, pool: &str) -> Result<Vec<FileStore>, IpamError> {
        let dir = self.cfg.data_root.join(POOLS_DIR);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(IpamError::Store(format!("list {}: {e}", dir.display()))),
        };
        let prefix = format!("{pool}@");
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(first) = name.to_str().and_then(|n| n.strip_prefix(&prefix)).and_then(crate::range::parse_addr)
            else {
                continue;
            };
            out.extend(self.block_store(pool, first, false)?);
        }
        Ok(out)
    }

    /// One address of each configured pool for `owner` (the ones it holds already, if it does),
    /// with the pools' prefixes, gateways and routes. A `requested` address is asked of the first
    /// pool whose subnet holds it (one that none holds is refused); the node's own addresses
    /// (`node_addrs`) are never given.
    pub fn add(&self, owner: &Owner, requested: &[IpAddr], node_addrs: &[IpAddr]) -> Result<Given, IpamError> {
        let api = self.api()?;
        let mut ips = Vec::new();
        let mut result = CniResult::default();
        let mut given: Vec<(String, IpAddr)> = Vec::new();
        let mut asked: Vec<IpAddr> = requested.to_vec();
        let mut plans = Vec::new();
        for name in &self.cfg.pools {
            let pool = self.pool(&api, name, false)?;
            self.cx.policy.check_range("poolName", pool.subnet, self.cx.namespace).map_err(crate::store::refusal)?;
            let wanted = asked.iter().position(|ip| pool.subnet.contains(*ip)).map(|i| asked.remove(i));
            plans.push((pool, wanted));
        }
        if let Some(ip) = asked.first() {
            return Err(IpamError::Outside { ip: *ip });
        }
        for (pool, wanted) in plans {
            let name = pool.name.clone();
            let given_here = self.add_in(&api, pool, owner, wanted, node_addrs);
            match given_here {
                Ok((ip, range, routes)) => {
                    given.push((name, ip));
                    ips.push(ip);
                    result.ips.push(IpConfig {
                        interface: None,
                        address: range.with_prefix(ip),
                        gateway: range.gateway,
                    });
                    result.routes.extend(routes);
                }
                Err(e) => {
                    // A failed ADD holds nothing: what the pools before this one gave goes back.
                    for (pool, _) in &given {
                        for store in self.local_stores(pool).unwrap_or_default() {
                            let _ = store.release(&owner.container_id, &owner.ifname);
                        }
                    }
                    return Err(e);
                }
            }
        }
        Ok(Given { ips, result })
    }

    /// An address of `pool` for `owner`: from a block of this node's that has one free, else
    /// from a block claimed now.
    fn add_in(
        &self,
        api: &ApiClient,
        mut pool: IpPool,
        owner: &Owner,
        requested: Option<IpAddr>,
        node_addrs: &[IpAddr],
    ) -> Result<(IpAddr, IpRange, Vec<plexus_cni::Route>), IpamError> {
        let mut tried: Vec<u128> = Vec::new();
        for _ in 0..CLAIM_ATTEMPTS {
            if self.cx.deadline.passed() {
                return Err(unavailable(format!("pool {}: no address by this request's deadline", pool.name)));
            }
            // The block the attachment holds an address in first (an ADD again), then the others.
            let mut blocks: Vec<(u128, u128)> =
                pool.blocks_of(&self.node).map(|b| (b.first, b.last)).filter(|(f, _)| !tried.contains(f)).collect();
            let mut holding = None;
            for (i, (first, _)) in blocks.iter().enumerate() {
                if let Some(s) = self.block_store(&pool.name, pool.addr(*first), false)?
                    && !s.holdings(&owner.container_id, &owner.ifname)?.is_empty()
                {
                    holding = Some(i);
                }
            }
            if let Some(i) = holding {
                blocks.swap(0, i);
            }
            for (first, last) in blocks {
                let range = pool.block_range(first, last).excluding(node_addrs);
                if requested.is_some_and(|ip| range.offset_of(ip).is_none()) {
                    tried.push(first);
                    continue;
                }
                let store = self.block_store(&pool.name, pool.addr(first), true)?.expect("created");
                let req = AllocRequest {
                    owner: owner.clone(),
                    ranges: std::slice::from_ref(&range),
                    requested: vec![requested],
                    overlapping: true,
                };
                match store.allocate(&req) {
                    Ok(ips) => return Ok((ips[0], range, pool.result_routes())),
                    Err(IpamError::Exhausted { .. }) => tried.push(first),
                    Err(e) => return Err(e),
                }
            }
            if let Some(ip) = requested {
                return Err(IpamError::Config(format!(
                    "requested address {ip}: not in a block of pool {} that node {} holds",
                    pool.name, self.node
                )));
            }
            // No block of this node's has room: claim one, in the node's turn for the pool (so
            // that ADDs finding the blocks full at once claim one block, not one each), after
            // reading the pool from etcd (another ADD's claim may have landed meanwhile).
            let turn = self.claim_turn(&pool.name)?;
            pool = self.pool(api, &pool.name.clone(), true)?;
            if !pool.blocks_of(&self.node).any(|b| !tried.contains(&b.first)) {
                pool = self.claim(api, pool)?;
            }
            drop(turn);
        }
        Err(unavailable(format!("pool {}: no block claimed after {CLAIM_ATTEMPTS} attempts", pool.name)))
    }

    /// Claim the pool's next free block for this node — and, when it has none of the pool yet,
    /// one for every node the pool selects that has none ([`IpPool::plan_claim`]): the pool as it
    /// is after the claim (the claim landed, or another writer's did first and the pool is read
    /// again). Every block is appended under one `test` of the resourceVersion planned on.
    fn claim(&self, api: &ApiClient, pool: IpPool) -> Result<IpPool, IpamError> {
        let selected = self.selected_nodes(api, &pool)?;
        if selected.binary_search(&self.node).is_err() {
            return Err(IpamError::Refused(format!(
                "network {}: pool {} does not select node {} (spec.nodeSelector): no block of it for this node",
                self.network, pool.name, self.node
            )));
        }
        let Some(blocks) = pool.plan_claim(&self.node, &selected) else {
            return Err(IpamError::Exhausted {
                range: format!("{} (pool {}: no free block for node {})", pool.subnet, pool.name, self.node),
            });
        };
        let entries: Vec<Value> = blocks.iter().map(|b| allocation_entry(&pool, &b.node, b.first, b.last)).collect();
        let mut ops = vec![json!({"op": "test", "path": "/metadata/resourceVersion", "value": pool.resource_version})];
        match pool.has_allocations {
            true => ops
                .extend(entries.into_iter().map(|e| json!({"op": "add", "path": "/status/allocations/-", "value": e}))),
            false => ops.push(json!({"op": "add", "path": "/status", "value": {"allocations": entries}})),
        }
        let path = self.pool_path(&pool.name)?.subresource("status");
        let what = format!("claim a block of ippool {}/{}", self.cfg.namespace, pool.name);
        let obj = match api
            .send(&what, Method::PATCH, &path, JSON_PATCH, Some(&Value::Array(ops)))
            .map_err(unavailable)?
        {
            Reply::Ok(obj) => {
                let mine = &blocks[0];
                tracing::info!(pool = %pool.name, node = %self.node, first = %pool.addr(mine.first),
                    last = %pool.addr(mine.last), others = blocks.len() - 1, "block claimed");
                obj
            }
            // Another claim landed first (the resourceVersion moved): read it and plan again.
            Reply::Conflict(_) => return self.pool(api, &pool.name, true),
            Reply::NotFound => return Err(IpamError::Config(format!("poolName {:?}: the IPPool is gone", pool.name))),
        };
        let pool = IpPool::from_object(&obj)?;
        self.remember(&pool);
        Ok(pool)
    }

    /// The node's turn to claim a block of `pool`: a lock file of a fixed few ([`TURNS`], however
    /// many pools there are), waited for until the request's deadline.
    fn claim_turn(&self, pool: &str) -> Result<std::fs::File, IpamError> {
        use sha2::{Digest, Sha256};
        use std::os::unix::fs::OpenOptionsExt;
        let dir = self.cfg.data_root.join(POOLS_DIR);
        DataDir::admin(&dir, true).map_err(|e| IpamError::Store(format!("open {}: {e}", dir.display())))?;
        let stripe = Sha256::digest(pool.as_bytes())[0] % TURNS;
        let path = dir.join(format!(".turn-{stripe:02}"));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| IpamError::Store(format!("open {}: {e}", path.display())))?;
        let mut pause = Duration::from_millis(1);
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(file),
                Err(std::fs::TryLockError::WouldBlock) if !self.cx.deadline.passed() => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(32));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(unavailable(format!(
                        "pool {pool}: the node's turn to claim a block did not come by the deadline"
                    )));
                }
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(IpamError::Store(format!("lock {}: {e}", path.display())));
                }
            }
        }
    }

    fn each_store(&self) -> Result<Vec<FileStore>, IpamError> {
        let mut out = Vec::new();
        for pool in &self.cfg.pools {
            out.extend(self.local_stores(pool)?);
        }
        Ok(out)
    }
}

impl Store for PoolStore<'_> {
    fn allocate(&self, req: &AllocRequest<'_>) -> Result<Vec<IpAddr>, IpamError> {
        let requested: Vec<IpAddr> = req.requested.iter().flatten().copied().collect();
        self.add(&req.owner, &requested, &[]).map(|g| g.ips)
    }

    /// Local only: a DEL never waits for the API.
    fn release(&self, container_id: &str, ifname: &str) -> Result<Vec<Allocation>, IpamError> {
        let mut released = Vec::new();
        for store in self.each_store()? {
            released.extend(store.release(container_id, ifname)?);
        }
        Ok(released)
    }

    fn holdings(&self, container_id: &str, ifname: &str) -> Result<Vec<Allocation>, IpamError> {
        let mut held = Vec::new();
        for store in self.each_store()? {
            held.extend(store.holdings(container_id, ifname)?);
        }
        Ok(held)
    }

    fn list(&self) -> Result<Vec<Allocation>, IpamError> {
        let mut all = Vec::new();
        for store in self.each_store()? {
            all.extend(store.list()?);
        }
        Ok(all)
    }
}
