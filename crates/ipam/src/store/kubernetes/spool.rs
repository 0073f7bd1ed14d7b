//! Group commit for the `kubernetes` store: a node's ADDs and DELs waiting for their turn on one
//! pool are served by one IPPool write.
//!
//! Every allocation rewrites the whole IPPool (whereabouts' format: one object per range), and
//! the API server applies the writes to one object one at a time, so one write per address is
//! the floor of a pool's throughput. Instead, an ADD or DEL leaves its request in the pool's
//! spool before it waits for the node's turn (the file lock); whoever gets the turn first (the
//! leader) serves every request waiting there in one JSON Patch and leaves each its answer. A
//! waiting request looks for its answer and for a free turn alike, so a served one goes on at
//! once instead of waiting behind the next leader's write.
//!
//! ```text
//! <data root>/.plexus-ipam-kubernetes.spool/<pool key>/
//!   <attachment>.req   a waiting ADD's owner (JSON), flock'ed by its process while it waits
//!   <attachment>.res   the leader's answer: the offset, or that the range is full
//!   <attachment>.rel   a waiting DEL's owner, flock'ed likewise
//!   <attachment>.out   the leader's answer: the offsets it removed
//! ```
//!
//! A request whose process died (its lock is free) is never served: the leader removes it. The
//! leader checks that while it holds the node's turn, and a DEL needs that turn too, so a DEL
//! of a container that died waiting always comes after any write that served it.
//! Files are 0600 in 0700 directories beneath the policy's first data root, named by hashes
//! (never by a container ID or interface name), opened without following symlinks.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::store::Owner;

/// The spools' directory in the node lock's directory.
const SPOOLS: &str = ".plexus-ipam-kubernetes.spool";
/// How many turn files a node's pools share ([`turn_file`]): a fixed number, so no tenant's
/// pool name leaves a file behind, and pools that share one only take turns with each other.
pub const TURNS: u8 = 64;

/// The file whose lock is the node's turn on pool `pool_name` of `namespace`, in `root`: one of
/// [`TURNS`], chosen by the pool's name (every range of one pool writes the same object, so
/// they share it).
pub fn turn_file(root: &Path, namespace: &str, pool_name: &str) -> PathBuf {
    let stripe = Sha256::digest([namespace.as_bytes(), &[0], pool_name.as_bytes()].concat())[0] % TURNS;
    root.join(SPOOLS).join(format!("turn-{stripe:02}"))
}

/// What a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An address (ADD).
    Add,
    /// The attachment's entries removed (DEL).
    Release,
}

impl Kind {
    const ALL: [Kind; 2] = [Kind::Add, Kind::Release];

    /// The request's and the answer's file extensions.
    fn extensions(self) -> (&'static str, &'static str) {
        match self {
            Kind::Add => ("req", "res"),
            Kind::Release => ("rel", "out"),
        }
    }
}
/// A request file a process did not finish writing is this old before a leader removes it.
const STALE_TEMP: Duration = Duration::from_secs(60);

/// What the leader's write gave a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Answer {
    /// The owner holds this offset of the pool (given now, or held already). `reown_from`: the
    /// entry was the pod's earlier container's and is the owner's now, so its reservation is to
    /// be passed on too.
    Offset {
        offset: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reown_from: Option<String>,
    },
    /// No free address was left in the range.
    Exhausted,
    /// The offsets of the attachment's entries the write removed (none: it held none).
    Released { offsets: Vec<String> },
}

impl Answer {
    pub fn offset(offset: u128, reown_from: Option<String>) -> Answer {
        Answer::Offset { offset: offset.to_string(), reown_from }
    }
}

/// One pool's spool (pools with the same name but other bounds or exclusions have their own).
pub struct Spool {
    dir: PathBuf,
}

/// A request in the spool: its file stays locked by this process until the ticket drops, which
/// removes it and its answer.
pub struct Ticket {
    _lock: File,
    request: PathBuf,
    answer: PathBuf,
}

/// A live request of another process, waiting for its answer.
pub struct Waiting {
    pub kind: Kind,
    pub owner: Owner,
    answer: PathBuf,
}

fn hex16(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
}

fn open_nofollow(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().read(true).custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC).open(path)
}

fn create_private(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(path)
}

/// Whether the process that wrote `file` still waits on it (holds its lock).
fn held(file: &File) -> bool {
    matches!(file.try_lock_shared(), Err(std::fs::TryLockError::WouldBlock))
}

impl Spool {
    /// The spool of the pool `pool_name` with these bounds (`range` says them all), in `root`.
    pub fn open(root: &Path, namespace: &str, pool_name: &str, range: &str) -> std::io::Result<Spool> {
        let dir = root.join(SPOOLS).join(hex16(&[namespace, pool_name, range]));
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
        Ok(Spool { dir })
    }

    fn paths(&self, kind: Kind, owner: &Owner) -> (String, PathBuf, PathBuf) {
        let name = hex16(&[&owner.container_id, &owner.ifname]);
        let (req, res) = kind.extensions();
        let request = self.dir.join(format!("{name}.{req}"));
        let answer = self.dir.join(format!("{name}.{res}"));
        (name, request, answer)
    }

    /// Leave `owner`'s request. `None` when a live request of the same kind for the same
    /// attachment is already there (a second ADD of it at once): that one goes without the spool.
    pub fn enqueue(&self, kind: Kind, owner: &Owner) -> std::io::Result<Option<Ticket>> {
        let (name, request, answer) = self.paths(kind, owner);
        match open_nofollow(&request) {
            Ok(f) if held(&f) => return Ok(None),
            Ok(_) => {
                // Left by a process that died: its answer (if any) goes with it.
                remove(&answer)?;
                remove(&request)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        remove(&answer)?;
        // Locked before it is visible under its name, so a leader never takes it for dead.
        let temp = self.dir.join(plexus_node::files::temp_name(&format!("{name}.{}", kind.extensions().0)));
        remove(&temp)?;
        let mut file = create_private(&temp)?;
        file.lock()?;
        let written = serde_json::to_vec(owner).map_err(std::io::Error::other).and_then(|b| file.write_all(&b));
        if let Err(e) = written.and_then(|()| std::fs::rename(&temp, &request)) {
            let _ = std::fs::remove_file(&temp);
            return Err(e);
        }
        Ok(Some(Ticket { _lock: file, request, answer }))
    }

    /// The live requests waiting here without an answer, `mine` left out; what dead processes
    /// left is removed.
    pub fn waiting(&self, mine: &Ticket) -> std::io::Result<Vec<Waiting>> {
        let mut live = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let Some(file_name) = path.file_name().and_then(|n| n.to_str()) else { continue };
            if file_name.starts_with('.') {
                let old = std::fs::symlink_metadata(&path)
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t.elapsed().unwrap_or_default() > STALE_TEMP);
                if old {
                    remove(&path)?;
                }
                continue;
            }
            let Some((stem, ext)) = file_name.rsplit_once('.') else { continue };
            let Some(kind) = Kind::ALL.into_iter().find(|k| k.extensions().0 == ext) else {
                if let Some(k) = Kind::ALL.into_iter().find(|k| k.extensions().1 == ext)
                    && !self.dir.join(format!("{stem}.{}", k.extensions().0)).exists()
                {
                    remove(&path)?; // an answer whose request is gone
                }
                continue;
            };
            if path == mine.request {
                continue;
            }
            let answer = self.dir.join(format!("{stem}.{}", kind.extensions().1));
            let mut file = match open_nofollow(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if !held(&file) {
                remove(&answer)?;
                remove(&path)?;
                continue;
            }
            if answer.exists() {
                continue;
            }
            let mut body = Vec::new();
            file.read_to_end(&mut body)?;
            match serde_json::from_slice::<Owner>(&body) {
                Ok(owner) => live.push(Waiting { kind, owner, answer }),
                Err(e) => tracing::warn!("{}: unreadable request, not served: {e}", path.display()),
            }
        }
        Ok(live)
    }

    /// Leave `answer` for the waiting request `to`: whole or not at all, as the waiting ADD
    /// reads it without the node's turn.
    pub fn answer(&self, to: &Waiting, answer: &Answer) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(answer).map_err(std::io::Error::other)?;
        let name = to.answer.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let temp = self.dir.join(plexus_node::files::temp_name(name));
        remove(&temp)?;
        let written = create_private(&temp).and_then(|mut f| f.write_all(&bytes));
        if let Err(e) = written.and_then(|()| std::fs::rename(&temp, &to.answer)) {
            let _ = std::fs::remove_file(&temp);
            return Err(e);
        }
        Ok(())
    }
}

impl Ticket {
    /// The answer a leader left for this request, if one did.
    pub fn answer(&self) -> Option<Answer> {
        let mut body = Vec::new();
        open_nofollow(&self.answer).ok()?.read_to_end(&mut body).ok()?;
        serde_json::from_slice(&body).ok()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // The answer first: an answer is never left without its request while this one lives.
        let _ = remove(&self.answer);
        let _ = remove(&self.request);
        // The pool's spool goes with its last request (pools and their bounds are a tenant's
        // choice: a spool per choice must not outlive it). A request being left there meanwhile
        // finds the directory gone and goes without the spool.
        if let Some(dir) = self.request.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn remove(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(c: &str) -> Owner {
        Owner {
            container_id: c.into(),
            ifname: "net1".into(),
            pod_ref: Some(format!("default/{c}")),
            node: String::new(),
            network: "n".into(),
        }
    }

    /// A request as a process that died while waiting leaves it: in place, nobody holding its lock.
    fn left_by_a_dead_process(spool: &Spool, c: &str) {
        let (_, request, answer) = spool.paths(Kind::Add, &owner(c));
        std::fs::write(&request, serde_json::to_vec(&owner(c)).unwrap()).unwrap();
        std::fs::write(answer, serde_json::to_vec(&Answer::offset(3, None)).unwrap()).unwrap();
    }

    #[test]
    fn a_leader_sees_the_live_requests_and_each_finds_its_answer() {
        let root = tempfile::tempdir().unwrap();
        let spool = Spool::open(root.path(), "kube-system", "198.18.0.0-24", "r").unwrap();
        let leader = spool.enqueue(Kind::Add, &owner("a")).unwrap().unwrap();
        let b = spool.enqueue(Kind::Add, &owner("b")).unwrap().unwrap();
        let c = spool.enqueue(Kind::Add, &owner("c")).unwrap().unwrap();
        let mut waiting = spool.waiting(&leader).unwrap();
        waiting.sort_by(|x, y| x.owner.container_id.cmp(&y.owner.container_id));
        let ids: Vec<&str> = waiting.iter().map(|w| w.owner.container_id.as_str()).collect();
        assert_eq!(ids, ["b", "c"], "the leader's own request is not among them");
        assert_eq!(waiting[0].owner, owner("b"));
        spool.answer(&waiting[0], &Answer::offset(7, None)).unwrap();
        spool.answer(&waiting[1], &Answer::Exhausted).unwrap();
        assert_eq!(b.answer(), Some(Answer::offset(7, None)));
        assert_eq!(c.answer(), Some(Answer::Exhausted));
        assert_eq!(leader.answer(), None);
        assert!(spool.waiting(&leader).unwrap().is_empty(), "answered requests are not served twice");
        drop((b, c));
        let left: Vec<_> = std::fs::read_dir(&spool.dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 1, "only the leader's request is left: {left:?}");
        drop(leader);
        assert!(!spool.dir.exists(), "the spool goes with its last request");
    }

    #[test]
    fn adds_and_dels_wait_side_by_side_and_each_finds_only_its_own_answer() {
        let root = tempfile::tempdir().unwrap();
        let spool = Spool::open(root.path(), "ns", "pool", "r").unwrap();
        let leader = spool.enqueue(Kind::Add, &owner("a")).unwrap().unwrap();
        let add = spool.enqueue(Kind::Add, &owner("b")).unwrap().unwrap();
        let del = spool.enqueue(Kind::Release, &owner("b")).unwrap().unwrap();
        let mut waiting = spool.waiting(&leader).unwrap();
        waiting.sort_by_key(|w| w.kind == Kind::Release);
        let seen: Vec<(Kind, &str)> = waiting.iter().map(|w| (w.kind, w.owner.container_id.as_str())).collect();
        assert_eq!(seen, [(Kind::Add, "b"), (Kind::Release, "b")]);
        let released = Answer::Released { offsets: vec!["4".into()] };
        spool.answer(&waiting[1], &released).unwrap();
        assert_eq!(add.answer(), None, "the DEL's answer is not the ADD's");
        assert_eq!(del.answer(), Some(released));
        let left: Vec<Kind> = spool.waiting(&leader).unwrap().iter().map(|w| w.kind).collect();
        assert_eq!(left, [Kind::Add], "the answered DEL is not served twice");
        drop(del);
        assert_eq!(spool.enqueue(Kind::Release, &owner("b")).unwrap().unwrap().answer(), None, "no old answer");
    }

    #[test]
    fn a_request_whose_process_died_is_never_served_and_is_removed() {
        let root = tempfile::tempdir().unwrap();
        let spool = Spool::open(root.path(), "ns", "pool", "r").unwrap();
        left_by_a_dead_process(&spool, "dead");
        let leader = spool.enqueue(Kind::Add, &owner("a")).unwrap().unwrap();
        assert!(spool.waiting(&leader).unwrap().is_empty());
        let left: Vec<_> = std::fs::read_dir(&spool.dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 1, "the dead request was removed: {left:?}");
        // The same attachment again (the runtime's retry) gets a fresh request, no old answer.
        left_by_a_dead_process(&spool, "again");
        let again = spool.enqueue(Kind::Add, &owner("again")).unwrap().unwrap();
        assert_eq!(again.answer(), None);
    }

    #[test]
    fn a_second_live_request_of_one_attachment_goes_without_the_spool() {
        let root = tempfile::tempdir().unwrap();
        let spool = Spool::open(root.path(), "ns", "pool", "r").unwrap();
        let first = spool.enqueue(Kind::Add, &owner("a")).unwrap();
        assert!(first.is_some());
        assert!(spool.enqueue(Kind::Add, &owner("a")).unwrap().is_none());
    }

    #[test]
    fn a_pools_writers_share_one_turn_file_and_a_node_has_a_bounded_number_of_them() {
        let root = Path::new("/data");
        let turn = |pool: &str| turn_file(root, "kube-system", pool);
        assert_eq!(turn("198.18.0.0-21"), turn("198.18.0.0-21"));
        assert!(turn("198.18.0.0-21").starts_with(root.join(SPOOLS)));
        let files: std::collections::BTreeSet<PathBuf> = (0..10_000).map(|i| turn(&format!("tenant-{i}"))).collect();
        assert_eq!(files.len(), usize::from(TURNS), "however many pools tenants name");
        // The eight rails of a node mostly write under turns of their own.
        let rails: std::collections::BTreeSet<PathBuf> =
            (0..8).map(|k| turn(&format!("198.18.{}.0-21", 8 * k))).collect();
        assert!(rails.len() >= 6, "{rails:?}");
    }

    #[test]
    fn pools_of_other_bounds_have_spools_of_their_own_and_files_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let a = Spool::open(root.path(), "ns", "pool", "198.18.0.0/24-198.18.0.1-198.18.0.254").unwrap();
        let b = Spool::open(root.path(), "ns", "pool", "198.18.0.0/24-198.18.0.10-198.18.0.254").unwrap();
        assert_ne!(a.dir, b.dir);
        let t = a.enqueue(Kind::Add, &owner("x")).unwrap().unwrap();
        assert_eq!(std::fs::metadata(&t.request).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(&a.dir).unwrap().permissions().mode() & 0o777, 0o700);
        let name = t.request.file_name().unwrap().to_str().unwrap().to_string();
        let (hash, ext) = name.split_once('.').unwrap();
        assert!(
            hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()) && ext == "req",
            "named by a hash: {name}"
        );
    }
}
