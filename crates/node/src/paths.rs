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
