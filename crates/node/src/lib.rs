//! plexus-node: what the node's admin decides, and how root keeps files on the node.
//!
//! Owns: the node policy (what a network config may choose, limits, log destination), the
//! default paths, the versions of the files plexus keeps, private files written atomically and directories opened beneath their root
//! without following symlinks, the data directories a config names, the written forms of
//! hardware addresses, and the reliability tests' fault injection points.
//!
//! Must not: run plugins or parse a request (`plexus-plugin`), touch netlink, Kubernetes or any
//! store. Its errors are the CNI's (`plexus-cni`), with the code a plugin answers with.

pub mod datadir;
pub mod fault;
pub mod files;
pub mod format;
pub mod hw;
pub mod paths;
pub mod policy;

pub use policy::{Policy, PolicyMemo};
