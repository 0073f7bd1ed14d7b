//! plexus-cni: the CNI specification, for every plexus binary.
//!
//! Owns: network configuration and conflists, results of every version and their conversions,
//! the error type and every error code, the `CNI_*` environment and name rules, the plugin entry
//! point, delegation to other plugins, and logging setup.
//!
//! Must not: touch netlink, namespaces, Kubernetes or any store. Those live in `plexus-net`,
//! `plexus-k8s` and `plexus-ipam`, which depend on this crate for their error type.

pub mod builtin;
pub mod chain;
pub mod config;
pub mod datadir;
pub mod deadline;
pub mod delegate;
pub mod env;
pub mod error;
pub mod fault;
pub mod files;
pub mod hw;
pub mod logging;
pub mod paths;
pub mod plugin;
pub mod policy;
pub mod result;
#[cfg(feature = "testing")]
pub mod testing;

pub mod undo;
pub mod version;

pub use config::{ConfList, Ipam, NetConf};
pub use deadline::Deadline;
pub use env::{CniArgs, CniEnv, Command};
pub use error::{Error, ErrorList, code};
pub use plugin::{About, Plugin, Request, ValidAttachment};
pub use policy::Policy;
pub use result::{CniResult, Dns, Interface, IpConfig, Route};
pub use version::SpecVersion;
