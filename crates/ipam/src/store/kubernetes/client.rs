//! The store itself: allocations and releases in whereabouts' objects through the API server.
//! Its objects' reads and writes are `client/objects.rs`; the node's writers taking turns (lock,
//! Lease, spool, batch commits, retries) `client/turns.rs`.

mod objects;
mod turns;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use http::Method;
use plexus_k8s::api::{ApiClient, Reply};
use plexus_k8s::names::ApiPath;
use serde_json::{Value, json};

use super::batch::{entry, escape, removal, take_over};
use super::names::pool_name;
use super::pool::{CURSOR_ANNOTATION, MAX_OFFSET, Pool};
use super::spool::{Answer, Kind};
use crate::config::{DEFAULT_DOMAIN, KubernetesStoreConfig};
use crate::error::{Holder, IpamError};
use crate::range::IpRange;
use crate::store::{AllocRequest, Allocation, Candidates, Owner, Store};

const GROUP_PATH: &str = "/apis/whereabouts.cni.cncf.io/v1alpha1";
/// Per API call (connect, read), as whereabouts' request timeout.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// For a whole ADD or DEL: conflicts, and calls that failed or timed out, are retried until then.
const DEADLINE: Duration = Duration::from_secs(30);
const JSON_PATCH: &str = "application/json-patch+json";
const JSON: &str = "application/json";
/// How often an ADD waiting in the spool looks for its answer or a free turn: at first, and at
/// most (it backs off while the turn stays taken). Every waiter of every pool on the node polls,
/// hundreds at once in a burst: at the cap they cost the node a few thousand look-ups a second
/// (at 4 ms, 1,000 waiters spent a core between them), and a served request goes on at most
/// this late, beside an API write's tens to hundreds of milliseconds.
const ANSWER_POLL: Duration = Duration::from_millis(1);
const ANSWER_POLL_MAX: Duration = Duration::from_millis(32);

pub struct KubernetesStore {
    api: ApiClient,
    /// The request's deadline: no ADD or DEL, lock wait or spool turn outlasts it.
    deadline: plexus_cni::Deadline,
    /// The most IPPools the namespace may hold before this node refuses to create another.
    max_pools: usize,
    namespace: String,
    /// whereabouts' `network_name`, the prefix of object names (none for the default domain).
    network_name: Option<String>,
    network: String,
    ranges: Vec<IpRange>,
    leader_election: bool,
    /// The policy's first data root: the node's turns and spools ([`super::spool`]).
    node_lock_dir: std::path::PathBuf,
}

/// Which copy of a pool a read takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Read {
    /// etcd's (a quorum read).
    Latest,
    /// The API server's watch cache (`resourceVersion=0`).
    Cached,
}

/// Code 11 once an ADD's or DEL's deadline (at most [`DEADLINE`], the request's if sooner) has
/// passed with nothing committed in `range`.
fn not_past(deadline: Instant, range: &IpRange) -> Result<(), IpamError> {
    if Instant::now() >= deadline {
        return Err(unavailable(format!("nothing committed in range {} by this request's deadline", range.network)));
    }
    Ok(())
}

/// An offset a spool answer names, if it is one of `range`'s network.
fn spool_offset(offset: &str, range: &IpRange) -> Result<u128, IpamError> {
    offset
        .parse::<u128>()
        .ok()
        .filter(|o| range.in_network(*o))
        .ok_or_else(|| IpamError::Store(format!("spool answer: offset {offset:?} is not in {}", range.network)))
}

fn unavailable(e: impl std::fmt::Display) -> IpamError {
    IpamError::Unavailable(format!("Kubernetes: {e}"))
}

impl KubernetesStore {
    pub fn connect(
        cfg: &KubernetesStoreConfig,
        domain: &str,
        network: &str,
        ranges: &[IpRange],
        deadline: plexus_cni::Deadline,
    ) -> Result<KubernetesStore, IpamError> {
        let api = ApiClient::connect(Some(&cfg.kubeconfig), CALL_TIMEOUT)
            .map_err(|e| IpamError::Config(format!("store kubernetes: {e}")))?
            .ok_or_else(|| IpamError::Config("store kubernetes: no kubeconfig".into()))?;
        Ok(KubernetesStore {
            api,
            deadline,
            max_pools: cfg.max_pools,
            namespace: cfg.namespace.clone(),
            network_name: (domain != DEFAULT_DOMAIN).then(|| domain.to_string()),
            network: network.to_string(),
            ranges: ranges.to_vec(),
            leader_election: cfg.leader_election,
            node_lock_dir: cfg.node_lock_dir.clone(),
        })
    }

    /// The deadline of one ADD or DEL: [`DEADLINE`] from now, or the request's if sooner.
    fn op_deadline(&self) -> Instant {
        self.deadline.within(DEADLINE).instant()
    }

    /// The path of whereabouts' `resource` in the store's namespace, or of its object `name` (a
    /// name that is not one — from a tenant's `network_name` — is refused before any request: no
    /// such object can exist, so nothing is held under it and DEL has nothing to release).
    fn path(&self, resource: &'static str, name: Option<&str>) -> Result<ApiPath, IpamError> {
        let kind = match resource {
            "ippools" => "IPPool",
            "overlappingrangeipreservations" => "OverlappingRangeIPReservation",
            other => other,
        };
        let path = match name {
            Some(n) => ApiPath::object(GROUP_PATH, &self.namespace, resource, kind, n),
            None => ApiPath::collection(GROUP_PATH, &self.namespace, resource),
        };
        path.map_err(|e| IpamError::Refused(e.to_string()))
    }

    /// Take one address of `range` for `req.owner` (or keep the one it holds).
    fn allocate_in(
        &self,
        range: &IpRange,
        requested: Option<IpAddr>,
        req: &AllocRequest<'_>,
        deadline: Instant,
    ) -> Result<IpAddr, IpamError> {
        let owner = &req.owner;
        let mut skip = std::collections::BTreeSet::new();
        loop {
            not_past(deadline, range)?;
            let pool = self.pool(range, Read::Latest, true)?.expect("created");
            if let Some((offset, by_pod)) = pool.held_by(owner) {
                let ip = range.addr(offset);
                if by_pod {
                    let (ops, old) = take_over(&pool, offset, owner);
                    if !self.patch_pool(&pool.name, &ops)? {
                        continue;
                    }
                    if req.overlapping {
                        self.reown(ip, &old, owner)?;
                    }
                } else if req.overlapping {
                    self.reserve(ip, owner)?;
                }
                return Ok(ip);
            }
            let candidates: Box<dyn Iterator<Item = u128>> = match requested {
                Some(ip) => {
                    let o = range.offset_of(ip).ok_or(IpamError::Outside { ip })?;
                    if let Some(holder) = pool.allocations.get(&o) {
                        let podref = holder.get("podref").and_then(Value::as_str).unwrap_or_default();
                        return Err(IpamError::InUse { ip, holder: Holder::as_seen_by(Some(podref), owner) });
                    }
                    Box::new(std::iter::once(o))
                }
                None => Box::new(Candidates::after(range, pool.cursor)),
            };
            let mut tried_any = false;
            for offset in candidates {
                // Candidates the pool holds are passed by; the walk still ends at the deadline.
                not_past(deadline, range)?;
                if offset > MAX_OFFSET {
                    continue;
                }
                if pool.allocations.contains_key(&offset) || skip.contains(&offset) {
                    continue;
                }
                tried_any = true;
                let path = format!("/spec/allocations/{offset}");
                let mut ops = Vec::new();
                if !pool.has_allocations {
                    ops.push(json!({"op": "add", "path": "/spec/allocations", "value": {}}));
                }
                ops.push(json!({"op": "test", "path": path, "value": null}));
                ops.push(json!({"op": "add", "path": path, "value": entry(owner)}));
                let cursor = json!(offset.to_string());
                match pool.has_annotations {
                    true => ops.push(json!({"op": "add", "path": format!("/metadata/annotations/{}", escape(CURSOR_ANNOTATION)), "value": cursor})),
                    false => ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": {CURSOR_ANNOTATION: cursor}})),
                }
                if !self.patch_pool(&pool.name, &ops)? {
                    // Taken meanwhile (or the pool changed shape): the next candidate.
                    skip.insert(offset);
                    if skip.len() % 8 == 0 {
                        break; // read the pool again now and then
                    }
                    continue;
                }
                let ip = range.addr(offset);
                if !req.overlapping || self.reserve(ip, owner)? {
                    return Ok(ip);
                }
                // Held through an overlapping range: give the offset back and go on.
                self.give_back(&pool.name, offset, owner)?;
                skip.insert(offset);
            }
            if !tried_any {
                if requested.is_some() {
                    continue;
                }
                return Err(IpamError::Exhausted { range: range.network.to_string() });
            }
        }
    }

    /// Remove every entry of (container, ifname) from `range`'s pool; the addresses released.
    /// `first` runs for each entry before the pool patch removes it (the reservation goes first:
    /// a DEL killed between the two finds the entry again and finishes, where the other order
    /// would leave a reservation no entry leads back to).
    fn release_in(
        &self,
        range: &IpRange,
        container_id: &str,
        ifname: &str,
        deadline: Instant,
        first: &dyn Fn(&Allocation) -> Result<(), IpamError>,
    ) -> Result<Vec<Allocation>, IpamError> {
        loop {
            not_past(deadline, range)?;
            let Some(pool) = self.pool(range, Read::Latest, false)? else { return Ok(Vec::new()) };
            let mine = pool.entries_of(container_id, ifname);
            if mine.is_empty() {
                return Ok(Vec::new());
            }
            let released = self.allocations_at(&pool, range, &mine);
            for a in &released {
                first(a)?;
            }
            let ops: Vec<Value> = mine.iter().flat_map(|o| removal(*o, container_id)).collect();
            if self.patch_pool(&pool.name, &ops)? {
                return Ok(released);
            }
        }
    }

    /// The entries of `pool` at `offsets`, as allocations of `range`.
    fn allocations_at(&self, pool: &Pool, range: &IpRange, offsets: &[u128]) -> Vec<Allocation> {
        offsets.iter().map(|o| self.allocation(range, *o, &pool.allocations[o])).collect()
    }

    /// The entries of (`owner`'s container, ifname) in `range`'s pool as it is now: the watch
    /// cache's copy, or etcd's when that shows none.
    fn held_entries(&self, range: &IpRange, owner: &Owner) -> Result<Vec<Allocation>, IpamError> {
        let mut held = Vec::new();
        for read in [Read::Cached, Read::Latest] {
            if let Some(pool) = self.pool(range, read, false)? {
                held = self.allocations_at(&pool, range, &pool.entries_of(&owner.container_id, &owner.ifname));
            }
            if !held.is_empty() {
                break;
            }
        }
        Ok(held)
    }

    /// The attachment's entries of `range` released: their reservations first (a DEL killed
    /// in between finds the entries again and finishes), then the entries themselves, through
    /// the spool (one write with every request waiting). Always through the node's turn, even
    /// when no entry shows: a write that served this container while it was dying may still be
    /// landing, and the turn comes after it. With whereabouts' Lease, one at a time.
    fn release_one(&self, range: &IpRange, owner: &Owner, deadline: Instant) -> Result<Vec<Allocation>, IpamError> {
        let (cid, ifname) = (owner.container_id.as_str(), owner.ifname.as_str());
        let alone = || {
            self.locked(range, cid, deadline, || self.release_in(range, cid, ifname, deadline, &|a| self.unreserve(a)))
        };
        if self.leader_election {
            return alone();
        }
        let held = self.held_entries(range, owner)?;
        for a in &held {
            self.unreserve(a)?;
        }
        let Some(answer) = self.through_spool(range, Kind::Release, owner, deadline) else { return alone() };
        let Answer::Released { offsets } = answer? else {
            return Err(IpamError::Store("spool answer: an address for a DEL".into()));
        };
        let mut released = Vec::new();
        for offset in offsets {
            let ip = range.addr(spool_offset(&offset, range)?);
            match held.iter().find(|a| a.ip == ip) {
                Some(a) => released.push(a.clone()),
                None => {
                    // Not in the pool as read before (that read was a moment old): its
                    // reservation goes after it.
                    let a = Allocation { ip, range: range.key(), owner: owner.clone() };
                    self.unreserve(&a)?;
                    released.push(a);
                }
            }
        }
        Ok(released)
    }

    /// One address of `range` for `req.owner`: through the spool, then the owner's reservation
    /// outside the turn. A requested address, whereabouts' Lease, or a reservation an
    /// overlapping range holds take the one-at-a-time way.
    fn allocate_one(
        &self,
        range: &IpRange,
        requested: Option<IpAddr>,
        req: &AllocRequest<'_>,
        me: &str,
        deadline: Instant,
    ) -> Result<IpAddr, IpamError> {
        let owner = &req.owner;
        let alone = || self.locked(range, me, deadline, || self.allocate_in(range, requested, req, deadline));
        if requested.is_some() || self.leader_election {
            return alone();
        }
        let Some(answer) = self.through_spool(range, Kind::Add, owner, deadline) else { return alone() };
        let answer = answer?;
        let (offset, reown_from) = match answer {
            Answer::Exhausted => return Err(IpamError::Exhausted { range: range.network.to_string() }),
            Answer::Offset { offset, reown_from } => (spool_offset(&offset, range)?, reown_from),
            Answer::Released { .. } => return Err(IpamError::Store("spool answer: a release for an ADD".into())),
        };
        let ip = range.addr(offset);
        if req.overlapping {
            match reown_from {
                Some(old) => self.reown(ip, &old, owner)?,
                None if !self.reserve(ip, owner)? => {
                    // Held through an overlapping range: the offset goes back, and the careful way
                    // (which skips such offsets) finds another.
                    self.give_back(&pool_name(self.network_name.as_deref(), range), offset, owner)?;
                    return alone();
                }
                None => {}
            }
        }
        Ok(ip)
    }

    fn allocation(&self, range: &IpRange, offset: u128, v: &Value) -> Allocation {
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        Allocation {
            ip: range.addr(offset),
            range: range.key(),
            owner: Owner {
                container_id: s("id"),
                ifname: s("ifname"),
                pod_ref: Some(s("podref")).filter(|p| !p.is_empty()),
                node: String::new(),
                network: self.network.clone(),
            },
        }
    }
}

impl Store for KubernetesStore {
    fn allocate(&self, req: &AllocRequest<'_>) -> Result<Vec<IpAddr>, IpamError> {
        let deadline = self.op_deadline();
        let me = req.owner.pod_ref.clone().unwrap_or_else(|| req.owner.container_id.clone());
        let mut got = Vec::new();
        for (i, range) in req.ranges.iter().enumerate() {
            let requested = req.requested.get(i).copied().flatten();
            match self.retrying(deadline, || self.allocate_one(range, requested, req, &me, deadline)) {
                Ok(ip) => got.push(ip),
                Err(e) => {
                    // Nothing held for a failed ADD: the earlier ranges' addresses go back.
                    for r in &req.ranges[..i] {
                        let unreserve = |a: &Allocation| {
                            let _ = self.unreserve(a);
                            Ok(())
                        };
                        let _ = self.release_in(r, &req.owner.container_id, &req.owner.ifname, deadline, &unreserve);
                    }
                    return Err(e);
                }
            }
        }
        Ok(got)
    }

    fn release(&self, container_id: &str, ifname: &str) -> Result<Vec<Allocation>, IpamError> {
        let deadline = self.op_deadline();
        let owner = Owner {
            container_id: container_id.to_string(),
            ifname: ifname.to_string(),
            pod_ref: None,
            node: String::new(),
            network: self.network.clone(),
        };
        let mut all = Vec::new();
        for range in &self.ranges {
            all.extend(self.retrying(deadline, || self.release_one(range, &owner, deadline))?);
        }
        Ok(all)
    }

    fn holdings(&self, container_id: &str, ifname: &str) -> Result<Vec<Allocation>, IpamError> {
        Ok(self
            .list()?
            .into_iter()
            .filter(|a| a.owner.container_id == container_id && a.owner.ifname == ifname)
            .collect())
    }

    /// whereabouts' entries name no node: the node of the entry's pod (`spec.nodeName`).
    fn node_of(&self, a: &Allocation) -> Result<Option<String>, IpamError> {
        let Some((ns, name)) = a.owner.pod_ref.as_deref().and_then(|p| p.split_once('/')) else {
            return Ok(None);
        };
        let what = format!("get pod {ns}/{name}");
        // An entry naming no pod a pod can be (whoever wrote it) is nobody's on this node.
        let Ok(path) = ApiPath::object("/api/v1", ns, "pods", "pod", name) else { return Ok(None) };
        match self.api.send(&what, Method::GET, &path, JSON, None).map_err(unavailable)? {
            Reply::Ok(pod) => Ok(pod.pointer("/spec/nodeName").and_then(Value::as_str).map(str::to_string)),
            _ => Ok(None),
        }
    }

    fn list(&self) -> Result<Vec<Allocation>, IpamError> {
        let mut all = Vec::new();
        for range in &self.ranges {
            let name = pool_name(self.network_name.as_deref(), range);
            let what = format!("get ippool {}/{name}", self.namespace);
            if let Reply::Ok(obj) = self
                .api
                .send(&what, Method::GET, &self.path("ippools", Some(&name))?, JSON, None)
                .map_err(unavailable)?
            {
                let pool = Pool::from_object(&name, &obj, range);
                all.extend(pool.allocations.iter().map(|(o, v)| self.allocation(range, *o, v)));
            }
        }
        Ok(all)
    }
}
