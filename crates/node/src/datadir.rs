//! Data directories a network config names: plexus-ipam's file store (`dataDir`,
//! `store.file.dataDir`) and plexus-host-device's state (`dataDir`). A NAD is tenant-written, so
//! where such a directory may be is the node policy's, and no tenant's directory may lie inside
//! another store's tree (where a planted directory would block an address, a lock or a pod).
//!
//! The rule:
//! - the plugin's default directory (it must lie beneath a data root) is the admin's: its children
//!   are that store's own (plexus-ipam's domains, plexus-host-device's state files);
//! - any other directory is a *tenant data directory*: a direct child of a data root that is not a
//!   plugin's default directory, not named `.plexus*` (names plexus keeps in a root for itself).
//!   plexus creates it 0700 and marks it (a file [`MARK`]: its kind, and for the operator the
//!   namespace of the pod it was made for), uses it only as what its mark says, and takes an
//!   unmarked one only when it is empty or holds only what an earlier plexus made there (then
//!   marks it). Which pods may share a store's addresses is the policy's `allow.ranges`, not the
//!   directory: a NAD of a global namespace serves pods of every namespace;
//! - a tenant data directory goes when nothing is left in it ([`DataDir::retire_if_empty`]): DEL,
//!   GC and a failed ADD leave no directory a config made. While a request uses one it holds its
//!   mark locked shared; every request leaving lets its lock go and then looks, so the last one
//!   out finds it empty and removes it under an exclusive lock, and a request that finds the mark
//!   it locked removed starts over.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsFd;
use std::path::Path;
use std::time::Duration;

use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, fstat};
use nix::unistd::{UnlinkatFlags, linkat, unlinkat};
use serde::{Deserialize, Serialize};

use crate::files::SafeDir;
use crate::paths;
use crate::policy::Policy;
use plexus_cni::deadline::Deadline;
use plexus_cni::error::Error;

/// The mark of a tenant data directory: its kind and owner, and the lock its users share.
pub const MARK: &str = ".plexus-data";

/// How many times opening a tenant data directory starts over (it was removed meanwhile).
const ATTEMPTS: usize = 8;

/// What a data directory holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    /// plexus-ipam's file store: one directory per allocation domain.
    #[serde(rename = "plexus-ipam file store")]
    IpamFileStore,
    /// plexus-host-device's state files.
    #[serde(rename = "plexus-host-device state")]
    HostDeviceState,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::IpamFileStore => "plexus-ipam file store",
            Kind::HostDeviceState => "plexus-host-device state",
        }
    }

    /// The plugin's own default directory (the admin's).
    pub fn default_dir(self) -> &'static Path {
        Path::new(match self {
            Kind::IpamFileStore => paths::IPAM_DATA_DIR,
            Kind::HostDeviceState => paths::HOST_DEVICE_DATA_DIR,
        })
    }

    /// Whether `entry` (a name in the directory, and whether it is a directory) is something a
    /// store of this kind makes: what an earlier plexus, before marks, left in a tenant's
    /// directory (such a directory is adopted).
    fn made_by(self, entry: &str, is_dir: bool) -> bool {
        match self {
            // Allocation domains: network names.
            Kind::IpamFileStore => is_dir && plexus_cni::env::validate_network_name(entry).is_ok(),
            // State files: `<containerID>=<ifname>`.
            Kind::HostDeviceState => {
                !is_dir
                    && entry.split_once('=').is_some_and(|(c, i)| {
                        plexus_cni::env::validate_container_id(c).is_ok() && plexus_cni::env::validate_ifname(i).is_ok()
                    })
            }
        }
    }
}

/// What a mark says.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Mark {
    kind: Kind,
    /// The namespace of the pod it was made for ("" for a request naming none), for an operator
    /// looking at it.
    #[serde(default)]
    namespace: String,
}

/// A data directory, open: the admin's, or a tenant's with its mark locked shared.
#[derive(Debug)]
pub struct DataDir {
    dir: SafeDir,
    tenant: Option<TenantDir>,
}

#[derive(Debug)]
struct TenantDir {
    root: SafeDir,
    name: String,
    mark: File,
    /// Whether the request has left it ([`DataDir::retire_if_empty`] ran).
    left: std::sync::atomic::AtomicBool,
}

impl Drop for DataDir {
    fn drop(&mut self) {
        self.retire_if_empty();
    }
}

impl DataDir {
    /// The directory, through its open descriptor.
    pub fn dir(&self) -> &SafeDir {
        &self.dir
    }

    /// Whether it is a tenant's (removed when empty) rather than the admin's.
    pub fn is_tenant(&self) -> bool {
        self.tenant.is_some()
    }

    /// An admin's directory (a store profile's): opened as it is (created 0700 when missing and
    /// `create`), never marked, never removed; `Ok(None)` when missing and not `create`.
    pub fn admin(path: &Path, create: bool) -> std::io::Result<Option<DataDir>> {
        match SafeDir::open_beneath(path, path, create) {
            Ok(dir) => Ok(Some(DataDir { dir, tenant: None })),
            Err(e) if e.kind() == ErrorKind::NotFound && !create => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Remove a tenant's directory when nothing but its mark is left in it and no other request
    /// uses it; `true` when it is gone. The admin's directories stay. This is a request's last
    /// use of the directory (it also runs when the [`DataDir`] is dropped, once): its lock on the
    /// mark goes first, then the directory is looked at, so of requests leaving at once the last
    /// to look sees what the others left and holds nobody up — the one that emptied it need not
    /// outwait a slower one still inside, who removes it on its way out.
    pub fn retire_if_empty(&self) -> bool {
        let Some(t) = &self.tenant else { return false };
        if t.left.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        let _ = t.mark.unlock();
        if !entries(&self.dir).is_ok_and(|e| e.is_empty()) {
            return false;
        }
        // Empty when looked at: taken alone (a moment's wait for one that looked at the same
        // time, or one arriving), and looked at again.
        let within = Deadline::after(Duration::from_millis(50));
        if !plexus_cni::deadline::lock_until(&t.mark, within).unwrap_or(false) {
            return false;
        }
        // A file system mounted on it (an admin's doing) keeps it: it could not be removed, and
        // its mark must not be lost trying.
        let mounted = match (fstat(self.dir.as_fd()), fstat(t.root.as_fd())) {
            (Ok(dir), Ok(root)) => dir.st_dev != root.st_dev,
            _ => true,
        };
        if mounted || !entries(&self.dir).is_ok_and(|e| e.is_empty()) {
            let _ = t.mark.unlock();
            return false;
        }
        // Temp files a killed request left (one marking the directory meanwhile retries).
        remove_temp_files(&self.dir);
        let removed = unlinkat(self.dir.as_fd(), MARK, UnlinkatFlags::NoRemoveDir)
            .and_then(|()| unlinkat(t.root.as_fd(), t.name.as_str(), UnlinkatFlags::RemoveDir));
        match removed {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!("{} not removed: {e}", self.dir.shown().display());
                // Something else is in it after all (or it is a mount point): it keeps its mark.
                if let Some(mark) = read_mark(&t.mark) {
                    let _ = write_mark(&self.dir, &mark);
                }
                let _ = t.mark.unlock();
                false
            }
        }
    }
}

/// Remove the temp files of plexus's in `dir` (left by killed requests), through the directory's
/// descriptor (an unlink never follows a link).
fn remove_temp_files(dir: &SafeDir) {
    for e in std::fs::read_dir(dir.path()).into_iter().flatten().flatten() {
        if crate::files::is_temp_name(&e.file_name().to_string_lossy()) {
            let _ = unlinkat(dir.as_fd(), e.file_name().as_os_str(), UnlinkatFlags::NoRemoveDir);
        }
    }
}

/// The names in `dir` other than its mark and plexus's temp files.
fn entries(dir: &SafeDir) -> std::io::Result<Vec<(String, bool)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir.path())? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name == MARK || crate::files::is_temp_name(&name) {
            continue;
        }
        out.push((name, e.file_type().is_ok_and(|t| t.is_dir())));
    }
    Ok(out)
}

fn read_mark(file: &File) -> Option<Mark> {
    let mut text = Vec::new();
    file.take(4096).read_to_end(&mut text).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Mark `dir`: written whole beside it, then linked into place (a mark is never seen half
/// written; two requests marking at once, one wins). `false` when a mark was there first.
fn write_mark(dir: &SafeDir, mark: &Mark) -> std::io::Result<bool> {
    let temp = crate::files::temp_name(MARK);
    let path = dir.join(&temp);
    let written = crate::files::create_private(&path)
        .and_then(|mut f| f.write_all(&serde_json::to_vec(mark).map_err(std::io::Error::other)?));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    let linked = linkat(dir.as_fd(), temp.as_str(), dir.as_fd(), MARK, AtFlags::empty());
    let _ = std::fs::remove_file(&path);
    match linked {
        Ok(()) => Ok(true),
        Err(nix::errno::Errno::EEXIST) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

impl Policy {
    /// The data directory `path` of kind `kind` that config key `key` names, for a pod of
    /// `namespace`, by the rule of this module: opened beneath its data root without following
    /// symlinks, created (0700, marked when a tenant's) when missing and `create`; `Ok(None)`
    /// when it does not exist and `create` is false. Code 7 naming the key, the value and the
    /// rule when it may not be used.
    pub fn data_dir(
        &self,
        key: &str,
        path: &Path,
        kind: Kind,
        namespace: Option<&str>,
        create: bool,
        deadline: Deadline,
    ) -> Result<Option<DataDir>, Error> {
        let shown = path.display().to_string();
        let io = |e: std::io::Error| Error::io(format!("{key} {shown:?}: {e}"));
        if path == kind.default_dir() {
            let root = self.data_root(key, path)?;
            return match SafeDir::open_beneath(root, path, create) {
                Ok(dir) => Ok(Some(DataDir { dir, tenant: None })),
                Err(e) if e.kind() == ErrorKind::NotFound && !create => Ok(None),
                Err(e) => Err(io(e)),
            };
        }
        let (root, name) = match self.tenant_place(key, path) {
            Ok(place) => place,
            Err(refused) if !create => return self.earlier_dir(key, path, refused),
            Err(refused) => return Err(refused),
        };
        let want = Mark { kind, namespace: namespace.unwrap_or_default().to_string() };
        for _ in 0..ATTEMPTS {
            let root_dir = SafeDir::open_beneath(root, root, create).map_err(io)?;
            // A directory made here and left unmarked (the mark could not be written) goes again.
            let made = create && root_dir.subdir(name, false).is_err_and(|e| e.kind() == ErrorKind::NotFound);
            let unmake = |e: Error| {
                if made {
                    let _ = unlinkat(root_dir.as_fd(), name, UnlinkatFlags::RemoveDir);
                }
                e
            };
            let dir = match root_dir.subdir(name, create) {
                Ok(d) => d,
                Err(e) if e.kind() == ErrorKind::NotFound && !create => return Ok(None),
                // Removed between its creation and here: again.
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(io(e)),
            };
            let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            let mark = match openat(dir.as_fd(), MARK, flags, Mode::empty()) {
                Ok(fd) => File::from(fd),
                Err(nix::errno::Errno::ENOENT) => {
                    let found = entries(&dir).map_err(io)?;
                    let adoptable = found.iter().all(|(n, is_dir)| kind.made_by(n, *is_dir));
                    if !adoptable {
                        let refused = self.not_ours(key, path, "it is not empty and carries no plexus mark");
                        return if create { Err(refused) } else { self.earlier_dir(key, path, refused) };
                    }
                    if found.is_empty() && !create {
                        // Unmarked with nothing in it but plexus's temp files, if that: a request
                        // was killed between making it and marking it. It goes, with them (one
                        // making or marking it meanwhile finds it gone and starts over).
                        remove_temp_files(&dir);
                        let _ = unlinkat(root_dir.as_fd(), name, UnlinkatFlags::RemoveDir);
                        return Ok(None);
                    }
                    match write_mark(&dir, &want) {
                        Ok(_) => continue,
                        Err(e) if e.kind() == ErrorKind::NotFound => continue,
                        Err(e) => return Err(unmake(io(e))),
                    }
                }
                Err(e) => return Err(io(e.into())),
            };
            let Some(found) = read_mark(&mark) else {
                return Err(self.not_ours(key, path, &format!("its {MARK} cannot be read")));
            };
            if found.kind != kind {
                return Err(self.not_ours(key, path, &format!("it is a {}", found.kind.name())));
            }
            if !plexus_cni::deadline::lock_shared_until(&mark, deadline).map_err(io)? {
                return Err(deadline.expired(format!("{key} {shown:?}: waiting for its mark")));
            }
            // Removed by its last user between our open and our lock: again, from the root.
            if fstat(mark.as_fd()).map(|s| s.st_nlink).unwrap_or(0) == 0 {
                continue;
            }
            return Ok(Some(DataDir {
                dir,
                tenant: Some(TenantDir { root: root_dir, name: name.to_string(), mark, left: Default::default() }),
            }));
        }
        Err(Error::try_again_later(format!("{key} {shown:?}: removed and made again {ATTEMPTS} times meanwhile")))
    }

    /// Where a tenant data directory `path` may be: the data root it is a direct child of, and
    /// its name there.
    fn tenant_place<'a>(&'a self, key: &str, path: &'a Path) -> Result<(&'a Path, &'a str), Error> {
        let shown = path.display().to_string();
        self.data_root(key, path)?;
        let refused = |why: String| {
            Error::invalid_config(format!("{key} {shown:?} {why}")).with_details(format!(
                "a network's data directory is its plugin's default or a direct child of a data root that is \
                 not a plugin's default directory ({:?}, {:?}); dataRoots {:?} (policy: {})",
                paths::IPAM_DATA_DIR,
                paths::HOST_DEVICE_DATA_DIR,
                self.data_roots,
                self.source
            ))
        };
        let (Some(parent), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
            return Err(refused("names no directory".into()));
        };
        let root = self.data_roots.iter().find(|r| r.as_path() == parent);
        let Some(root) = root else {
            return Err(refused("is not a direct child of a data root".into()));
        };
        let defaults = [Kind::IpamFileStore.default_dir(), Kind::HostDeviceState.default_dir()];
        if defaults.contains(&root.as_path()) {
            return Err(refused(format!("lies in {}, whose entries are that plugin's own", root.display())));
        }
        if name.starts_with(".plexus") {
            return Err(refused("uses a name plexus keeps for itself (.plexus*)".into()));
        }
        Ok((root.as_path(), name))
    }

    /// The release path's way into a data directory an earlier plexus used and the rule above
    /// refuses now (nested beneath a data root, or unmarked and holding both plugins' files): DEL,
    /// GC, CHECK and STATUS (`create` false) use it as it is, so that what an earlier release
    /// attached there is released — a refusal is for new attachments, and ADD still gets
    /// `refused`. Only beneath a data root, never through a symlink, never inside a plugin's
    /// default directory or another marked data directory (another store's tree), and only when
    /// everything in it is what a plexus store makes (domains with their lock, state files);
    /// anything else keeps `refused` (DEL then finds nothing held). Nothing is made or marked in
    /// it, and it is never removed.
    fn earlier_dir(&self, key: &str, path: &Path, refused: Error) -> Result<Option<DataDir>, Error> {
        let Ok(root) = self.data_root(key, path) else { return Err(refused) };
        let Ok(rel) = path.strip_prefix(root) else { return Err(refused) };
        let defaults = [Kind::IpamFileStore.default_dir(), Kind::HostDeviceState.default_dir()];
        if defaults.iter().any(|d| path.starts_with(d)) {
            return Err(refused);
        }
        let mut dir = match SafeDir::open_beneath(root, root, false) {
            Ok(d) => d,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(_) => return Err(refused),
        };
        for c in rel.components() {
            // A marked directory on the way: the path lies in a tenant store's tree.
            if std::fs::symlink_metadata(dir.path().join(MARK)).is_ok() {
                return Err(refused);
            }
            dir = match dir.subdir(&c.as_os_str().to_string_lossy(), false) {
                Ok(d) => d,
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
                Err(_) => return Err(refused),
            };
        }
        let Ok(found) = entries(&dir) else { return Err(refused) };
        let a_store = found.iter().all(|(n, is_dir)| {
            let domain = Kind::IpamFileStore.made_by(n, *is_dir)
                && std::fs::symlink_metadata(dir.path().join(n).join("lock")).is_ok_and(|m| m.is_file());
            domain || Kind::HostDeviceState.made_by(n, *is_dir)
        });
        if !a_store {
            return Err(refused);
        }
        tracing::info!("{key} {:?}: {refused}; used as it is to release what an earlier plexus left", path.display());
        Ok(Some(DataDir { dir, tenant: None }))
    }

    fn not_ours(&self, key: &str, path: &Path, why: &str) -> Error {
        Error::invalid_config(format!("{key} {:?} cannot be used: {why}", path.display().to_string()))
            .with_details("a tenant data directory is made and marked by plexus, and used as one kind only")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(root: &Path) -> Policy {
        Policy::parse(serde_json::json!({"dataRoots": [root]}).to_string().as_bytes()).unwrap()
    }

    fn soon() -> Deadline {
        Deadline::after(Duration::from_secs(5))
    }

    #[test]
    fn a_tenant_directory_is_a_marked_direct_child_of_a_data_root_and_goes_when_empty() {
        let root = tempfile::tempdir().unwrap();
        let p = policy(root.path());
        let dir = root.path().join("team-a-store");
        let d = p.data_dir("dataDir", &dir, Kind::IpamFileStore, Some("team-a"), true, soon()).unwrap().unwrap();
        assert!(d.is_tenant());
        let mark: Mark = serde_json::from_slice(&std::fs::read(dir.join(MARK)).unwrap()).unwrap();
        assert_eq!(mark, Mark { kind: Kind::IpamFileStore, namespace: "team-a".into() });
        std::fs::create_dir(dir.join("default")).unwrap();
        assert!(!d.retire_if_empty(), "a domain is in it");
        drop(d);
        std::fs::remove_dir(dir.join("default")).unwrap();
        let d = p.data_dir("dataDir", &dir, Kind::IpamFileStore, Some("team-a"), false, soon()).unwrap().unwrap();
        let other = p.data_dir("dataDir", &dir, Kind::IpamFileStore, Some("team-a"), false, soon()).unwrap().unwrap();
        assert!(!d.retire_if_empty(), "another request uses it");
        assert!(other.retire_if_empty());
        assert!(!dir.exists());
        assert!(p.data_dir("dataDir", &dir, Kind::IpamFileStore, None, false, soon()).unwrap().is_none());
    }

    #[test]
    fn a_store_an_earlier_plexus_made_where_add_now_refuses_is_used_to_release_and_nothing_else() {
        let root = tempfile::tempdir().unwrap();
        let p = policy(root.path());
        // Nested beneath the root (an earlier rule allowed it): a domain with its lock, a state file.
        let nested = root.path().join("team-a/stores/ipam");
        std::fs::create_dir_all(nested.join("default")).unwrap();
        std::fs::write(nested.join("default/lock"), b"").unwrap();
        std::fs::write(nested.join("c1=net1"), b"{}").unwrap();
        let add = p.data_dir("dataDir", &nested, Kind::IpamFileStore, None, true, soon()).unwrap_err();
        assert_eq!(add.code, plexus_cni::code::INVALID_NETWORK_CONFIG, "ADD still refuses it: {add}");
        let del = p.data_dir("dataDir", &nested, Kind::IpamFileStore, None, false, soon()).unwrap().unwrap();
        assert!(!del.is_tenant(), "never marked, never removed");
        assert_eq!(del.dir().shown(), nested);
        drop(del);
        assert!(nested.exists() && !nested.join(MARK).exists());
        assert!(
            p.data_dir("dataDir", &root.path().join("team-a/gone"), Kind::IpamFileStore, None, false, soon())
                .unwrap()
                .is_none()
        );
        // Not what a store makes (a domain without its lock, any other file): refused, as before.
        std::fs::remove_file(nested.join("default/lock")).unwrap();
        assert!(p.data_dir("dataDir", &nested, Kind::IpamFileStore, None, false, soon()).is_err());
        // Inside a marked tenant store's tree: refused.
        let tenant = root.path().join("team-b");
        let d = p.data_dir("dataDir", &tenant, Kind::IpamFileStore, Some("team-b"), true, soon()).unwrap().unwrap();
        std::fs::create_dir_all(tenant.join("default/attachments")).unwrap();
        std::fs::write(tenant.join("default/lock"), b"").unwrap();
        let inside = tenant.join("default/attachments");
        assert!(p.data_dir("dataDir", &inside, Kind::HostDeviceState, None, false, soon()).is_err());
        drop(d);
        // Through a symlink: refused.
        std::os::unix::fs::symlink(&tenant, root.path().join("link")).unwrap();
        assert!(
            p.data_dir("dataDir", &root.path().join("link/default"), Kind::IpamFileStore, None, false, soon()).is_err()
        );
    }

    /// plexus-daemon runs requests on many threads: the first requests of a new tenant directory,
    /// at once in one process, all get it marked (CI saw one fail with "File exists" when the
    /// mark's temp file was named by the process).
    #[test]
    fn threads_of_one_process_making_one_tenant_directory_at_once_all_get_it() {
        for round in 0..20 {
            let root = tempfile::tempdir().unwrap();
            let p = policy(root.path());
            let dir = root.path().join("team-a-store");
            let (start, using) = (std::sync::Barrier::new(8), std::sync::Barrier::new(8));
            std::thread::scope(|s| {
                let made: Vec<_> = (0..8)
                    .map(|_| {
                        s.spawn(|| {
                            start.wait();
                            let got = p.data_dir("dataDir", &dir, Kind::IpamFileStore, Some("team-a"), true, soon());
                            // Each request uses it until all have it, as requests at once do.
                            using.wait();
                            got.map(|d| d.is_some_and(|d| d.is_tenant()))
                        })
                    })
                    .collect();
                for m in made {
                    assert!(m.join().unwrap().unwrap(), "round {round}");
                }
            });
            // The last one out removed it, empty: no temp file of a mark is left anywhere.
            let left: Vec<_> = std::fs::read_dir(root.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
            assert!(left.is_empty(), "round {round}: {left:?}");
        }
    }

    /// A request killed between making its directory and marking it left it unmarked, empty or
    /// with only its mark's temp file: the next request that finds it so, a DEL, removes it (CI's
    /// fault injection found one left).
    #[test]
    fn a_directory_left_unmarked_by_a_killed_request_goes_with_its_temp_file() {
        let root = tempfile::tempdir().unwrap();
        let p = policy(root.path());
        let dir = root.path().join("team-a-store");
        std::fs::create_dir(&dir).unwrap();
        assert!(p.data_dir("dataDir", &dir, Kind::IpamFileStore, Some("team-a"), false, soon()).unwrap().is_none());
        assert!(!dir.exists());
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join(crate::files::temp_name(MARK)), b"{").unwrap();
        assert!(p.data_dir("dataDir", &dir, Kind::IpamFileStore, Some("team-a"), false, soon()).unwrap().is_none());
        assert!(!dir.exists());
        // With anything else in it, it stays (and is not adopted by a DEL).
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join(crate::files::temp_name(MARK)), b"{").unwrap();
        std::fs::write(dir.join("notes"), b"").unwrap();
        assert!(p.data_dir("dataDir", &dir, Kind::IpamFileStore, Some("team-a"), false, soon()).is_err());
        assert!(dir.join("notes").exists());
    }

    /// Two DELs of one directory's last two attachments: the one that removes the last domain
    /// cannot wait out the other, still writing; that one, leaving after it without having
    /// removed anything itself, removes the directory (CI found its mark left once).
    #[test]
    fn the_last_request_to_leave_removes_the_directory_the_one_that_emptied_it_could_not() {
        let root = tempfile::tempdir().unwrap();
        let p = policy(root.path());
        let dir = root.path().join("team-a-store");
        let emptier = p.data_dir("dataDir", &dir, Kind::IpamFileStore, Some("team-a"), true, soon()).unwrap().unwrap();
        std::fs::create_dir(dir.join("default")).unwrap();
        let slower = p.data_dir("dataDir", &dir, Kind::IpamFileStore, Some("team-a"), false, soon()).unwrap().unwrap();
        std::fs::remove_dir(dir.join("default")).unwrap();
        assert!(!emptier.retire_if_empty(), "the slower one still uses it");
        assert!(dir.join(MARK).exists());
        drop(emptier);
        assert!(dir.join(MARK).exists(), "left once only");
        drop(slower);
        assert!(!dir.exists(), "the last one out removed it");
    }

    #[test]
    fn a_directory_deeper_than_a_roots_child_or_inside_a_default_directory_is_refused_by_rule() {
        let root = tempfile::tempdir().unwrap();
        let mut p = policy(root.path());
        p.data_roots.push(Kind::IpamFileStore.default_dir().into());
        for (path, why) in [
            (root.path().join("a/ips"), "is not a direct child of a data root"),
            (root.path().join(".plexus-ipam-kubernetes.lock"), "uses a name plexus keeps for itself"),
            (Kind::IpamFileStore.default_dir().join("default"), "whose entries are that plugin's own"),
            (root.path().to_path_buf(), "is not a direct child of a data root"),
        ] {
            let e = p.data_dir("dataDir", &path, Kind::IpamFileStore, Some("ns"), true, soon()).unwrap_err();
            assert_eq!(e.code, plexus_cni::code::INVALID_NETWORK_CONFIG);
            assert!(e.msg.contains(why), "{}: {e}", path.display());
            assert!(e.msg.starts_with(&format!("dataDir {:?}", path.display().to_string())), "{e}");
        }
        assert!(!root.path().join("a").exists(), "nothing made on the way");
    }

    #[test]
    fn a_directory_is_used_as_one_kind_and_never_unmarked_with_foreign_content() {
        let root = tempfile::tempdir().unwrap();
        let p = policy(root.path());
        let dir = root.path().join("x");
        let _held = p.data_dir("dataDir", &dir, Kind::IpamFileStore, Some("a"), true, soon()).unwrap();
        let e = p.data_dir("dataDir", &dir, Kind::HostDeviceState, Some("a"), true, soon()).unwrap_err();
        assert!(e.msg.contains("it is a plexus-ipam file store"), "{e}");
        let foreign = root.path().join("y");
        std::fs::create_dir(&foreign).unwrap();
        std::fs::write(foreign.join("kubeconfig"), b"x").unwrap();
        let e = p.data_dir("dataDir", &foreign, Kind::IpamFileStore, Some("a"), true, soon()).unwrap_err();
        assert!(e.msg.contains("not empty and carries no plexus mark"), "{e}");
        assert!(!foreign.join(MARK).exists());
        // What an earlier plexus left (state files) is adopted and marked.
        let old = root.path().join("z");
        std::fs::create_dir(&old).unwrap();
        std::fs::write(old.join("c1=net1"), b"{}").unwrap();
        assert!(p.data_dir("dataDir", &old, Kind::HostDeviceState, Some("a"), false, soon()).unwrap().is_some());
        assert!(old.join(MARK).exists());
    }
}
