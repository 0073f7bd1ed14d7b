//! The node's writers taking turns: the node's lock (a file in the policy's data root) and, when
//! the network asks for it, whereabouts' Lease; the spool, through which whoever has the turn
//! commits every waiting request in one write ([`KubernetesStore::commit_batch`]); and the
//! retries of a step while the API is unavailable.

use std::fs::{File, TryLockError};
use std::path::Path;
use std::time::{Duration, Instant};

use super::{ANSWER_POLL, ANSWER_POLL_MAX, KubernetesStore, Read, not_past, unavailable};
use crate::error::IpamError;
use crate::range::IpRange;
use crate::store::Owner;
use crate::store::kubernetes::batch::{Request, plan_batch, plan_batch_in_lane};
use crate::store::kubernetes::names::pool_name;
use crate::store::kubernetes::spool::{Answer, Kind, Spool, Ticket, turn_file};

impl KubernetesStore {
    /// Commit [`plan_batch`] for `requests`, reading the pool again (from etcd) whenever another
    /// writer changed it in between (a failed `test`); each request's answer. The first read is
    /// the watch cache's: the patch `test`s every answer, so a stale read fails it instead of
    /// handing out what it shows; what no `test` can check is believed only from etcd.
    pub(super) fn commit_batch(
        &self,
        range: &IpRange,
        requests: &[Request<'_>],
        deadline: Instant,
    ) -> Result<Vec<Answer>, IpamError> {
        let mut read = Read::Cached;
        // A pool is created for an ADD only: a batch of DELs on a missing pool releases nothing.
        let create = requests.iter().any(|(k, _)| *k == Kind::Add);
        // Once a write met another's, new offsets come from this node's lane.
        let mut met = false;
        loop {
            not_past(deadline, range)?;
            let Some(pool) = self.pool(range, read, create)? else {
                return Ok(requests.iter().map(|_| Answer::Released { offsets: Vec::new() }).collect());
            };
            let plan =
                if met { plan_batch_in_lane(&pool, range, requests) } else { plan_batch(&pool, range, requests) };
            if !(plan.unguarded && read == Read::Cached)
                && (plan.ops.is_empty() || self.patch_pool(&pool.name, &plan.ops)?)
            {
                return Ok(plan.answers);
            }
            met |= read == Read::Latest; // a failed test against etcd's copy: another writer
            read = Read::Latest;
        }
    }

    /// This node's spool for `range`'s pool, and `owner`'s request of `kind` in it; `None`
    /// (after saying why) when the request is to go without it.
    pub(super) fn enqueue(&self, range: &IpRange, kind: Kind, owner: &Owner) -> Option<(Spool, Ticket)> {
        let dir = self.node_lock_dir.as_path();
        let pool = pool_name(self.network_name.as_deref(), range);
        let spool = Spool::open(dir, &self.namespace, &pool, &format!("{range:?}"));
        match spool.and_then(|s| s.enqueue(kind, owner).map(|t| t.map(|t| (s, t)))) {
            Ok(queued) => queued,
            Err(e) => {
                tracing::warn!("spool of ippool {pool} in {}: {e}: going alone", dir.display());
                None
            }
        }
    }

    /// `owner`'s request of `kind` on `range`'s pool, served by whoever has the node's turn
    /// (maybe this process) together with every other request waiting; `None` when the spool
    /// cannot take it (the caller goes alone).
    pub(super) fn through_spool(
        &self,
        range: &IpRange,
        kind: Kind,
        owner: &Owner,
        deadline: Instant,
    ) -> Option<Result<Answer, IpamError>> {
        let (spool, ticket) = self.enqueue(range, kind, owner)?;
        // The answer a leader leaves, or the turn to be the leader: whichever comes first. A
        // served request goes on without waiting for the turn (behind the next leader's write).
        let served = || -> Result<Answer, IpamError> {
            let mut pause = ANSWER_POLL;
            loop {
                if let Some(answer) = ticket.answer() {
                    return Ok(answer);
                }
                let Some(_turn) = self.turn(range, None)? else {
                    not_past(deadline, range)?;
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(ANSWER_POLL_MAX);
                    continue;
                };
                if let Some(answer) = ticket.answer() {
                    return Ok(answer);
                }
                let waiting = spool.waiting(&ticket).unwrap_or_else(|e| {
                    tracing::warn!("spool of range {}: {e}: serving this request alone", range.network);
                    Vec::new()
                });
                let requests: Vec<Request<'_>> =
                    std::iter::once((kind, owner)).chain(waiting.iter().map(|w| (w.kind, &w.owner))).collect();
                let answers = self.commit_batch(range, &requests, deadline)?;
                if !waiting.is_empty() {
                    tracing::debug!(served = waiting.len(), range = %range.network, "one write for the requests waiting");
                }
                for (w, a) in waiting.iter().zip(&answers[1..]) {
                    if let Err(e) = spool.answer(w, a) {
                        // It is served again when its turn comes (every plan is idempotent).
                        tracing::warn!("answer for {}: {e}", w.owner.container_id);
                    }
                }
                return Ok(answers[0].clone());
            }
        };
        Some(served())
    }

    /// `step` again while the API is unavailable (a timeout under load, a restart), until the
    /// deadline; every step is idempotent (it reads what it finds first).
    pub(super) fn retrying<T>(
        &self,
        deadline: Instant,
        mut step: impl FnMut() -> Result<T, IpamError>,
    ) -> Result<T, IpamError> {
        let mut pause = Duration::from_millis(50 + u64::from(crate::store::spread() % 50));
        loop {
            match step() {
                Err(IpamError::Unavailable(m)) if Instant::now() + pause < deadline => {
                    tracing::info!("{m}: again in {pause:?}");
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                other => return other,
            }
        }
    }

    /// This node's turn on `range`'s pool (a file lock beneath the policy's data root,
    /// [`turn_file`]: the node's writers of one pool one at a time, its other pools and other
    /// nodes concurrently), held until the files drop; waited for until `wait` (code 11 then),
    /// or with `None` given up at once when another writer has it.
    ///
    /// It also holds, shared, the one turn of the whole node that releases before this one took
    /// (`.plexus-ipam-kubernetes.lock`, which they lock exclusively): this release's writers go
    /// side by side on it, and during a rollout or a rollback a writer of the other release
    /// never leads the same spool at the same time as one of this release's.
    pub(super) fn turn(&self, range: &IpRange, wait: Option<Instant>) -> Result<Option<[std::fs::File; 2]>, IpamError> {
        let node = self.node_lock_dir.join(NODE_TURN);
        let Some(node) = take(&node, wait, true, range)? else { return Ok(None) };
        let pool = turn_file(&self.node_lock_dir, &self.namespace, &pool_name(self.network_name.as_deref(), range));
        Ok(take(&pool, wait, false, range)?.map(|pool| [node, pool]))
    }

    /// Run `f` with this node's turn on `range`'s pool and, when the network asks for it, whereabouts' Lease.
    pub(super) fn locked<T>(
        &self,
        range: &IpRange,
        owner: &str,
        deadline: Instant,
        f: impl FnOnce() -> Result<T, IpamError>,
    ) -> Result<T, IpamError> {
        let _turn = self.turn(range, Some(deadline))?;
        if !self.leader_election {
            return f();
        }
        let lease = crate::store::kubernetes::lease::Lease::acquire(&self.api, &self.namespace, owner, deadline)?;
        let out = f();
        lease.release(&self.api);
        out
    }
}

/// The whole node's turn of the releases before per-pool turns; see [`KubernetesStore::turn`].
const NODE_TURN: &str = ".plexus-ipam-kubernetes.lock";

/// The lock on `path` (made 0600 when missing), shared or exclusive, waited for until `wait` or
/// tried once; `None` when another holds it.
fn take(path: &Path, wait: Option<Instant>, shared: bool, range: &IpRange) -> Result<Option<File>, IpamError> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(dir) = path.parent().filter(|d| !d.exists()) {
        let _ = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir);
    }
    let open = |write: bool| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .create(write)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(path)
    };
    let failed = |e: std::io::Error| IpamError::Store(format!("node lock {}: {e}", path.display()));
    // A read-only root still takes a lock on a file opened for reading (DEL must work).
    let file = open(true)
        .or_else(|e| if e.raw_os_error() == Some(nix::libc::EROFS) { open(false) } else { Err(e) })
        .map_err(failed)?;
    if let Some(until) = wait {
        let taken = match shared {
            true => plexus_cni::deadline::lock_shared_until(&file, until.into()),
            false => plexus_cni::deadline::lock_until(&file, until.into()),
        };
        return match taken.map_err(failed)? {
            true => Ok(Some(file)),
            false => Err(unavailable(format!(
                "this node's turn on range {} ({}) is still taken at this request's deadline",
                range.network,
                path.display()
            ))),
        };
    }
    match if shared { file.try_lock_shared() } else { file.try_lock() } {
        Ok(()) => Ok(Some(file)),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Error(e)) => Err(failed(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::range::{IpRange, RangeSpec};

    #[test]
    fn this_releases_writers_share_the_old_node_turn_and_an_old_writer_holding_it_keeps_them_out() {
        let dir = tempfile::tempdir().unwrap();
        let range = IpRange::parse(&RangeSpec { range: "198.18.0.0/24", ..Default::default() }).unwrap();
        let node = dir.path().join(NODE_TURN);
        // Two of this release's writers (of two pools) at once.
        let a = take(&node, None, true, &range).unwrap().expect("shared");
        let b = take(&node, None, true, &range).unwrap().expect("shared beside it");
        drop((a, b));
        // A writer of the release before holds the whole node: nobody of this release leads.
        let old = File::open(&node).unwrap();
        old.lock().unwrap();
        assert!(take(&node, None, true, &range).unwrap().is_none());
        let soon = Instant::now() + Duration::from_millis(50);
        let e = take(&node, Some(soon), true, &range).unwrap_err();
        assert!(e.to_string().contains("still taken at this request's deadline"), "{e}");
        drop(old);
        assert!(take(&node, None, true, &range).unwrap().is_some());
    }
}
