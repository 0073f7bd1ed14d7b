//! plexus-net: the kernel boundary. Network namespace handles, one rtnetlink socket per namespace
//! with typed verbs (links, macvlans, addresses, routes, rules), sysctls, and sysfs lookups
//! (netdev → PCI address → RDMA device, and RoCE GID tables) through one configurable root.
//! Plugins reach the kernel through the [`Kernel`] trait, so their steps can run on the
//! recording fake (`fake`, feature `fake`) in unit tests.
//!
//! Must not: parse CNI configs or decide policy; plugins decide, this crate does.
//! Must never call `setns` on a thread tokio may schedule on (see [`netns::Netns::run`]).

pub mod check;
pub mod configure;
pub mod error;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod kernel;
pub mod link;
pub mod netns;
pub mod rdma;
pub mod roce;
pub mod sysfs;

pub use error::NetError;
pub use kernel::Kernel;
pub use link::{Address, Dad, IpFamily, Link, LinkChange, LinkSocket, MacvlanMode, NewMacvlan, RouteSpec, RuleSpec};
pub use netns::{Netns, sysctl};
