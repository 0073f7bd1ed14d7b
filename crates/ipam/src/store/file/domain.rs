//! One allocation domain of the file store, locked by a request: opened (and made) beneath the
//! store's directory, its lock waited for until the request's deadline, its directories opened
//! once the lock is held; removed, under its lock, once it holds nothing.

use std::fs::{self, File};
use std::io::ErrorKind;
use std::os::fd::AsFd;

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, fstat};
use nix::unistd::{UnlinkatFlags, unlinkat};
use plexus_cni::Deadline;
use plexus_node::files::{self, SafeDir};

use crate::error::IpamError;

/// How many times a request opens a domain that was removed under it before it gives up.
const DOMAIN_ATTEMPTS: usize = 8;

/// The subdirectories of a domain.
const SUBDIRS: [&str; 5] = ["ips", "attachments", "pods", "cursors", "tmp"];

/// One allocation domain, locked by this request: its directories opened once the lock was
/// held. The lock goes with [`Domain::unlock`] (or the drop); the directories stay usable for
/// making the operation durable.
#[derive(Debug)]
pub(super) struct Domain {
    pub(super) dir: SafeDir,
    pub(super) ips: SafeDir,
    pub(super) attachments: SafeDir,
    pub(super) pods: SafeDir,
    pub(super) cursors: SafeDir,
    pub(super) tmp: SafeDir,
    lock: Option<File>,
    pub(super) deadline: Deadline,
}

impl Domain {
    pub(super) fn open(
        store: &SafeDir,
        name: &str,
        create: bool,
        deadline: Deadline,
    ) -> Result<Option<Domain>, IpamError> {
        let failed =
            |what: &str, e: std::io::Error| IpamError::Store(format!("{what} {}/{name}: {e}", store.shown().display()));
        for _ in 0..DOMAIN_ATTEMPTS {
            let dir = match store.subdir(name, create) {
                Ok(d) => d,
                Err(e) if e.kind() == ErrorKind::NotFound && !create => return Ok(None),
                // Removed between its creation and its opening: again.
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(failed("open store", e)),
            };
            let lock = match open_lock(&dir, create) {
                Ok(Some(lock)) => lock,
                // No lock file: a domain that never held anything (its lock comes before any
                // record), or one removed meanwhile. Made by a request killed before its lock, it
                // is empty: it goes (a plain rmdir; one making it meanwhile finds it gone when it
                // creates its lock, and starts over).
                Ok(None) if !create => {
                    let _ = unlinkat(store.as_fd(), name, UnlinkatFlags::RemoveDir);
                    return Ok(None);
                }
                Ok(None) => continue,
                Err(e) => {
                    remove_if_empty(store, name, &dir);
                    return Err(failed("open lock of", e));
                }
            };
            if !plexus_cni::deadline::lock_until(&lock, deadline).map_err(|e| failed("lock", e))? {
                return Err(IpamError::Unavailable(format!(
                    "the lock of {}/{name} is still held at this request's deadline",
                    store.shown().display()
                )));
            }
            // The domain was removed while this request waited for its lock: open it anew.
            if fstat(lock.as_fd()).map(|s| s.st_nlink).unwrap_or(0) == 0 {
                continue;
            }
            let subdirs: Result<Vec<SafeDir>, _> = SUBDIRS.iter().map(|n| dir.subdir(n, true)).collect();
            let mut subdirs = match subdirs {
                Ok(d) => d.into_iter(),
                Err(e) => {
                    // Nothing half-made stays (the disk is full, read-only...).
                    remove_if_empty(store, name, &dir);
                    return Err(failed("open", e));
                }
            };
            let mut next = || subdirs.next().expect("one per name");
            let (ips, attachments, pods, cursors, tmp) = (next(), next(), next(), next(), next());
            let domain = Domain { dir, ips, attachments, pods, cursors, tmp, lock: Some(lock), deadline };
            domain.sweep_temp_files();
            return Ok(Some(domain));
        }
        Err(IpamError::Unavailable(format!(
            "{}/{name}: removed and made again {DOMAIN_ATTEMPTS} times while this request waited",
            store.shown().display()
        )))
    }

    /// Let the lock go (the files written stay reachable through the directories).
    pub(super) fn unlock(&mut self) {
        self.lock = None;
    }

    /// Leftovers of killed processes in tmp/ (plexus's own temp names only), under the lock.
    fn sweep_temp_files(&self) {
        if let Ok(entries) = fs::read_dir(self.tmp.path()) {
            for e in entries.flatten() {
                if files::is_temp_name(&e.file_name().to_string_lossy()) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }

    /// Remove this domain (under its lock) when no record, address or pod index is left in it;
    /// `true` when it is gone. Its lock file goes last but one: a request waiting on it finds it
    /// unlinked and starts over.
    pub(super) fn retire_if_empty(self, store: &SafeDir, name: &str) -> bool {
        remove_if_empty(store, name, &self.dir)
    }
}

/// Remove domain `name` of `store` (its directory open as `dir`, locked or never locked) when no
/// record, address or pod index is in it: its other files, its subdirectories, its lock file,
/// then itself; `true` when it is gone. What is missing already is no obstacle; a subdirectory
/// that is anything but a directory (a planted symlink) keeps everything as it is. Every step goes
/// through descriptors opened without following symlinks, never through a path.
pub(super) fn remove_if_empty(store: &SafeDir, name: &str, dir: &SafeDir) -> bool {
    let mut subs = Vec::new();
    for sub in SUBDIRS {
        match dir.subdir(sub, false) {
            Ok(d) => subs.push((sub, Some(d))),
            Err(e) if e.kind() == ErrorKind::NotFound => subs.push((sub, None)),
            Err(_) => return false,
        }
    }
    let names = |d: &SafeDir| -> Option<Vec<std::ffi::OsString>> {
        Some(fs::read_dir(d.path()).ok()?.flatten().map(|e| e.file_name()).collect())
    };
    for (sub, d) in &subs {
        let Some(d) = d else { continue };
        let Some(held) = names(d) else { return false };
        match *sub {
            "attachments" | "ips" | "pods" if !held.is_empty() => return false,
            // Hints and leftovers: they go with the domain.
            "cursors" | "tmp" => {
                for n in held {
                    let _ = unlinkat(d.as_fd(), n.as_os_str(), UnlinkatFlags::NoRemoveDir);
                }
            }
            _ => {}
        }
    }
    drop(subs);
    let gone = |r: nix::Result<()>| match r {
        Err(nix::errno::Errno::ENOENT) => Ok(()),
        other => other,
    };
    let removed = SUBDIRS
        .iter()
        .try_for_each(|sub| gone(unlinkat(dir.as_fd(), *sub, UnlinkatFlags::RemoveDir)))
        .and_then(|()| gone(unlinkat(dir.as_fd(), "lock", UnlinkatFlags::NoRemoveDir)))
        .and_then(|()| unlinkat(store.as_fd(), name, UnlinkatFlags::RemoveDir));
    if let Err(e) = &removed {
        tracing::debug!("domain {name} of {} not removed: {e}", store.shown().display());
    }
    removed.is_ok()
}

/// The domain's lock file, opened without following a symlink — created 0600 when `create`
/// (read-only on a read-only file system, where DEL of nothing must still succeed); `None` when
/// there is none (the domain was removed, or never held anything).
fn open_lock(dir: &SafeDir, create: bool) -> std::io::Result<Option<File>> {
    let base = OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mode = Mode::from_bits_truncate(0o600);
    let opened = match create {
        true => match openat(dir.as_fd(), "lock", base | OFlag::O_CREAT | OFlag::O_WRONLY, mode) {
            Err(nix::errno::Errno::EROFS) => openat(dir.as_fd(), "lock", base | OFlag::O_RDONLY, mode),
            other => other,
        },
        // Writable where it can be (a lock needs no more than reading).
        false => match openat(dir.as_fd(), "lock", base | OFlag::O_WRONLY, mode) {
            Err(nix::errno::Errno::EROFS | nix::errno::Errno::EACCES) => {
                openat(dir.as_fd(), "lock", base | OFlag::O_RDONLY, mode)
            }
            other => other,
        },
    };
    match opened {
        Ok(fd) => Ok(Some(File::from(fd))),
        Err(nix::errno::Errno::ENOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}
