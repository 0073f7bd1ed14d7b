//! The `kubernetes` store: whereabouts' own objects on the Kubernetes API, so plexus-ipam and
//! whereabouts share pools and a cluster can switch in either direction without renumbering.
//!
//! ```text
//! IPPool (whereabouts.cni.cncf.io/v1alpha1), named [<network_name>-]<range, ':' and '/' → '-'>
//!   spec.range        the network CIDR (198.18.0.0/24)
//!   spec.allocations  "<decimal offset from the network address>": {id, podref, ifname}
//!   metadata.annotations["ipam.plexus.io/next"]   plexus's next-fit cursor (a hint)
//! OverlappingRangeIPReservation, named [<network_name>-]<address, ':' → '-'>
//!   spec              {containerid, podref, ifname}
//! ```
//!
//! No global lock: an allocation is one JSON Patch that `test`s the offset is absent and `add`s
//! it; a release `test`s the entry's container ID and `remove`s it. Two writers can never take
//! one address, so allocations of different addresses never conflict — also with whereabouts,
//! whose patches `test` the pool's resourceVersion and retry when plexus wrote in between. A
//! failed `test` (422) moves on to the next candidate; a deadline bounds it all (code 11).
//! A node's own writers take turns (a file lock), and an ADD or DEL waiting for its turn leaves its
//! request in the pool's spool: the writer whose turn it is serves every waiting request in its
//! one write (group commit, [`spool`]), so a node's concurrent ADDs and DELs on
//! one pool cost one IPPool write, not one each. Reservations are created by each ADD itself after
//! its entry, and deleted by each DEL itself before its entry, outside the turn.
//! `"leaderElection": true` takes whereabouts' `whereabouts` Lease around each change instead, for
//! operators who want strict equivalence.
//!
//! whereabouts writes offsets as uint64 and reads them back as int64: offsets of 2^63 and more
//! (the upper half of an IPv6 /64) would be lost on its side, so plexus never hands them out.

#[cfg(feature = "kubernetes")]
mod batch;
#[cfg(feature = "kubernetes")]
mod client;
#[cfg(feature = "kubernetes")]
mod lease;
mod names;
mod pool;
#[cfg(feature = "kubernetes")]
mod spool;

#[cfg(feature = "kubernetes")]
pub use client::KubernetesStore;
pub use names::{pool_name, reservation_name};
pub use pool::MAX_OFFSET;
#[cfg(feature = "fuzzing")]
pub(crate) use pool::read_back;
