//! Files plexus keeps (caches, state, device-info): private (0600 in 0700 directories) and
//! written atomically (temp file, fsync, rename, fsync of the directory), so a `kill -9` at any
//! point leaves either the old file or the new one. Temp files are created `O_EXCL|O_NOFOLLOW`
//! (a planted file or symlink is never written through), and directories a config names are
//! opened beneath their allowed root without following symlinks ([`SafeDir`]).

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, mkdirat};

use plexus_cni::error::Error;

/// Create `path` as a new private file (0600), open for writing: `O_EXCL|O_NOFOLLOW`, so a file
/// or symlink planted under that name is never written through. A leftover of the same name (a
/// temp file of a killed process whose PID came round again) is removed first.
pub fn create_private(path: &Path) -> std::io::Result<File> {
    crate::fault::at(crate::fault::Point::FileWrite)?;
    match fs::remove_file(path) {
        Err(e) if e.kind() != ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(OFlag::O_NOFOLLOW.bits()).open(path)
}

/// Whether `name` is a temp file name [`replace_private_via`] and its siblings make
/// (`.<name>.tmp<tid>`): a sweep of leftovers removes only these.
pub fn is_temp_name(name: &str) -> bool {
    name.strip_prefix('.')
        .and_then(|rest| rest.rsplit_once(".tmp"))
        .is_some_and(|(base, pid)| !base.is_empty() && !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

/// The temp name beside `name` for the calling thread: its thread id, which no other live thread
/// of any process has (a single-threaded process's is its pid). Named by the thread, not the
/// process: plexus-daemon runs requests on many threads at once, and two of them writing beside
/// the same name (two pods' first requests marking one data directory) would otherwise remove and
/// create each other's temp file ("File exists").
pub fn temp_name(name: &str) -> String {
    format!(".{name}.tmp{}", nix::unistd::gettid())
}

/// What tells a file's contents apart for a process that keeps what it read from it: replaced
/// (device, inode), rewritten (size, modification and change time) or re-owned (owner, mode), one
/// of these changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    pub dev: u64,
    pub ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    uid: u32,
    mode: u32,
}

impl FileStamp {
    pub fn of(m: &fs::Metadata) -> FileStamp {
        use std::os::unix::fs::MetadataExt;
        FileStamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
            uid: m.uid(),
            mode: m.mode(),
        }
    }

    /// The stamp of the file at `path` (symlinks followed); `None` when it cannot be read.
    pub fn of_path(path: &Path) -> Option<FileStamp> {
        fs::metadata(path).ok().map(|m| FileStamp::of(&m))
    }
}

/// A directory opened beneath an allowed root without following symlinks, held open: paths made
/// with [`SafeDir::join`] go through the open descriptor (`/proc/self/fd/N/...`), so renaming or
/// replacing a directory on the way after the check changes nothing.
#[derive(Debug)]
pub struct SafeDir {
    fd: OwnedFd,
    shown: PathBuf,
}

/// Whether `path` is absolute and has no `.` or `..` component.
pub fn is_clean_absolute(path: &Path) -> bool {
    path.is_absolute() && path.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

impl SafeDir {
    /// `path` beneath `root`: `root` is the admin's (opened as it is, created 0700 when
    /// missing); every component below it must be a real directory, never a symlink (opened one
    /// at a time with `O_NOFOLLOW`), created 0700 where missing when `create`.
    pub fn open_beneath(root: &Path, path: &Path, create: bool) -> std::io::Result<SafeDir> {
        let rel = path.strip_prefix(root).map_err(|_| {
            std::io::Error::new(
                ErrorKind::InvalidInput,
                format!("{} is not beneath {}", path.display(), root.display()),
            )
        })?;
        if !is_clean_absolute(path) || !is_clean_absolute(root) {
            return Err(std::io::Error::new(ErrorKind::InvalidInput, "not an absolute path without . or .."));
        }
        if create {
            DirBuilder::new().recursive(true).mode(0o700).create(root)?;
        }
        let fd: OwnedFd = OpenOptions::new().read(true).custom_flags(OFlag::O_DIRECTORY.bits()).open(root)?.into();
        let mut dir = SafeDir { fd, shown: root.to_path_buf() };
        for c in rel.components() {
            let Component::Normal(name) = c else { continue };
            dir = dir.subdir(&name.to_string_lossy(), create)?;
        }
        Ok(dir)
    }

    /// The directory `name` inside this one (one component, never a symlink), created 0700 when
    /// missing and `create`.
    pub fn subdir(&self, name: &str, create: bool) -> std::io::Result<SafeDir> {
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(std::io::Error::new(ErrorKind::InvalidInput, format!("invalid directory name {name:?}")));
        }
        // One plain component (no `/`, `.` or `..`) opened with O_NOFOLLOW: it cannot leave this
        // directory, and a symlink is refused — what openat2's RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS
        // gives, with plain openat, which kernels before 5.6 and qemu-user (the arm64 check)
        // have too.
        let flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY;
        let open = || openat(self.fd.as_fd(), name, flags, Mode::empty());
        let shown = self.shown.join(name);
        let is_link = || fs::symlink_metadata(self.join(name)).is_ok_and(|m| m.file_type().is_symlink());
        let explain = |e: Errno| {
            let why = match e {
                Errno::ELOOP | Errno::ENOTDIR if is_link() => "is a symbolic link: refused".to_string(),
                Errno::ENOTDIR => "is not a directory".to_string(),
                e => e.desc().to_string(),
            };
            std::io::Error::new(std::io::Error::from(e).kind(), format!("{}: {why}", shown.display()))
        };
        let fd = match open() {
            Err(Errno::ENOENT) if create => {
                match mkdirat(self.fd.as_fd(), name, Mode::from_bits_truncate(0o700)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(explain(e)),
                }
                open().map_err(explain)?
            }
            other => other.map_err(explain)?,
        };
        Ok(SafeDir { fd, shown })
    }

    /// A path to `name` in this directory that goes through the open descriptor.
    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.path().join(name)
    }

    /// This directory, through its open descriptor.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    /// The directory as the config named it (for messages).
    pub fn shown(&self) -> &Path {
        &self.shown
    }

    /// `p` (made by [`SafeDir::join`]) as a message should show it.
    pub fn show(&self, p: &Path) -> PathBuf {
        match p.strip_prefix(self.path()) {
            Ok(rest) => self.shown.join(rest),
            Err(_) => p.to_path_buf(),
        }
    }
}

impl AsFd for SafeDir {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Create `dir` (and parents) with mode 0700 where missing.
pub fn ensure_private_dir(dir: &Path) -> Result<(), Error> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::io(format!("create directory {}: {e}", dir.display())))
}

/// Replace `path` with `bytes`, atomically and durably (fsync), mode 0600 (the temp file sits
/// beside it).
pub fn write_private_atomic(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    ensure_private_dir(dir)?;
    write_private_atomic_via(dir, path, bytes)
}

/// Replace `path` with `bytes` atomically (temp file, rename), mode 0600, without fsync: a
/// process killed at any point leaves the old file or the new one, never a torn one; after a
/// power loss it may be the old one. For state whose loss is recoverable (the meta-plugin's cache
/// falls back to the API; a moved device is home after a reboot) and that sits on the hot path.
pub fn replace_private(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    ensure_private_dir(dir)?;
    replace_private_via(dir, path, bytes)
}

/// [`replace_private`] with the temp file in `tmp_dir` (same file system), for stores that sweep
/// one directory of the temp files a killed process left.
pub fn replace_private_via(tmp_dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let name = path.file_name().ok_or_else(|| Error::io(format!("{} names no file", path.display())))?;
    let tmp = tmp_dir.join(temp_name(&name.to_string_lossy()));
    let written = create_private(&tmp).and_then(|mut f| f.write_all(bytes)).and_then(|_| fs::rename(&tmp, path));
    written.map_err(|e| {
        let _ = fs::remove_file(&tmp);
        Error::io(format!("write {}: {e}", shown(path).display()))
    })
}

/// [`write_private_atomic`] with the temp file in `tmp_dir` (same file system), for stores that
/// sweep one directory of the temp files a killed process left.
fn write_private_atomic_via(tmp_dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| Error::io(format!("{} names no file", path.display())))?;
    let tmp = tmp_dir.join(temp_name(&name.to_string_lossy()));
    let io = |what: &str, e: std::io::Error| Error::io(format!("{what} {}: {e}", shown(&tmp).display()));
    let mut f = create_private(&tmp).map_err(|e| io("create", e))?;
    f.write_all(bytes).and_then(|_| f.sync_all()).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        io("write", e)
    })?;
    fs::rename(&tmp, path).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        Error::io(format!("rename {} to {}: {e}", shown(&tmp).display(), shown(path).display()))
    })?;
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// `path` as a message shows it: a path through a [`SafeDir`]'s descriptor (`/proc/self/fd/N/..`)
/// becomes the directory's own path, so an error names the place an operator can look at.
pub fn shown(path: &Path) -> PathBuf {
    let mut parts = path.components();
    let fd_dir: PathBuf = parts.by_ref().take(5).collect();
    if fd_dir.parent() == Some(Path::new("/proc/self/fd"))
        && let Ok(dir) = fs::read_link(&fd_dir)
    {
        return dir.join(parts.as_path());
    }
    path.to_path_buf()
}

/// Remove `path`; a file that is already gone is success — also on a read-only file system, where
/// `unlink` answers EROFS before it looks the name up.
pub fn remove_if_present(path: &Path) -> Result<(), Error> {
    crate::fault::at(crate::fault::Point::FileWrite)?;
    match fs::remove_file(path) {
        Err(e) if e.kind() != ErrorKind::NotFound && fs::symlink_metadata(path).is_ok() => {
            Err(Error::io(format!("remove {}: {e}", shown(path).display())))
        }
        _ => Ok(()),
    }
}

/// Everything `r` holds when that is at most `cap` bytes, `None` when it holds more: reads no
/// further than one byte past `cap`, so a larger input is never held (stdin, a file).
pub fn read_capped(r: impl std::io::Read, cap: u64) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    r.take(cap.saturating_add(1)).read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= cap).then_some(bytes))
}

/// The bytes of the regular file at `path`, at most `cap` of them; `Ok(None)` when there is no
/// such file. Not through a symlink at its last component (`O_NOFOLLOW`), and opened
/// `O_NONBLOCK` so that a FIFO planted there cannot hold the open: anything but a regular file, or
/// a larger one, is an error naming the path.
pub fn read_regular(path: &Path, cap: u64) -> std::io::Result<Option<Vec<u8>>> {
    let flags = OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
    let file = match OpenOptions::new().read(true).custom_flags(flags.bits()).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    };
    let invalid = |why: String| std::io::Error::new(ErrorKind::InvalidData, format!("{}: {why}", path.display()));
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(invalid("not a regular file".into()));
    }
    // Its size first: a file known to be too large is not read at all.
    if meta.len() > cap {
        return Err(invalid(format!("larger than {cap} bytes ({} bytes)", meta.len())));
    }
    match read_capped(file, cap) {
        Ok(Some(bytes)) => Ok(Some(bytes)),
        Ok(None) => Err(invalid(format!("larger than {cap} bytes"))),
        Err(e) => Err(std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn read_capped_holds_input_up_to_its_cap_and_refuses_one_byte_more() {
        assert_eq!(read_capped(&b"four"[..], 4).unwrap(), Some(b"four".to_vec()));
        assert_eq!(read_capped(&b"five!"[..], 4).unwrap(), None);
        assert_eq!(read_capped(&b""[..], 0).unwrap(), Some(Vec::new()));
    }

    #[test]
    fn read_regular_reads_a_file_and_refuses_symlinks_fifos_and_large_files() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("file");
        fs::write(&file, b"data").unwrap();
        assert_eq!(read_regular(&file, 4).unwrap(), Some(b"data".to_vec()));
        assert_eq!(read_regular(&t.path().join("missing"), 4).unwrap(), None);
        let big = read_regular(&file, 3).unwrap_err().to_string();
        assert!(big.contains("larger than 3 bytes") && big.contains("file"), "{big}");
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(read_regular(&link, 4).is_err(), "a symlink was followed");
        let fifo = t.path().join("fifo");
        nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o600)).unwrap();
        let e = read_regular(&fifo, 4).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        assert!(read_regular(t.path(), 4).is_err(), "a directory was read");
    }

    #[test]
    fn a_path_through_a_safe_dir_is_shown_as_the_directory_it_opened() {
        let root = tempfile::tempdir().unwrap();
        let dir = SafeDir::open_beneath(root.path(), &root.path().join("data"), true).unwrap();
        assert_eq!(shown(&dir.join("c1=net1")), root.path().join("data/c1=net1"));
        assert_eq!(shown(Path::new("/etc/cni/net.d/a")), Path::new("/etc/cni/net.d/a"));
        assert_eq!(shown(Path::new("/proc/self/fd/999999/a")), Path::new("/proc/self/fd/999999/a"));
    }

    #[test]
    fn private_files_are_0600_in_0700_dirs_and_replace_atomically() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("a/b/state.json");
        write_private_atomic(&path, b"one").unwrap();
        write_private_atomic(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(fs::metadata(root.path().join("a/b")).unwrap().permissions().mode() & 0o777, 0o700);
        let leftovers: Vec<_> = fs::read_dir(root.path().join("a/b")).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temp file left behind");
        remove_if_present(&path).unwrap();
        remove_if_present(&path).unwrap();
    }

    #[test]
    fn a_temp_file_is_never_written_through_a_planted_symlink() {
        let root = tempfile::tempdir().unwrap();
        let victim = root.path().join("victim");
        fs::write(&victim, b"keep").unwrap();
        let dir = root.path().join("d");
        fs::create_dir(&dir).unwrap();
        std::os::unix::fs::symlink(&victim, dir.join(temp_name("state"))).unwrap();
        replace_private(&dir.join("state"), b"new").unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"keep");
        assert_eq!(fs::read(dir.join("state")).unwrap(), b"new");
    }

    #[test]
    fn threads_of_one_process_replacing_one_file_at_once_all_succeed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        std::thread::scope(|s| {
            let writers: Vec<_> = (0..8u8)
                .map(|i| {
                    let path = &path;
                    s.spawn(move || (0..200).try_for_each(|_| replace_private(path, &[i; 64])))
                })
                .collect();
            for w in writers {
                w.join().unwrap().unwrap();
            }
        });
        let last = fs::read(&path).unwrap();
        assert!(last.len() == 64 && last.iter().all(|b| *b == last[0]), "one write whole: {last:?}");
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["state"], "no temp file left");
    }

    #[test]
    fn temp_names_are_recognised_and_nothing_else_is() {
        assert!(is_temp_name(&temp_name("c1")));
        assert!(is_temp_name(".198.18.0.5.tmp42"));
        for other in ["c1", ".tmp1", ".c1.tmp", ".c1.tmpx", "c1.tmp1", "..tmp1"] {
            assert!(!is_temp_name(other), "{other}");
        }
    }

    #[test]
    fn safe_dirs_are_created_beneath_their_root_and_never_through_a_symlink() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let d = SafeDir::open_beneath(r, &r.join("a/b"), true).unwrap();
        assert_eq!(d.shown(), r.join("a/b"));
        fs::write(d.join("f"), b"x").unwrap();
        assert_eq!(fs::read(r.join("a/b/f")).unwrap(), b"x");
        assert_eq!(d.show(&d.join("f")), r.join("a/b/f"));
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), r.join("a/link")).unwrap();
        let e = SafeDir::open_beneath(r, &r.join("a/link/c"), true).unwrap_err();
        assert!(e.to_string().contains("a/link: is a symbolic link"), "{e}");
        assert!(fs::read_dir(elsewhere.path()).unwrap().next().is_none(), "nothing created through the link");
        assert!(SafeDir::open_beneath(r, Path::new("/etc"), false).is_err(), "not beneath the root");
        assert!(SafeDir::open_beneath(r, &r.join("a/../../etc"), false).is_err(), "no ..");
        assert!(d.subdir("../x", true).is_err());
    }
}
