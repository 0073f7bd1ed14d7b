//! Files plexus keeps (caches, state, device-info): private (0600 in 0700 directories) and
//! written atomically (temp file, fsync, rename, fsync of the directory), so a `kill -9` at any
//! point leaves either the old file or the new one.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use crate::error::Error;

/// Create (or truncate) `path` as a private file (0600), open for writing.
pub fn create_private(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)
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
    let tmp = tmp_dir.join(format!(".{}.tmp{}", name.to_string_lossy(), std::process::id()));
    let written = create_private(&tmp).and_then(|mut f| f.write_all(bytes)).and_then(|_| fs::rename(&tmp, path));
    written.map_err(|e| {
        let _ = fs::remove_file(&tmp);
        Error::io(format!("write {}: {e}", path.display()))
    })
}

/// [`write_private_atomic`] with the temp file in `tmp_dir` (same file system), for stores that
/// sweep one directory of the temp files a killed process left.
fn write_private_atomic_via(tmp_dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| Error::io(format!("{} names no file", path.display())))?;
    let tmp = tmp_dir.join(format!(".{}.tmp{}", name.to_string_lossy(), std::process::id()));
    let io = |what: &str, e: std::io::Error| Error::io(format!("{what} {}: {e}", tmp.display()));
    let mut f = create_private(&tmp).map_err(|e| io("create", e))?;
    f.write_all(bytes).and_then(|_| f.sync_all()).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        io("write", e)
    })?;
    fs::rename(&tmp, path).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        Error::io(format!("rename {} to {}: {e}", tmp.display(), path.display()))
    })?;
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Remove `path`; a file that is already gone is success.
pub fn remove_if_present(path: &Path) -> Result<(), Error> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(format!("remove {}: {e}", path.display()))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

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
}
