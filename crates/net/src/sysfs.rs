//! sysfs lookups: netdev → PCI or auxiliary device → RDMA device, through one root (`/sys`, or
//! `PLEXUS_SYSFS_ROOT` — tests point it at a fake tree). Plus the device-info document
//! (Network Plumbing WG device-info spec) built from them.
//!
//! Note: `/sys/class/net` shows the namespace that mounted sysfs, so these lookups are for
//! devices of the node (host) namespace, where plugins run.

use std::path::{Path, PathBuf};

use plexus_cni::Error;
use plexus_cni::env::validate_ifname;
use plexus_node::files;
use serde_json::{Value, json};

/// The device-info spec version plexus writes.
pub const DEVICE_INFO_VERSION: &str = "1.1.0";

/// A sysfs tree.
#[derive(Clone, Debug)]
pub struct Sysfs {
    root: PathBuf,
}

/// What sysfs says about a netdev's hardware.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetdevHardware {
    /// PCI address (`0000:3b:00.0`) of the device or, for a sub-function, of its parent.
    pub pci_address: Option<String>,
    /// Auxiliary device name (`mlx5_core.sf.4`) for sub-functions.
    pub auxiliary: Option<String>,
    /// RDMA device (`mlx5_0`) bound to the same device.
    pub rdma_device: Option<String>,
    /// Kernel driver of the device (`mlx5_core`, `vfio-pci`).
    pub driver: Option<String>,
}

impl Sysfs {
    pub fn new(root: impl Into<PathBuf>) -> Sysfs {
        Sysfs { root: root.into() }
    }

    /// Whether this is another tree than the kernel's own `/sys`.
    pub fn is_fake(&self) -> bool {
        self.root != Path::new(plexus_node::paths::SYSFS_ROOT)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The device directory behind netdev `ifname` (resolved), if it has one (veth has none).
    pub fn netdev_device(&self, ifname: &str) -> Option<PathBuf> {
        validate_ifname(ifname).ok()?;
        std::fs::canonicalize(self.root.join("class/net").join(ifname).join("device")).ok()
    }

    /// Hardware facts about netdev `ifname`; empty for virtual devices.
    pub fn netdev_hardware(&self, ifname: &str) -> NetdevHardware {
        let Some(dev) = self.netdev_device(ifname) else { return NetdevHardware::default() };
        self.device_hardware(&dev)
    }

    /// Network devices sysfs lists under a device directory (`<dev>/net/*`, sorted).
    fn net_names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir.join("net"))
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        names.sort();
        names
    }

    /// The PCI device directory of `bdf` (`0000:3b:00.2`), validated.
    pub fn pci_device(&self, bdf: &str) -> Option<PathBuf> {
        plexus_node::hw::is_pci_address(bdf).then(|| self.root.join("bus/pci/devices").join(bdf)).filter(|p| p.exists())
    }

    /// The auxiliary device directory of `id` (`mlx5_core.sf.4`), validated.
    pub fn aux_device(&self, id: &str) -> Option<PathBuf> {
        let ok = !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        ok.then(|| self.root.join("bus/auxiliary/devices").join(id)).filter(|p| p.exists())
    }

    /// Netdevs of PCI device `bdf` (virtio devices keep theirs one level down).
    pub fn netdevs_of_pci(&self, bdf: &str) -> Vec<String> {
        let Some(dev) = self.pci_device(bdf) else { return Vec::new() };
        let direct = Self::net_names(&dev);
        if !direct.is_empty() {
            return direct;
        }
        std::fs::read_dir(&dev)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("virtio"))
                    .flat_map(|e| Self::net_names(&e.path()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Netdevs of auxiliary device `id`.
    pub fn netdevs_of_aux(&self, id: &str) -> Vec<String> {
        self.aux_device(id).map(|d| Self::net_names(&d)).unwrap_or_default()
    }

    /// Netdevs under a kernel device path, which must be absolute and under `/sys/devices/`
    /// (resolved against this root).
    pub fn netdevs_of_kernelpath(&self, path: &str) -> Result<Vec<String>, Error> {
        let rel = path.strip_prefix("/sys/devices/").filter(|r| !r.split('/').any(|c| c == ".." || c == "."));
        let Some(rel) = rel else {
            return Err(Error::invalid_config(format!(
                "kernelpath {path:?} must be an absolute path under /sys/devices/"
            )));
        };
        Ok(Self::net_names(&self.root.join("devices").join(rel)))
    }

    /// Hardware facts about a device directory (PCI function or auxiliary device).
    pub fn device_hardware(&self, dev: &Path) -> NetdevHardware {
        let name = dev.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut hw = NetdevHardware::default();
        if plexus_node::hw::is_pci_address(&name) {
            hw.pci_address = Some(name);
        } else {
            hw.auxiliary = Some(name);
            // A sub-function's parent directory is its PCI function.
            hw.pci_address = dev
                .parent()
                .and_then(|p| p.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .filter(|n| plexus_node::hw::is_pci_address(n));
        }
        hw.rdma_device = first_entry(&dev.join("infiniband"));
        hw.driver = std::fs::read_link(dev.join("driver"))
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
        hw
    }
}

/// Where a netdev's device sits: what the scheduler needs to put it beside a GPU, and what a pod
/// needs to use it for RDMA.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    /// The PCI root complex above the device, as Kubernetes' standard attribute
    /// `resource.kubernetes.io/pcieRoot` spells it: `pci<domain>:<bus>` (`pci0000:3a`).
    pub pcie_root: Option<String>,
    /// The NUMA node of the device (`numa_node`; -1, no node, is `None`).
    pub numa_node: Option<i64>,
    /// What kind of function: `pf` (SR-IOV capable or plain), `vf` (has a `physfn`), `sf`
    /// (an auxiliary device).
    pub function: &'static str,
    /// The RDMA device's user verbs character devices (`uverbs0`), as named under `/dev/infiniband`.
    pub uverbs: Vec<String>,
}

impl Sysfs {
    /// The topology of device directory `dev` (resolved, as [`Sysfs::netdev_device`] gives it),
    /// whose RDMA device is `rdma` when it has one.
    pub fn topology(&self, dev: &Path, rdma: Option<&str>) -> Topology {
        let sf = !plexus_node::hw::is_pci_address(&dev.file_name().unwrap_or_default().to_string_lossy());
        let pci = if sf { dev.parent().unwrap_or(dev) } else { dev };
        let devices = self.root.join("devices");
        // The first component below <root>/devices is the root complex: pci0000:3a.
        let pcie_root = pci
            .strip_prefix(std::fs::canonicalize(&devices).unwrap_or(devices))
            .ok()
            .and_then(|rel| rel.components().next())
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .filter(|r| r.strip_prefix("pci").is_some_and(|b| b.len() == 7 && b.as_bytes()[4] == b':'));
        let numa_node = std::fs::read_to_string(pci.join("numa_node"))
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .filter(|n| *n >= 0);
        let function = match (sf, pci.join("physfn").exists()) {
            (true, _) => "sf",
            (false, true) => "vf",
            (false, false) => "pf",
        };
        let mut uverbs: Vec<String> = rdma
            .filter(|r| r.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .map(|_| {
                std::fs::read_dir(dev.join("infiniband_verbs"))
                    .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
                    .unwrap_or_default()
            })
            .unwrap_or_default();
        uverbs.retain(|u| {
            u.strip_prefix("uverbs").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        });
        uverbs.sort();
        Topology { pcie_root, numa_node, function, uverbs }
    }

    /// The link speed sysfs reports for netdev `ifname`, in Mb/s (none when unknown).
    pub fn link_speed_mbps(&self, ifname: &str) -> Option<i64> {
        validate_ifname(ifname).ok()?;
        let speed = std::fs::read_to_string(self.root.join("class/net").join(ifname).join("speed")).ok()?;
        speed.trim().parse::<i64>().ok().filter(|s| *s > 0)
    }
}

fn first_entry(dir: &Path) -> Option<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).ok()?.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names.into_iter().next()
}

/// The device-info document for a PCI device (and its RDMA device, when it has one).
pub fn device_info_pci(hw: &NetdevHardware) -> Option<Value> {
    let pci = hw.pci_address.as_ref()?;
    let mut inner = serde_json::Map::new();
    inner.insert("pci-address".into(), pci.clone().into());
    if let Some(rdma) = &hw.rdma_device {
        inner.insert("rdma-device".into(), rdma.clone().into());
    }
    Some(json!({"type": "pci", "version": DEVICE_INFO_VERSION, "pci": inner}))
}

/// Write a device-info document (atomically, 0600).
pub fn write_device_info(path: &Path, doc: &Value) -> Result<(), Error> {
    files::write_private_atomic(path, &serde_json::to_vec_pretty(doc).expect("json"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A fake sysfs: a PF with an RDMA device, and a sub-function on it.
    fn fake() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        let pf = r.join("devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0");
        std::fs::create_dir_all(pf.join("infiniband/mlx5_0")).unwrap();
        std::fs::create_dir_all(r.join("bus/pci/drivers/mlx5_core")).unwrap();
        symlink(r.join("bus/pci/drivers/mlx5_core"), pf.join("driver")).unwrap();
        let sf = pf.join("mlx5_core.sf.4");
        std::fs::create_dir_all(sf.join("infiniband/mlx5_4")).unwrap();
        std::fs::create_dir_all(r.join("class/net/ens1f0")).unwrap();
        symlink(&pf, r.join("class/net/ens1f0/device")).unwrap();
        std::fs::create_dir_all(r.join("class/net/en3f0pf0sf4")).unwrap();
        symlink(&sf, r.join("class/net/en3f0pf0sf4/device")).unwrap();
        std::fs::create_dir_all(r.join("class/net/veth0")).unwrap();
        t
    }

    #[test]
    fn fake_sysfs_pf_resolves_to_pci_address_rdma_device_and_driver() {
        let t = fake();
        let hw = Sysfs::new(t.path()).netdev_hardware("ens1f0");
        assert_eq!(hw.pci_address.as_deref(), Some("0000:3b:00.0"));
        assert_eq!(hw.rdma_device.as_deref(), Some("mlx5_0"));
        assert_eq!(hw.driver.as_deref(), Some("mlx5_core"));
        assert_eq!(
            device_info_pci(&hw).unwrap(),
            json!({"type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:3b:00.0", "rdma-device": "mlx5_0"}})
        );
    }

    #[test]
    fn fake_sysfs_vf_resolves_to_its_own_pci_address_and_rdma_device() {
        let t = fake();
        let r = t.path();
        let vf = r.join("devices/pci0000:3a/0000:3a:00.0/0000:3b:00.3");
        std::fs::create_dir_all(vf.join("infiniband/mlx5_3")).unwrap();
        std::fs::create_dir_all(vf.join("net/ens1f0v0")).unwrap();
        symlink(r.join("devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0"), vf.join("physfn")).unwrap();
        std::fs::create_dir_all(r.join("class/net/ens1f0v0")).unwrap();
        symlink(&vf, r.join("class/net/ens1f0v0/device")).unwrap();
        std::fs::create_dir_all(r.join("bus/pci/devices")).unwrap();
        symlink(&vf, r.join("bus/pci/devices/0000:3b:00.3")).unwrap();
        let s = Sysfs::new(r);
        let hw = s.netdev_hardware("ens1f0v0");
        assert_eq!((hw.pci_address.as_deref(), hw.rdma_device.as_deref()), (Some("0000:3b:00.3"), Some("mlx5_3")));
        assert_eq!(s.netdevs_of_pci("0000:3b:00.3"), ["ens1f0v0"]);
        assert!(s.netdevs_of_pci("../../etc").is_empty(), "not a PCI address: never a path");
        assert!(s.netdevs_of_kernelpath("/etc/passwd").is_err());
        assert!(s.netdevs_of_kernelpath("/sys/devices/../../etc").is_err());
    }

    #[test]
    fn fake_sysfs_sub_function_resolves_to_aux_name_parent_pci_and_its_rdma_device() {
        let t = fake();
        let hw = Sysfs::new(t.path()).netdev_hardware("en3f0pf0sf4");
        assert_eq!(hw.auxiliary.as_deref(), Some("mlx5_core.sf.4"));
        assert_eq!(hw.pci_address.as_deref(), Some("0000:3b:00.0"));
        assert_eq!(hw.rdma_device.as_deref(), Some("mlx5_4"));
    }

    #[test]
    fn virtual_and_unsafe_names_have_no_hardware() {
        let t = fake();
        let s = Sysfs::new(t.path());
        assert_eq!(s.netdev_hardware("veth0"), NetdevHardware::default());
        assert_eq!(s.netdev_hardware("../../etc"), NetdevHardware::default());
        assert_eq!(device_info_pci(&NetdevHardware::default()), None);
    }
}
