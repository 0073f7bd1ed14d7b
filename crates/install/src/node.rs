//! The node's side: where plexus goes on the host, putting it there atomically, and removing it.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::OFlag;

use crate::InstallError;

/// The directory beside the meta config holding the kubeconfig and token (0700).
pub const CREDENTIALS_DIR: &str = "plexus.d";

/// Where plexus lives on the node. Paths are the host's (what the kubelet and plexus see);
/// `host_root` is where the host's `/` is mounted in this container.
#[derive(Clone, Debug)]
pub struct Layout {
    pub host_root: PathBuf,
    /// The CNI bin dir (`/opt/cni/bin`).
    pub bin_dir: PathBuf,
    /// The CNI conf dir (`/etc/cni/net.d`).
    pub conf_dir: PathBuf,
    /// Where the node policy goes when one is given (`/etc/cni/plexus/policy.json`).
    pub policy_path: PathBuf,
}

impl Layout {
    /// Each host path must be absolute and plain (no `..`): they are joined under `host_root`.
    pub fn new(
        host_root: PathBuf,
        bin_dir: PathBuf,
        conf_dir: PathBuf,
        policy_path: PathBuf,
    ) -> Result<Layout, InstallError> {
        for (key, p) in [("bin dir", &bin_dir), ("conf dir", &conf_dir), ("policy path", &policy_path)] {
            if !plexus_node::files::is_clean_absolute(p) || p.components().any(|c| c == Component::ParentDir) {
                return Err(InstallError::Invalid(format!("{key} {:?}: an absolute path without \"..\" is needed", p)));
            }
        }
        Ok(Layout { host_root, bin_dir, conf_dir, policy_path })
    }

    /// A host path as this container reaches it.
    pub fn on_host(&self, host_path: &Path) -> PathBuf {
        self.host_root.join(host_path.strip_prefix("/").unwrap_or(host_path))
    }

    /// The credentials directory, as a host path.
    pub fn credentials_dir(&self) -> PathBuf {
        self.conf_dir.join(CREDENTIALS_DIR)
    }
}

/// The binaries to install: every regular file in `from` (the image's /plexus/bin, the installer
/// among them: plexusctl is a node tool too) but hidden ones, sorted.
pub fn shipped_binaries(from: &Path) -> Result<Vec<String>, InstallError> {
    let mut names = Vec::new();
    for entry in fs::read_dir(from).map_err(InstallError::io("read", from))? {
        let entry = entry.map_err(InstallError::io("read", from))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && entry.file_type().is_ok_and(|t| t.is_file()) {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// Make `dir` (and missing parents) with `mode` for the ones made.
pub fn ensure_dir(dir: &Path, mode: u32) -> Result<(), InstallError> {
    fs::DirBuilder::new().recursive(true).mode(mode).create(dir).map_err(InstallError::io("create directory", dir))
}

/// Put `bytes` at `dest` with `mode`, atomically: written and synced as `.<name>.plexus-new`
/// beside it (`O_EXCL|O_NOFOLLOW`, a leftover removed first), renamed over it, the directory
/// synced. Returns false, writing nothing, when `dest` already holds exactly `bytes` with `mode`.
pub fn place(bytes: &[u8], dest: &Path, mode: u32) -> Result<bool, InstallError> {
    place_from(|| Ok(Box::new(bytes)), bytes.len() as u64, dest, mode)
}

/// [`place`] of the file `src`, streamed: neither it nor `dest` is ever held in memory whole
/// (a binary is tens of MB, and the DaemonSet's pod in thin mode has a 64 MiB limit).
pub fn place_file(src: &Path, dest: &Path, mode: u32) -> Result<bool, InstallError> {
    let open = || File::open(src).map_err(InstallError::io("read", src));
    let len = open()?.metadata().map_err(InstallError::io("read", src))?.len();
    place_from(|| Ok(Box::new(open()?)), len, dest, mode)
}

/// Whether `a` and `b` hold the same bytes, read a chunk at a time.
fn same_content(mut a: impl Read, mut b: impl Read) -> std::io::Result<bool> {
    let (mut x, mut y) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        let n = a.read(&mut x)?;
        if n == 0 {
            return Ok(b.read(&mut y[..1])? == 0);
        }
        b.read_exact(&mut y[..n])?;
        if x[..n] != y[..n] {
            return Ok(false);
        }
    }
}

/// [`place`] of the `len` bytes `open` reads (opened again for each pass: the comparison with
/// `dest`, then the write).
fn place_from<'a>(
    open: impl Fn() -> Result<Box<dyn Read + 'a>, InstallError>,
    len: u64,
    dest: &Path,
    mode: u32,
) -> Result<bool, InstallError> {
    if let Ok(meta) = fs::symlink_metadata(dest)
        && meta.is_file()
        && meta.permissions().mode() & 0o7777 == mode
        && meta.len() == len
        && File::open(dest).is_ok_and(|old| open().is_ok_and(|new| same_content(new, old).unwrap_or(false)))
    {
        return Ok(false);
    }
    let mut content = open()?;
    let dir = dest.parent().ok_or_else(|| InstallError::Invalid(format!("{} has no directory", dest.display())))?;
    let name = dest.file_name().ok_or_else(|| InstallError::Invalid(format!("{} names no file", dest.display())))?;
    let tmp = dir.join(format!(".{}.plexus-new", name.to_string_lossy()));
    match fs::remove_file(&tmp) {
        Err(e) if e.kind() != ErrorKind::NotFound => return Err(InstallError::io("remove", &tmp)(e)),
        _ => {}
    }
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(OFlag::O_NOFOLLOW.bits())
        .open(&tmp)
        .and_then(|mut f| {
            // The mode is what was asked, whatever the umask.
            f.set_permissions(fs::Permissions::from_mode(mode))?;
            std::io::copy(&mut content, &mut f)?;
            f.sync_all()
        })
        .and_then(|_| fs::rename(&tmp, dest));
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(InstallError::io("write", dest)(e));
    }
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(true)
}

/// Copy each of `names` from `from` into the node's bin dir (0755). Returns the names replaced.
pub fn install_binaries(layout: &Layout, from: &Path, names: &[String]) -> Result<Vec<String>, InstallError> {
    let dir = layout.on_host(&layout.bin_dir);
    ensure_dir(&dir, 0o755)?;
    let mut changed = Vec::new();
    for name in names {
        if place_file(&from.join(name), &dir.join(name), 0o755)? {
            changed.push(name.clone());
        }
    }
    Ok(changed)
}

/// The meta config `src` into the node's conf dir under its own file name (0644, as libcni's
/// other configs). Returns whether it changed.
pub fn install_meta_config(layout: &Layout, src: &Path) -> Result<bool, InstallError> {
    let bytes = fs::read(src).map_err(InstallError::io("read", src))?;
    serde_json::from_slice::<serde_json::Value>(&bytes)
        .map_err(|e| InstallError::Invalid(format!("meta config {}: not JSON: {e}", src.display())))?;
    let dir = layout.on_host(&layout.conf_dir);
    ensure_dir(&dir, 0o755)?;
    place(&bytes, &dir.join(meta_config_name(src)?), 0o644)
}

/// The name the meta config gets in the conf dir: its own file name.
pub fn meta_config_name(src: &Path) -> Result<String, InstallError> {
    let name = src.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let ok = [".conf", ".conflist", ".json"].iter().any(|ext| name.ends_with(ext));
    if !ok {
        return Err(InstallError::Invalid(format!(
            "meta config {}: libcni reads only .conf, .conflist and .json files",
            src.display()
        )));
    }
    Ok(name)
}

/// The node policy `src` at the layout's policy path (0600, in a 0700 directory when made).
pub fn install_policy(layout: &Layout, src: &Path) -> Result<bool, InstallError> {
    let bytes = fs::read(src).map_err(InstallError::io("read", src))?;
    serde_json::from_slice::<serde_json::Value>(&bytes)
        .map_err(|e| InstallError::Invalid(format!("node policy {}: not JSON: {e}", src.display())))?;
    let dest = layout.on_host(&layout.policy_path);
    if let Some(dir) = dest.parent() {
        ensure_dir(dir, 0o700)?;
    }
    place(&bytes, &dest, 0o600)
}

/// What [`uninstall`] removes.
pub struct Installed<'a> {
    pub binaries: &'a [String],
    /// The meta config's file name in the conf dir.
    pub meta_config: Option<&'a str>,
    pub policy: bool,
}

/// Remove what an install put on the node: the binaries, the meta config, the credentials
/// directory, the policy. What is already gone is fine. Returns the host paths removed.
pub fn uninstall(layout: &Layout, what: &Installed) -> Result<Vec<PathBuf>, InstallError> {
    let mut files: Vec<PathBuf> = what.binaries.iter().map(|b| layout.bin_dir.join(b)).collect();
    if let Some(meta) = what.meta_config {
        files.push(layout.conf_dir.join(meta));
    }
    let creds = layout.credentials_dir();
    files.extend(crate::credentials::FILES.iter().map(|f| creds.join(f)));
    if what.policy {
        files.push(layout.policy_path.clone());
    }
    let mut removed = Vec::new();
    for f in files {
        match fs::remove_file(layout.on_host(&f)) {
            Ok(()) => removed.push(f),
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(InstallError::io("remove", f)(e)),
        }
    }
    // The policy's directory when it is plexus's own (named so, as the default /etc/cni/plexus)
    // and nothing else is in it.
    if what.policy
        && let Some(dir) = layout.policy_path.parent().filter(|d| d.file_name().is_some_and(|n| n == "plexus"))
        && fs::remove_dir(layout.on_host(dir)).is_ok()
    {
        removed.push(dir.to_path_buf());
    }
    // The credentials directory is plexus's own: gone once empty (a leftover temp file included).
    let dir = layout.on_host(&creds);
    if let Ok(entries) = fs::read_dir(&dir) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().ends_with(".plexus-new") {
                let _ = fs::remove_file(e.path());
            }
        }
    }
    match fs::remove_dir(&dir) {
        Ok(()) => removed.push(creds),
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(InstallError::io("remove", creds)(e)),
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn layout(root: &Path) -> Layout {
        Layout::new(root.into(), "/opt/cni/bin".into(), "/etc/cni/net.d".into(), "/etc/cni/plexus/policy.json".into())
            .unwrap()
    }

    fn image(dir: &Path) -> PathBuf {
        let from = dir.join("image");
        fs::create_dir_all(&from).unwrap();
        for (name, body) in [("plexus", "A"), ("plexus-macvlan", "B"), (".keep", "C")] {
            fs::write(from.join(name), body).unwrap();
        }
        from
    }

    #[test]
    fn binaries_land_executable_under_the_host_root_and_hidden_files_stay_in_the_image() {
        let t = tempfile::tempdir().unwrap();
        let from = image(t.path());
        let l = layout(&t.path().join("host"));
        let names = shipped_binaries(&from).unwrap();
        assert_eq!(names, ["plexus", "plexus-macvlan"]);
        assert_eq!(install_binaries(&l, &from, &names).unwrap(), names);
        let p = t.path().join("host/opt/cni/bin/plexus");
        assert_eq!(fs::read(&p).unwrap(), b"A");
        assert_eq!(fs::metadata(&p).unwrap().mode() & 0o777, 0o755);
        assert!(!t.path().join("host/opt/cni/bin/.keep").exists());
    }

    #[test]
    fn an_unchanged_binary_is_not_rewritten_and_a_changed_one_is_a_new_inode() {
        let t = tempfile::tempdir().unwrap();
        let from = image(t.path());
        let l = layout(&t.path().join("host"));
        let names = shipped_binaries(&from).unwrap();
        install_binaries(&l, &from, &names).unwrap();
        let p = t.path().join("host/opt/cni/bin/plexus");
        let before = fs::metadata(&p).unwrap().ino();
        assert!(install_binaries(&l, &from, &names).unwrap().is_empty());
        assert_eq!(fs::metadata(&p).unwrap().ino(), before);
        // An upgrade: a runtime that opened the old file keeps it whole; the name is the new one.
        let old = File::open(&p).unwrap();
        fs::write(from.join("plexus"), "A2").unwrap();
        assert_eq!(install_binaries(&l, &from, &names).unwrap(), ["plexus"]);
        assert_ne!(fs::metadata(&p).unwrap().ino(), before);
        assert_eq!(old.metadata().unwrap().ino(), before);
        assert_eq!(fs::read(&p).unwrap(), b"A2");
        let leftovers: Vec<_> = fs::read_dir(p.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn a_binary_larger_than_a_read_is_compared_and_copied_a_chunk_at_a_time() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("plexus-daemon");
        let mut bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        fs::write(&src, &bytes).unwrap();
        let dest = t.path().join("on-node");
        assert!(place_file(&src, &dest, 0o755).unwrap());
        assert_eq!(fs::read(&dest).unwrap(), bytes);
        assert!(!place_file(&src, &dest, 0o755).unwrap(), "the same bytes: not rewritten");
        // One byte changed past the first chunk: rewritten.
        bytes[2_000_000] ^= 1;
        fs::write(&src, &bytes).unwrap();
        assert!(place_file(&src, &dest, 0o755).unwrap());
        assert_eq!(fs::read(&dest).unwrap(), bytes);
    }

    #[test]
    fn a_symlink_planted_at_the_temp_name_is_replaced_never_written_through() {
        let t = tempfile::tempdir().unwrap();
        let victim = t.path().join("victim");
        fs::write(&victim, "keep").unwrap();
        let dir = t.path().join("bin");
        fs::create_dir(&dir).unwrap();
        std::os::unix::fs::symlink(&victim, dir.join(".plexus.plexus-new")).unwrap();
        assert!(place(b"new", &dir.join("plexus"), 0o755).unwrap());
        assert_eq!(fs::read(&victim).unwrap(), b"keep");
        assert_eq!(fs::read(dir.join("plexus")).unwrap(), b"new");
    }

    #[test]
    fn the_meta_config_must_be_json_with_a_name_libcni_reads() {
        let t = tempfile::tempdir().unwrap();
        let l = layout(&t.path().join("host"));
        let bad = t.path().join("00-plexus.yaml");
        fs::write(&bad, "{}").unwrap();
        assert!(install_meta_config(&l, &bad).unwrap_err().to_string().contains(".conflist"));
        let torn = t.path().join("00-plexus.conflist");
        fs::write(&torn, "{\"cniVersion\":").unwrap();
        assert!(install_meta_config(&l, &torn).unwrap_err().to_string().contains("not JSON"));
        assert!(!t.path().join("host/etc/cni/net.d/00-plexus.conflist").exists());
        fs::write(&torn, "{\"cniVersion\": \"1.0.0\"}").unwrap();
        assert!(install_meta_config(&l, &torn).unwrap());
        assert!(!install_meta_config(&l, &torn).unwrap());
    }

    #[test]
    fn the_policy_is_private_and_uninstall_removes_everything_installed_and_nothing_else() {
        let t = tempfile::tempdir().unwrap();
        let from = image(t.path());
        let l = layout(&t.path().join("host"));
        let names = shipped_binaries(&from).unwrap();
        install_binaries(&l, &from, &names).unwrap();
        let policy = t.path().join("policy.json");
        fs::write(&policy, "{}").unwrap();
        install_policy(&l, &policy).unwrap();
        let p = t.path().join("host/etc/cni/plexus/policy.json");
        assert_eq!(fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
        let meta = t.path().join("00-plexus.conflist");
        fs::write(&meta, "{}").unwrap();
        install_meta_config(&l, &meta).unwrap();
        fs::create_dir_all(t.path().join("host/etc/cni/net.d/plexus.d")).unwrap();
        fs::write(t.path().join("host/etc/cni/net.d/plexus.d/token"), "t").unwrap();
        fs::write(t.path().join("host/opt/cni/bin/bridge"), "other").unwrap();
        fs::write(t.path().join("host/etc/cni/net.d/10-bridge.conf"), "{}").unwrap();
        let what = Installed { binaries: &names, meta_config: Some("00-plexus.conflist"), policy: true };
        let removed = uninstall(&l, &what).unwrap();
        assert_eq!(removed.len(), 7, "{removed:?}");
        // The policy's own directory (named plexus, empty once the policy is gone) goes too.
        for gone in
            ["opt/cni/bin/plexus", "etc/cni/net.d/00-plexus.conflist", "etc/cni/net.d/plexus.d", "etc/cni/plexus"]
        {
            assert!(!t.path().join("host").join(gone).exists(), "{gone}");
        }
        assert!(t.path().join("host/opt/cni/bin/bridge").exists());
        assert!(t.path().join("host/etc/cni/net.d/10-bridge.conf").exists());
        // Again, with everything gone: nothing to do, no error.
        assert!(uninstall(&l, &what).unwrap().is_empty());
    }

    #[test]
    fn host_paths_with_dot_dot_are_refused() {
        let e = Layout::new("/host".into(), "/opt/../../x".into(), "/etc/cni/net.d".into(), "/p".into()).unwrap_err();
        assert!(e.to_string().contains("bin dir"), "{e}");
    }
}
