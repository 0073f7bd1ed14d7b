//! plexus-cni: the CNI specification, for every plexus crate.
//!
//! Owns: network configuration and conflists, results of every version and their conversions,
//! the error type and every error code, the `CNI_*` environment and its name rules, and the
//! request's deadline as it travels between processes.
//!
//! Must not: read or write files, run processes, or know the node policy, netlink, Kubernetes or
//! any store. Being a plugin and running others is `plexus-plugin`'s; what the node's admin
//! decides and where root keeps files is `plexus-node`'s.

pub mod config;
pub mod deadline;
pub mod env;
pub mod error;
pub mod result;
pub mod version;

pub use config::{ConfList, Ipam, NetConf};
pub use deadline::Deadline;
pub use env::{CniArgs, CniEnv, Command};
pub use error::{Error, ErrorList, code};
pub use result::{CniResult, Dns, Interface, IpConfig, Route};
pub use version::SpecVersion;
