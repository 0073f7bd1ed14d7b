//! The node-local file store (default): one directory per allocation domain under `dataDir`.
//!
//! ```text
//! <dataDir>/.plexus-data                   the mark of a tenant's directory (plexus_node::datadir)
//! <dataDir>/<domain>/lock                  flock held for every operation
//! <dataDir>/<domain>/ips/<key>             one file per allocated address: the reservation
//! <dataDir>/<domain>/attachments/<cid>=<ifname>   the attachment's record: what it holds
//! <dataDir>/<domain>/pods/<ns>=<pod>=<ifname>     the record key of a pod's interface
//! <dataDir>/<domain>/cursors/<range>       next-fit cursor (a hint)
//! <dataDir>/<domain>/tmp/                  temp files; their leftovers swept under the lock
//! ```
//!
//! `dataDir` is the admin's (the default, a store profile's) or a tenant's data directory, which
//! is a marked direct child of a data root ([`plexus_node::datadir`]); it is opened beneath its
//! root without following symlinks, and so is every directory below. A domain's directories are
//! opened once its lock is held, and used through their descriptors. Temp files are created
//! `O_EXCL|O_NOFOLLOW`, the sweep removes only plexus's own temp names, and every file is
//! replaced by rename: nothing is ever written, read or removed through a planted symlink.
//!
//! ADD writes the record first (atomic rename), then links the address files into place, all
//! under the lock: a `kill -9` at any point leaves no address held without a record (no leak),
//! and a record's address whose file is missing is re-reserved or replaced by the next ADD of the
//! same attachment (no duplicate: an address is held only through its file, created with
//! `link(2)`, which fails when it exists). Per-operation cost does not grow with the pool.
//!
//! Nothing a config made outlives its attachments: a DEL, GC or failed ADD that leaves a domain
//! (a `network_name`) without records removes the domain (its cursor goes with it: next-fit then
//! starts over), and a tenant's directory without domains goes too. The admin's store keeps its
//! default domain, which no tenant chose, and so its cursor. A request waiting for a domain's lock while it
//! was removed finds its lock file unlinked and opens the domain anew. The lock is waited for at
//! most until the request's deadline (code 11).

mod domain;

use std::fs::{self, File};
use std::io::{ErrorKind, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use plexus_cni::Deadline;
use plexus_node::datadir::DataDir;
use plexus_node::files::{self, SafeDir};

use super::{AllocRequest, Allocation, Candidates, Held, Owner, Record, Store, key_safe};
use crate::error::{Holder, IpamError};
use crate::range::IpRange;
use domain::Domain;
use plexus_cni::env::attachment_key;

#[derive(Debug)]
pub struct FileStore {
    data: DataDir,
    domain: String,
    deadline: Deadline,
    /// The tenant's directory was removed by this store (it held nothing more).
    retired: AtomicBool,
}

/// A name safe as one path component (container IDs and ifnames are validated by the entry
/// point; pod namespaces and names come from CNI_ARGS and are checked here).
fn component_ok(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains(['/', '\0']) && s.len() <= 253
}

impl FileStore {
    /// The store of `domain` in `data` (the directory the config names, opened by the policy's
    /// rule), giving up on its lock at `deadline`.
    pub fn open(data: DataDir, domain: &str, deadline: Deadline) -> Result<FileStore, IpamError> {
        if !component_ok(domain) {
            return Err(IpamError::Store(format!("open store: invalid allocation domain {domain:?}")));
        }
        Ok(FileStore { data, domain: domain.to_string(), deadline, retired: AtomicBool::new(false) })
    }

    /// The store of `domain` in an admin's directory `dir` (created 0700 when missing), with the
    /// default request deadline: what a store profile names, and what tests use.
    pub fn open_admin(dir: &Path, domain: &str) -> Result<FileStore, IpamError> {
        let data = DataDir::admin(dir, true)
            .map_err(|e| IpamError::Store(format!("open store {}: {e}", dir.display())))?
            .expect("created");
        let limit = plexus_node::policy::Limits::default().request_timeout();
        FileStore::open(data, domain, Deadline::after(limit))
    }

    /// The store's directory, as configured.
    pub fn dir(&self) -> &Path {
        self.data.dir().shown()
    }

    /// The domain, locked; `None` when it does not exist and `create` is false.
    fn domain(&self, create: bool) -> Result<Option<Domain>, IpamError> {
        if self.retired.load(Ordering::SeqCst) {
            return match create {
                false => Ok(None),
                true => Err(IpamError::Store(format!(
                    "{}: removed, as it held nothing: open it again",
                    self.dir().display()
                ))),
            };
        }
        Domain::open(self.data.dir(), &self.domain, create, self.deadline)
    }

    /// After `domain` (locked) lost its last record: remove it, then the tenant's directory if it
    /// has no domain left. The default domain of the admin's store stays: it is no tenant's
    /// choice, and its cursor keeps a released address from coming round again at once.
    fn retire(&self, domain: Domain) {
        if !self.data.is_tenant() && self.domain == crate::config::DEFAULT_DOMAIN {
            return;
        }
        if domain.retire_if_empty(self.data.dir(), &self.domain) && self.data.retire_if_empty() {
            self.retired.store(true, Ordering::SeqCst);
        }
    }
}

impl Domain {
    /// A path made through one of the domain's directories, as the config named it.
    fn err_path(&self, path: &Path) -> String {
        [&self.ips, &self.attachments, &self.pods, &self.cursors, &self.tmp, &self.dir]
            .iter()
            .map(|d| d.show(path))
            .find(|p| p != path)
            .unwrap_or_else(|| path.to_path_buf())
            .display()
            .to_string()
    }

    fn err(&self, what: &str, path: &Path, e: std::io::Error) -> IpamError {
        IpamError::Store(format!("{what} {}: {e}", self.err_path(path)))
    }

    fn record_path(&self, container_id: &str, ifname: &str) -> PathBuf {
        self.attachments.join(attachment_key(container_id, ifname))
    }

    fn pod_path(&self, owner: &Owner) -> Option<PathBuf> {
        // The pod's namespace and name come from CNI_ARGS: one path component, or no index.
        owner.pod_key().filter(|k| component_ok(k)).map(|k| self.pods.join(k))
    }

    fn ip_key(ip: IpAddr, range: &str, overlapping: bool) -> String {
        if overlapping { ip.to_string() } else { format!("{}={ip}", key_safe(range)) }
    }

    fn ip_path(&self, key: &str) -> PathBuf {
        self.ips.join(key)
    }

    fn read_record(&self, path: &Path) -> Result<Option<Record>, IpamError> {
        match fs::read(path) {
            Ok(bytes) => {
                Record::refuse_later_format(&bytes, &self.err_path(path))?;
                serde_json::from_slice(&bytes)
                    .map(Some)
                    .map_err(|e| IpamError::Store(format!("corrupt record {}: {e}", self.err_path(path))))
            }
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.err("read", path, e)),
        }
    }

    fn write_record(&self, path: &Path, record: &Record) -> Result<(), IpamError> {
        self.write(path, &serde_json::to_vec(record).expect("record serializes"))
    }

    /// Atomic 0600 replace (temp file in tmp/, swept under the lock; rename). No fsync here: the
    /// lock is held, and [`FileStore::persist`] makes the change durable after it is released.
    fn write(&self, path: &Path, bytes: &[u8]) -> Result<(), IpamError> {
        files::replace_private_via(&self.tmp.path(), path, bytes)
            .map_err(|e| IpamError::Store(e.msg.replace(&path.display().to_string(), &self.err_path(path))))
    }

    /// Make the files of an operation (and the directories naming them) durable. Runs after the
    /// lock is released, so concurrent operations overlap their flushes; the plugin reports the
    /// result only after this returns. A `kill -9` needs none of it (renames and links are
    /// atomic); a power loss does.
    fn persist(&self, paths: &[PathBuf], dirs: &[&SafeDir]) -> Result<(), IpamError> {
        let mut parents: Vec<PathBuf> = dirs.iter().map(|d| d.path()).collect();
        for p in paths {
            if let Ok(f) = File::open(p) {
                f.sync_data().map_err(|e| self.err("sync", p, e))?;
            }
            if let Some(d) = p.parent()
                && !parents.iter().any(|known| known == d)
            {
                parents.push(d.to_path_buf());
            }
        }
        for d in &parents {
            File::open(d).and_then(|f| f.sync_all()).map_err(|e| self.err("sync", d, e))?;
        }
        Ok(())
    }

    /// Who holds address file `key` (its content is the holder's record name).
    fn holder(&self, key: &str) -> Option<String> {
        fs::read_to_string(self.ip_path(key)).ok()
    }

    /// The holder whose record is named `held` (an address file's content), as `asking` may see
    /// it in an error: its pod from its record.
    fn holder_seen(&self, held: &str, asking: &Owner) -> Holder {
        let record = self.read_record(&self.attachments.join(held)).ok().flatten();
        Holder::as_seen_by(record.as_ref().and_then(|r| r.owner.pod_ref.as_deref()), asking)
    }

    /// Reserve address file `key` for `holder`: false when it is taken.
    fn reserve(&self, key: &str, holder: &str) -> Result<bool, IpamError> {
        let tmp = self.tmp.join(files::temp_name(key));
        let mut f = files::create_private(&tmp).map_err(|e| self.err("create", &tmp, e))?;
        f.write_all(holder.as_bytes()).map_err(|e| self.err("write", &tmp, e))?;
        drop(f);
        let target = self.ip_path(key);
        let linked = fs::hard_link(&tmp, &target);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(self.err("reserve", &target, e)),
        }
    }

    fn cursor(&self, range: &IpRange) -> Option<u128> {
        fs::read_to_string(self.cursors.join(key_safe(&range.key()))).ok()?.trim().parse().ok()
    }

    fn set_cursor(&self, range: &IpRange, offset: u128) {
        let path = self.cursors.join(key_safe(&range.key()));
        // A hint: replaced by rename (never written through whatever sits at its name), never
        // synced; a lost cursor only moves next-fit back to the start of the range.
        let _ = files::replace_private_via(&self.tmp.path(), &path, offset.to_string().as_bytes());
    }

    /// Pick an address for `range` that is not held: the requested one, or next-fit.
    fn pick(
        &self,
        range: &IpRange,
        requested: Option<IpAddr>,
        owner: &Owner,
        overlapping: bool,
    ) -> Result<IpAddr, IpamError> {
        let key = range.key();
        if let Some(ip) = requested {
            return match self.holder(&Self::ip_key(ip, &key, overlapping)) {
                Some(h) if h != owner.key() => Err(IpamError::InUse { ip, holder: self.holder_seen(&h, owner) }),
                _ => Ok(ip),
            };
        }
        for offset in Candidates::after(range, self.cursor(range)) {
            // Every candidate taken so far: a wide range mostly held is still walked within the
            // request's deadline (the lock is everyone's).
            if self.deadline.passed() {
                return Err(IpamError::Unavailable(format!(
                    "range {}: no free address found by the deadline",
                    range.key()
                )));
            }
            let ip = range.addr(offset);
            if !self.ip_path(&Self::ip_key(ip, &key, overlapping)).exists() {
                self.set_cursor(range, offset);
                return Ok(ip);
            }
        }
        Err(IpamError::Exhausted { range: range.key() })
    }

    /// Whether any attachment still has a record here.
    fn attachments_left(&self) -> bool {
        fs::read_dir(self.attachments.path()).map_or(true, |mut e| e.next().is_some())
    }

    fn release_locked(&self, container_id: &str, ifname: &str) -> Result<Vec<Allocation>, IpamError> {
        let me = attachment_key(container_id, ifname);
        let path = self.record_path(container_id, ifname);
        let Some(record) = self.read_record(&path)? else { return Ok(Vec::new()) };
        let mut released = Vec::new();
        for held in &record.ips {
            for key in held_keys(held) {
                if self.holder(&key).as_deref() == Some(me.as_str()) {
                    let p = self.ip_path(&key);
                    unlink(&p).or_else(not_found_ok).map_err(|e| self.err("release", &p, e))?;
                }
            }
            released.push(Allocation { ip: held.ip, range: held.range.clone(), owner: record.owner.clone() });
        }
        if let Some(pod) = self.pod_path(&record.owner)
            && fs::read_to_string(&pod).ok().as_deref() == Some(me.as_str())
        {
            unlink(&pod).or_else(not_found_ok).map_err(|e| self.err("remove", &pod, e))?;
        }
        // The record goes last: a DEL that fails before this finds it again and finishes.
        unlink(&path).or_else(not_found_ok).map_err(|e| self.err("remove", &path, e))?;
        Ok(released)
    }

    /// ADD under the lock: the addresses, and the files to make durable after the lock.
    fn allocate_locked(&self, req: &AllocRequest<'_>) -> Result<(Vec<IpAddr>, Vec<PathBuf>), IpamError> {
        let owner = &req.owner;
        let me = owner.key();
        let record_path = self.record_path(&owner.container_id, &owner.ifname);
        // What this attachment holds already: its own record, or — after a sandbox re-creation —
        // the record of the same pod interface under its old container ID.
        let mut previous = self.read_record(&record_path)?;
        let mut moved_from = None;
        if previous.is_none()
            && let Some(pod) = self.pod_path(owner)
            && let Ok(old) = fs::read_to_string(&pod)
            && old != me
            && let Some((cid, ifn)) = old.split_once('=')
        {
            let old_path = self.record_path(cid, ifn);
            if let Some(rec) = self.read_record(&old_path)? {
                previous = Some(rec);
                moved_from = Some((old, old_path));
            }
        }
        let prior_holder = moved_from.as_ref().map(|(k, _)| k.clone()).unwrap_or_else(|| me.clone());
        let mut chosen = Vec::with_capacity(req.ranges.len());
        for (i, range) in req.ranges.iter().enumerate() {
            let key = range.key();
            let kept = previous.as_ref().and_then(|r| r.ips.iter().find(|h| h.range == key)).map(|h| h.ip);
            let ours_or_free = |ip: IpAddr| match self.holder(&Self::ip_key(ip, &key, req.overlapping)) {
                None => true,
                Some(h) => h == me || h == prior_holder,
            };
            let ip = match (req.requested[i], kept) {
                (Some(want), Some(k)) if want == k && ours_or_free(k) => k,
                (None, Some(k)) if ours_or_free(k) => k,
                (requested, _) => self.pick(range, requested, owner, req.overlapping)?,
            };
            chosen.push(Held { ip, range: key });
        }
        let mut touched: Vec<PathBuf> =
            chosen.iter().map(|h| self.ip_path(&Self::ip_key(h.ip, &h.range, req.overlapping))).collect();
        // Intent first: the record names every address before any is linked into place.
        self.write_record(&record_path, &Record::new(owner.clone(), chosen.clone()))?;
        for held in &chosen {
            let key = Self::ip_key(held.ip, &held.range, req.overlapping);
            match self.holder(&key) {
                Some(h) if h == me => {}
                Some(h) if h == prior_holder => {
                    // Hand the address over to the new container ID.
                    let p = self.ip_path(&key);
                    self.write(&p, me.as_bytes())?;
                }
                Some(h) => return Err(IpamError::InUse { ip: held.ip, holder: self.holder_seen(&h, owner) }),
                None => {
                    if !self.reserve(&key, &me)? {
                        return Err(IpamError::Store(format!("address {} was taken under the lock", held.ip)));
                    }
                }
            }
        }
        if let Some((_, old_path)) = moved_from {
            let _ = fs::remove_file(old_path);
        }
        if let Some(pod) = self.pod_path(owner) {
            self.write(&pod, me.as_bytes())?;
            touched.push(pod);
        }
        touched.push(record_path);
        Ok((chosen.into_iter().map(|h| h.ip).collect(), touched))
    }
}

fn not_found_ok(e: std::io::Error) -> std::io::Result<()> {
    if e.kind() == ErrorKind::NotFound { Ok(()) } else { Err(e) }
}

impl Store for FileStore {
    fn allocate(&self, req: &AllocRequest<'_>) -> Result<Vec<IpAddr>, IpamError> {
        let mut domain = match self.domain(true) {
            Ok(domain) => domain.expect("created"),
            Err(e) => {
                // Nothing half-made stays: not the domain (Domain::open), not a directory of a
                // tenant's that holds nothing else.
                self.data.retire_if_empty();
                return Err(e);
            }
        };
        let owner = &req.owner;
        let fresh = domain.read_record(&domain.record_path(&owner.container_id, &owner.ifname))?.is_none();
        match domain.allocate_locked(req) {
            Ok((ips, touched)) => {
                domain.unlock();
                domain.persist(&touched, &[])?;
                Ok(ips)
            }
            Err(e) => {
                // A failed ADD holds nothing: what this one wrote goes (an attachment that held
                // addresses before keeps them: its runtime DELs it), and so does a domain or a
                // directory it made.
                if fresh && let Err(undo) = domain.release_locked(&owner.container_id, &owner.ifname) {
                    tracing::warn!("undoing the failed ADD: {undo} (the runtime's DEL releases it)");
                }
                self.retire(domain);
                Err(e)
            }
        }
    }

    fn release(&self, container_id: &str, ifname: &str) -> Result<Vec<Allocation>, IpamError> {
        let Some(mut domain) = self.domain(false)? else {
            // Nothing to release; but a DEL killed after its domain went and before the tenant's
            // directory did left that directory empty: it goes now.
            self.data.retire_if_empty();
            return Ok(Vec::new());
        };
        let released = domain.release_locked(container_id, ifname)?;
        let record = domain.record_path(container_id, ifname);
        if domain.attachments_left() {
            domain.unlock();
            if !released.is_empty() {
                domain.persist(&[record], &[&domain.ips])?;
            }
        } else {
            // Its last attachment: the domain goes, and so may the tenant's directory.
            let store = self.data.dir().path();
            self.retire(domain);
            if let Ok(d) = File::open(&store) {
                let _ = d.sync_all();
            }
        }
        Ok(released)
    }

    fn holdings(&self, container_id: &str, ifname: &str) -> Result<Vec<Allocation>, IpamError> {
        let Some(domain) = self.domain(false)? else { return Ok(Vec::new()) };
        let me = attachment_key(container_id, ifname);
        let Some(record) = domain.read_record(&domain.record_path(container_id, ifname))? else {
            return Ok(Vec::new());
        };
        Ok(record
            .ips
            .iter()
            .filter(|h| held_keys(h).iter().any(|k| domain.holder(k).as_deref() == Some(me.as_str())))
            .map(|h| Allocation { ip: h.ip, range: h.range.clone(), owner: record.owner.clone() })
            .collect())
    }

    fn list(&self) -> Result<Vec<Allocation>, IpamError> {
        let Some(domain) = self.domain(false)? else { return Ok(Vec::new()) };
        let dir = domain.attachments.path();
        let mut out = Vec::new();
        for entry in fs::read_dir(&dir).map_err(|e| domain.err("list", &dir, e))?.flatten() {
            let record = match domain.read_record(&entry.path()) {
                // A later plexus's record: not listed, left as it is (a whole domain is not
                // unlisted for one record).
                Err(IpamError::Format(e)) => {
                    tracing::warn!("{e}");
                    continue;
                }
                other => other?,
            };
            if let Some(record) = record {
                let me = record.owner.key();
                for h in &record.ips {
                    let held = held_keys(h).iter().any(|k| domain.holder(k).as_deref() == Some(me.as_str()));
                    if held {
                        out.push(Allocation { ip: h.ip, range: h.range.clone(), owner: record.owner.clone() });
                    }
                }
            }
        }
        out.sort_by_key(|a| a.ip);
        Ok(out)
    }
}

/// Remove a store file (a write to the store: it passes a fault-injection point).
fn unlink(path: &Path) -> std::io::Result<()> {
    plexus_node::fault::at(plexus_node::fault::Point::FileWrite)?;
    fs::remove_file(path)
}

/// The two address-file keys a held address may be filed under (overlapping ranges: the bare
/// address; otherwise per range, see [`Domain::ip_key`]).
fn held_keys(h: &Held) -> [String; 2] {
    [Domain::ip_key(h.ip, &h.range, true), Domain::ip_key(h.ip, &h.range, false)]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use plexus_node::Policy;
    use plexus_node::datadir::Kind;

    use super::*;

    fn soon() -> Deadline {
        Deadline::after(Duration::from_secs(5))
    }

    /// A tenant's data directory under a data root of `root`, made and marked: its path and the
    /// open directory.
    fn tenant_dir(root: &std::path::Path) -> (std::path::PathBuf, DataDir) {
        let policy = Policy::parse(serde_json::json!({"dataRoots": [root]}).to_string().as_bytes()).unwrap();
        let dir = root.join("team-a-ipam");
        let data =
            policy.data_dir("dataDir", &dir, Kind::IpamFileStore, Some("team-a"), true, soon()).unwrap().unwrap();
        (dir, data)
    }

    /// A DEL killed after its domain went and before the tenant's directory did (its parent
    /// plugin killed: the delegate dies with it): the runtime's next DEL finds nothing to release
    /// and removes the directory.
    #[test]
    fn a_release_that_finds_no_domain_removes_a_tenant_directory_left_empty() {
        let root = tempfile::tempdir().unwrap();
        let (dir, data) = tenant_dir(root.path());
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1, "its mark alone");
        let store = FileStore::open(data, "default", soon()).unwrap();
        assert!(store.release("c1", "net1").unwrap().is_empty());
        assert!(!dir.exists());
    }

    /// An ADD killed after it made its domain's directory and before its lock (CI's fault
    /// injection, under load): the domain never held anything, and the runtime's DEL removes it
    /// and the tenant's directory.
    #[test]
    fn a_release_that_finds_a_domain_without_its_lock_removes_it_and_the_tenant_directory() {
        let root = tempfile::tempdir().unwrap();
        let (dir, data) = tenant_dir(root.path());
        fs::create_dir(dir.join("default")).unwrap();
        let store = FileStore::open(data, "default", soon()).unwrap();
        assert!(store.release("c1", "net1").unwrap().is_empty());
        assert!(!dir.exists());
    }
}
