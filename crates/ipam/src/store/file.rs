//! The node-local file store (default): one directory per allocation domain under `dataDir`.
//!
//! ```text
//! <dataDir>/<domain>/lock                  flock held for every operation
//! <dataDir>/<domain>/ips/<key>             one file per allocated address: the reservation
//! <dataDir>/<domain>/attachments/<cid>=<ifname>   the attachment's record: what it holds
//! <dataDir>/<domain>/pods/<ns>=<pod>=<ifname>     the record key of a pod's interface
//! <dataDir>/<domain>/cursors/<range>       next-fit cursor (a hint)
//! <dataDir>/<domain>/tmp/                  temp files; their leftovers swept under the lock
//! ```
//!
//! `dataDir` is opened beneath its allowed root without following symlinks, and so is every
//! directory above; each is then used through its open descriptor. Temp files are created
//! `O_EXCL|O_NOFOLLOW`, the sweep removes only plexus's own temp names, and every file is
//! replaced by rename: nothing is ever written, read or removed through a planted symlink.
//!
//! ADD writes the record first (atomic rename), then links the address files into place, all
//! under the lock: a `kill -9` at any point leaves no address held without a record (no leak),
//! and a record's address whose file is missing is re-reserved or replaced by the next ADD of the
//! same attachment (no duplicate: an address is held only through its file, created with
//! `link(2)`, which fails when it exists). Per-operation cost does not grow with the pool.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use plexus_cni::files::{self, SafeDir};

use super::{AllocRequest, Allocation, Candidates, Held, Owner, Record, Store, key_safe};
use crate::error::IpamError;
use crate::range::IpRange;
use plexus_cni::env::attachment_key;

#[derive(Debug)]
pub struct FileStore {
    dir: SafeDir,
    ips: SafeDir,
    attachments: SafeDir,
    pods: SafeDir,
    cursors: SafeDir,
    tmp: SafeDir,
}

/// A name safe as one path component (container IDs and ifnames are validated by the entry
/// point; pod namespaces and names come from CNI_ARGS and are checked here).
fn component_ok(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains(['/', '\0']) && s.len() <= 253
}

impl FileStore {
    /// The store of `domain` in `data_dir`, which lies beneath `root` (the policy's data root):
    /// opened without following symlinks, created 0700 where missing.
    pub fn open(data_dir: &Path, root: &Path, domain: &str) -> Result<FileStore, IpamError> {
        let opened = |e: std::io::Error| IpamError::Store(format!("open store: {e}"));
        FileStore::open_dirs(data_dir, root, domain, true).map_err(opened)
    }

    /// The store if it exists, without creating anything (DEL on a store that was never written,
    /// also on a read-only file system): `None` when it does not exist.
    pub fn open_existing(data_dir: &Path, root: &Path, domain: &str) -> Result<Option<FileStore>, IpamError> {
        match FileStore::open_dirs(data_dir, root, domain, false) {
            Ok(store) => Ok(Some(store)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(IpamError::Store(format!("open store: {e}"))),
        }
    }

    fn open_dirs(data_dir: &Path, root: &Path, domain: &str, create: bool) -> std::io::Result<FileStore> {
        if !component_ok(domain) {
            return Err(std::io::Error::new(ErrorKind::InvalidInput, format!("invalid allocation domain {domain:?}")));
        }
        let dir = SafeDir::open_beneath(root, data_dir, create)?.subdir(domain, create)?;
        let sub = |name: &str| dir.subdir(name, create);
        let (ips, attachments, pods, cursors, tmp) =
            (sub("ips")?, sub("attachments")?, sub("pods")?, sub("cursors")?, sub("tmp")?);
        Ok(FileStore { dir, ips, attachments, pods, cursors, tmp })
    }

    /// The store's directory, as configured.
    pub fn dir(&self) -> &Path {
        self.dir.shown()
    }

    /// A path made through one of the store's directories, as the config named it.
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

    /// Take the domain lock; leftovers of killed processes in tmp/ (plexus's own temp names
    /// only) are removed.
    fn lock(&self) -> Result<File, IpamError> {
        let path = self.dir.join("lock");
        let nofollow = nix::fcntl::OFlag::O_NOFOLLOW.bits();
        // A read-only file system still takes a lock on a file opened for reading (DEL of
        // nothing must succeed there).
        let f = match OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(nofollow)
            .open(&path)
        {
            Err(e) if e.kind() == ErrorKind::ReadOnlyFilesystem => {
                OpenOptions::new().read(true).custom_flags(nofollow).open(&path)
            }
            other => other,
        }
        .map_err(|e| self.err("open", &path, e))?;
        f.lock().map_err(|e| self.err("lock", &path, e))?;
        if let Ok(entries) = fs::read_dir(self.tmp.path()) {
            for e in entries.flatten() {
                if files::is_temp_name(&e.file_name().to_string_lossy()) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
        Ok(f)
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
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| IpamError::Store(format!("corrupt record {}: {e}", self.err_path(path)))),
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
        me: &str,
        overlapping: bool,
    ) -> Result<IpAddr, IpamError> {
        let key = range.key();
        if let Some(ip) = requested {
            return match self.holder(&Self::ip_key(ip, &key, overlapping)) {
                Some(h) if h != me => Err(IpamError::InUse { ip, holder: h }),
                _ => Ok(ip),
            };
        }
        for offset in Candidates::after(range, self.cursor(range)) {
            let ip = range.addr(offset);
            if !self.ip_path(&Self::ip_key(ip, &key, overlapping)).exists() {
                self.set_cursor(range, offset);
                return Ok(ip);
            }
        }
        Err(IpamError::Exhausted { range: range.key() })
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
                (requested, _) => self.pick(range, requested, &me, req.overlapping)?,
            };
            chosen.push(Held { ip, range: key });
        }
        let mut touched: Vec<PathBuf> =
            chosen.iter().map(|h| self.ip_path(&Self::ip_key(h.ip, &h.range, req.overlapping))).collect();
        // Intent first: the record names every address before any is linked into place.
        self.write_record(&record_path, &Record { owner: owner.clone(), ips: chosen.clone() })?;
        for held in &chosen {
            let key = Self::ip_key(held.ip, &held.range, req.overlapping);
            match self.holder(&key) {
                Some(h) if h == me => {}
                Some(h) if h == prior_holder => {
                    // Hand the address over to the new container ID.
                    let p = self.ip_path(&key);
                    self.write(&p, me.as_bytes())?;
                }
                Some(h) => return Err(IpamError::InUse { ip: held.ip, holder: h }),
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
        let lock = self.lock()?;
        let (ips, touched) = self.allocate_locked(req)?;
        drop(lock);
        self.persist(&touched, &[])?;
        Ok(ips)
    }

    fn release(&self, container_id: &str, ifname: &str) -> Result<Vec<Allocation>, IpamError> {
        let lock = self.lock()?;
        let released = self.release_locked(container_id, ifname)?;
        drop(lock);
        if !released.is_empty() {
            self.persist(&[self.record_path(container_id, ifname)], &[&self.ips])?;
        }
        Ok(released)
    }

    fn holdings(&self, container_id: &str, ifname: &str) -> Result<Vec<Allocation>, IpamError> {
        let _lock = self.lock()?;
        let me = attachment_key(container_id, ifname);
        let Some(record) = self.read_record(&self.record_path(container_id, ifname))? else { return Ok(Vec::new()) };
        Ok(record
            .ips
            .iter()
            .filter(|h| held_keys(h).iter().any(|k| self.holder(k).as_deref() == Some(me.as_str())))
            .map(|h| Allocation { ip: h.ip, range: h.range.clone(), owner: record.owner.clone() })
            .collect())
    }

    fn list(&self) -> Result<Vec<Allocation>, IpamError> {
        let _lock = self.lock()?;
        let dir = self.attachments.path();
        let mut out = Vec::new();
        for entry in fs::read_dir(&dir).map_err(|e| self.err("list", &dir, e))?.flatten() {
            if let Some(record) = self.read_record(&entry.path())? {
                let me = record.owner.key();
                for h in &record.ips {
                    let held = held_keys(h).iter().any(|k| self.holder(k).as_deref() == Some(me.as_str()));
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
    plexus_cni::fault::at(plexus_cni::fault::Point::FileWrite)?;
    fs::remove_file(path)
}

/// The two address-file keys a held address may be filed under (overlapping ranges: the bare
/// address; otherwise per range, see [`FileStore::ip_key`]).
fn held_keys(h: &Held) -> [String; 2] {
    [FileStore::ip_key(h.ip, &h.range, true), FileStore::ip_key(h.ip, &h.range, false)]
}
