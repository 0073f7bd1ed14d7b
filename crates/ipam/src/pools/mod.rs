//! Pools whose nodes take blocks: nv-ipam's `IPPool` objects (`"poolName"` in a network's IPAM
//! config, as nv-ipam's plugin reads it). A node holds blocks of a pool, recorded in the pool's
//! `status.allocations`, and gives pods addresses from them in node-local files: no API write per
//! pod. The objects' format and block arithmetic are [`ippool`], the node selector
//! [`selector`], the node's side (its blocks, its claims, its files) [`store`].

pub mod ippool;
pub mod selector;
#[cfg(feature = "kubernetes")]
pub mod store;
