//! The seam in front of the kernel: [`Kernel`] is what a plugin asks of one network namespace —
//! the rtnetlink verbs it uses and the sysctls it writes. [`crate::LinkSocket`] sends them to the
//! kernel; `crate::fake::FakeKernel` (feature `fake`) records them and can fail any one, so a
//! plugin's steps and its rollback order are unit-tested without root.

use std::path::PathBuf;

use ipnetwork::IpNetwork;

use crate::error::Result;
use crate::link::{Address, Dad, IpFamily, Link, LinkChange, NewMacvlan, RouteSpec, RuleSpec};

/// One network namespace's kernel, as the plugins use it. Every verb is one request (a dump for
/// the listing ones); a verb that finds nothing answers `Ok(None)` or an empty list, never an error.
// The plugins drive these on a current-thread runtime: no `Send` bound is wanted on the futures.
#[allow(async_fn_in_trait)]
pub trait Kernel {
    /// The link called `name`, or `None`.
    async fn link(&self, name: &str) -> Result<Option<Link>>;
    /// The link with index `index`, or `None`.
    async fn link_by_index(&self, index: u32) -> Result<Option<Link>>;
    /// Every link.
    async fn links(&self) -> Result<Vec<Link>>;
    /// The link of the first default route (IPv4, then IPv6) of the main table.
    async fn default_route_link(&self) -> Result<Option<Link>>;
    /// Create a macvlan (in `m.netns` when given, else here).
    async fn add_macvlan(&self, m: &NewMacvlan<'_>) -> Result<()>;
    /// Apply `c` to link `index` in one request.
    async fn set_link(&self, index: u32, c: &LinkChange<'_>) -> Result<()>;
    async fn delete_link(&self, index: u32) -> Result<()>;
    /// Add (`present`) or remove the alternative name `name` of link `index`.
    async fn set_alt_name(&self, index: u32, name: &str, present: bool) -> Result<()>;
    /// Add `addr` (host part kept) to link `index`.
    async fn add_address(&self, index: u32, addr: IpNetwork, dad: Dad) -> Result<()>;
    /// The addresses of link `index`, both families.
    async fn addresses(&self, index: u32) -> Result<Vec<Address>>;
    async fn add_route(&self, r: &RouteSpec) -> Result<()>;
    /// Delete the main table's default routes of `family` through link `index`; how many went.
    async fn delete_default_routes(&self, index: u32, family: IpFamily) -> Result<usize>;
    /// Every route, both families, all tables.
    async fn all_routes(&self) -> Result<Vec<RouteSpec>>;
    async fn add_rule(&self, r: &RuleSpec) -> Result<()>;
    async fn delete_rule(&self, r: &RuleSpec) -> Result<()>;
    /// Source rules of both families.
    async fn rules(&self) -> Result<Vec<RuleSpec>>;
    /// Write sysctls (paths under `/proc/sys`, see [`crate::sysctl`]) in this namespace, in order.
    fn write_sysctls(&self, settings: &[(PathBuf, &str)]) -> Result<()>;
}
