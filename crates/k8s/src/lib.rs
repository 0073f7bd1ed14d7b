//! plexus-k8s: the Kubernetes side of the meta-plugin. Network selection parsing, NADs (from the
//! API or a directory of manifests), network-status, the kubelet device checkpoint.
//!
//! Must not: run plugins or touch the kernel; the meta-plugin does that with what this returns.

#[cfg(feature = "client")]
pub mod api;
pub mod checkpoint;
#[cfg(feature = "client")]
pub mod claims;
pub mod error;
#[cfg(feature = "client")]
pub mod events;
pub mod nad;
pub mod names;
#[cfg(feature = "client")]
pub mod podresources;
pub mod selection;
pub mod status;

pub use error::K8sError;

/// The namespace of objects that name none, and of pods outside Kubernetes.
pub const DEFAULT_NAMESPACE: &str = "default";
pub use nad::{DirSource, Nad, NadSource};
pub use selection::{NetworkSelection, parse_selections};
