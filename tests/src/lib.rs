//! plexus-tests: the end-to-end harness every plugin's tests use, and those tests.
//!
//! Owns: node and pod network namespaces with veth "NICs" (unique names, removed on drop and on
//! panic), a runner that execs a built plugin inside the node namespace with the CNI environment,
//! and readers of kernel state (`ip -j`, an observer independent of plexus's own netlink code).
//!
//! Rules (shared/TESTING.md): never touch the host namespace or `eth0`; addresses from
//! 198.18.0.0/15 and 2001:db8::/32; tests need root and fail, loudly, without it.

pub mod etcd;
pub mod fake_api;
pub mod kernel;
pub mod netns;
pub mod runner;

pub use kernel::{Addr, Link, Route, Rule};
pub use netns::{Lab, Netns};
pub use runner::{Outcome, PluginRun, REFERENCE_CNI_DIR, plugin_bin, reference_plugin, tool_bin};

/// Fail the test with a clear message when not root: these tests create namespaces and links.
pub fn require_root() {
    if !nix::unistd::geteuid().is_root() {
        panic!("this test needs root (it creates network namespaces); run the suite as root, as CI does");
    }
}
