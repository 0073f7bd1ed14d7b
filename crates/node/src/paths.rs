//! Default locations of everything plexus reads and writes on a node, said once.

/// The node policy (admin-owned; `PLEXUS_POLICY` moves it).
pub const POLICY_FILE: &str = "/etc/cni/plexus/policy.json";
/// The environment variable naming another policy file (the runtime's environment).
pub const POLICY_ENV: &str = "PLEXUS_POLICY";
/// Plugin binaries.
pub const CNI_BIN_DIR: &str = "/opt/cni/bin";
/// Network configurations (cnitool's `NETCONFPATH` default).
pub const CNI_CONF_DIR: &str = "/etc/cni/net.d";
/// The meta-plugin's delegate cache.
pub const META_CACHE_DIR: &str = "/var/lib/cni/plexus";
/// Multus's delegate cache (its default `cniDir`), which the meta-plugin reads on a node switched
/// from Multus (`multusCacheDir`).
pub const MULTUS_CACHE_DIR: &str = "/var/lib/cni/multus";
/// plexus-ipam's file store.
pub const IPAM_DATA_DIR: &str = "/var/lib/cni/plexus-ipam";
/// plexus-host-device's state files.
pub const HOST_DEVICE_DATA_DIR: &str = "/var/lib/cni/plexus-host-device";
/// Where per-attachment device-info files go (device-info spec §4).
pub const DEVICE_INFO_CNI_DIR: &str = "/var/run/k8s.cni.cncf.io/devinfo/cni";
/// Where device plugins leave theirs (device-info spec §5).
pub const DEVICE_INFO_DP_DIR: &str = "/var/run/k8s.cni.cncf.io/devinfo/dp";

/// Where plexus's DRA driver keeps the claims it prepared, for the meta-plugin's ADD.
pub const DRA_CLAIMS_DIR: &str = "/run/plexus/dra/claims";

/// The root sysfs is read through (the real one).
pub const SYSFS_ROOT: &str = "/sys";
/// Names another sysfs root, for a fake tree (the tests; a node whose sysfs is mounted elsewhere).
/// Who may set it: whoever starts the plugin (the runtime's environment, plexus-daemon's
/// `--sysfs-root`); a request carries it to its delegates, in-process ones too.
pub const SYSFS_ROOT_ENV: &str = "PLEXUS_SYSFS_ROOT";

/// The sysfs root `named` (the value of [`SYSFS_ROOT_ENV`]) says: [`SYSFS_ROOT`] when it is unset
/// or empty.
pub fn sysfs_root(named: Option<&str>) -> std::path::PathBuf {
    named.filter(|v| !v.is_empty()).unwrap_or(SYSFS_ROOT).into()
}
