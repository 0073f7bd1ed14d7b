//! plexus-ipam's library: ranges and 128-bit offsets, whereabouts-compatible configuration, the
//! `Store` trait and its stores (node-local files; etcd, and whereabouts' own objects on the
//! Kubernetes API, for cluster-wide pools; each of these two a default feature).
//!
//! Must not: touch network interfaces. It hands out addresses; plugins configure them.

pub mod config;
pub mod error;
pub mod pools;
pub mod range;
pub mod store;

pub use config::{IpamConfig, StoreConfig};
pub use error::IpamError;
pub use range::IpRange;
pub use store::{AllocRequest, Allocation, Owner, Store};
