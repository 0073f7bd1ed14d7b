//! CDI specs for prepared claims: the RDMA device's `/dev/infiniband` nodes (its `uverbsN`, and
//! `rdma_cm` when the node has it) put into the containers that use a claim — what the RDMA
//! shared device plugin does today, so a RoCE pod needs no other device plugin.
//!
//! One spec file per claim, `<cdi dir>/plexus.dev-<claim UID>.json` (the runtime reads the
//! directory before each container is made: containerd 2.0's default `/var/run/cdi`), kind
//! `plexus.dev/rdma`, one CDI device per allocated device named `<claim UID>-<device>`; written
//! atomically at prepare, removed at unprepare. Each node is checked to be a character device
//! when the spec is made, and its major and minor written in it.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::error::{DraError, Result};

/// The CDI kind of plexus's devices.
pub const KIND: &str = "plexus.dev/rdma";
/// The CDI spec version: the lowest that has `hostPath` and names starting with a digit.
pub const CDI_VERSION: &str = "0.5.0";

/// A claim UID as the kubelet and the API give it: a UUID (hex digits and `-`). Checked before it
/// becomes part of a file name.
pub fn valid_uid(uid: &str) -> bool {
    !uid.is_empty() && uid.len() <= 64 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// The spec file of claim `uid` in `dir`.
pub fn spec_path(dir: &Path, uid: &str) -> Option<PathBuf> {
    valid_uid(uid).then(|| dir.join(format!("{}-{uid}.json", crate::DRIVER)))
}

/// The fully qualified CDI name of `device` of claim `uid`.
pub fn device_id(uid: &str, device: &str) -> String {
    format!("{KIND}={uid}-{device}")
}

/// A device node of `dev_root` (the host's `/dev`) as CDI names it: at `/dev/<rel>` in the
/// container, checked to be a character device.
fn node(dev_root: &Path, rel: &str) -> Result<Value> {
    let host = dev_root.join(rel);
    let meta = std::fs::metadata(&host).map_err(|e| DraError::File(format!("{}: {e}", host.display())))?;
    if !meta.file_type().is_char_device() {
        return Err(DraError::File(format!("{}: not a character device", host.display())));
    }
    let rdev = meta.rdev();
    Ok(json!({
        "path": Path::new("/dev").join(rel),
        "hostPath": host,
        "type": "c",
        "major": nix::sys::stat::major(rdev),
        "minor": nix::sys::stat::minor(rdev),
        "permissions": "rw",
    }))
}

/// The spec of claim `uid` for `devices` (device name, its RDMA device's `uverbsN`s), the nodes
/// read from `dev_root`. A device with no `uverbs` node is an error: a pod could not use it for
/// RDMA.
pub fn spec(uid: &str, devices: &[(String, Vec<String>)], dev_root: &Path) -> Result<Value> {
    if !valid_uid(uid) {
        return Err(DraError::File(format!("claim UID {uid:?} is not a UID")));
    }
    let rdma_cm = node(dev_root, "infiniband/rdma_cm").ok();
    let mut out = Vec::new();
    for (device, uverbs) in devices {
        if uverbs.is_empty() {
            return Err(DraError::File(format!("device {device}: its RDMA device has no uverbs node")));
        }
        let mut nodes =
            uverbs.iter().map(|u| node(dev_root, &format!("infiniband/{u}"))).collect::<Result<Vec<_>>>()?;
        nodes.extend(rdma_cm.clone());
        out.push(json!({"name": format!("{uid}-{device}"), "containerEdits": {"deviceNodes": nodes}}));
    }
    Ok(json!({"cdiVersion": CDI_VERSION, "kind": KIND, "devices": out}))
}

/// Write claim `uid`'s spec in `dir` (atomically; the directory made when missing).
pub fn write(dir: &Path, uid: &str, spec: &Value) -> Result<PathBuf> {
    let path = spec_path(dir, uid).ok_or_else(|| DraError::File(format!("claim UID {uid:?} is not a UID")))?;
    std::fs::create_dir_all(dir).map_err(|e| DraError::File(format!("{}: {e}", dir.display())))?;
    let bytes = serde_json::to_vec_pretty(spec).expect("json");
    plexus_node::files::write_private_atomic(&path, &bytes).map_err(|e| DraError::File(e.to_string()))?;
    Ok(path)
}

/// Remove claim `uid`'s spec from `dir`; gone already is success.
pub fn remove(dir: &Path, uid: &str) -> Result<()> {
    match spec_path(dir, uid) {
        Some(path) => plexus_node::files::remove_if_present(&path).map_err(|e| DraError::File(e.to_string())),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};

    /// A `/dev` with `uverbs0` (231:192) and `rdma_cm` (10:58) made with mknod. Needs root: without
    /// it the test fails (it never passes without having run).
    fn dev_root() -> tempfile::TempDir {
        assert!(nix::unistd::geteuid().is_root(), "this test needs root (mknod)");
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("infiniband")).unwrap();
        let mode = Mode::from_bits_truncate(0o600);
        mknod(&dir.path().join("infiniband/uverbs0"), SFlag::S_IFCHR, mode, makedev(231, 192)).unwrap();
        mknod(&dir.path().join("infiniband/rdma_cm"), SFlag::S_IFCHR, mode, makedev(10, 58)).unwrap();
        dir
    }

    const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

    #[test]
    fn a_claims_spec_names_each_devices_uverbs_and_rdma_cm_with_their_numbers() {
        let dev = dev_root();
        let spec = spec(UID, &[("rail0".into(), vec!["uverbs0".into()])], dev.path()).unwrap();
        assert_eq!(spec["cdiVersion"], "0.5.0");
        assert_eq!(spec["kind"], "plexus.dev/rdma");
        let d = &spec["devices"][0];
        assert_eq!(d["name"], format!("{UID}-rail0"));
        let nodes = d["containerEdits"]["deviceNodes"].as_array().unwrap();
        assert_eq!(nodes[0]["path"], "/dev/infiniband/uverbs0");
        assert_eq!(nodes[0]["hostPath"], dev.path().join("infiniband/uverbs0").display().to_string());
        assert_eq!(
            (nodes[0]["type"].as_str(), nodes[0]["major"].as_u64(), nodes[0]["minor"].as_u64()),
            (Some("c"), Some(231), Some(192))
        );
        assert_eq!(nodes[1]["path"], "/dev/infiniband/rdma_cm");
        assert_eq!((nodes[1]["major"].as_u64(), nodes[1]["minor"].as_u64()), (Some(10), Some(58)));
        assert_eq!(device_id(UID, "rail0"), format!("plexus.dev/rdma={UID}-rail0"));

        let out = tempfile::tempdir().unwrap();
        let path = write(out.path(), UID, &spec).unwrap();
        assert_eq!(path, out.path().join(format!("plexus.dev-{UID}.json")));
        let back: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(back, spec);
        remove(out.path(), UID).unwrap();
        assert!(!path.exists());
        remove(out.path(), UID).unwrap();
    }

    #[test]
    fn a_missing_or_fake_device_node_and_a_uid_that_is_no_uid_are_refused() {
        let dev = dev_root();
        let e = spec(UID, &[("rail1".into(), vec!["uverbs7".into()])], dev.path()).unwrap_err().to_string();
        assert!(e.contains("uverbs7"), "{e}");
        std::fs::write(dev.path().join("infiniband/uverbs8"), b"").unwrap();
        let e = spec(UID, &[("rail1".into(), vec!["uverbs8".into()])], dev.path()).unwrap_err().to_string();
        assert!(e.contains("not a character device"), "{e}");
        let e = spec(UID, &[("rail1".into(), vec![])], dev.path()).unwrap_err().to_string();
        assert!(e.contains("no uverbs"), "{e}");
        for bad in ["../etc", "", "a/b", "x.json"] {
            assert!(spec(bad, &[], dev.path()).is_err(), "{bad}");
            assert!(spec_path(Path::new("/var/run/cdi"), bad).is_none(), "{bad}");
        }
    }
}
