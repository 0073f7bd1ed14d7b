//! plexus-plugin: being a CNI plugin, and running others.
//!
//! Owns: the plugin entry point (libcni's `pkg/skel`: the environment and stdin read and checked,
//! the handler called, one document printed), logging, the rollback of a failed ADD, and
//! delegation (libcni's `pkg/invoke`: a plugin exec'd, or run in-process by a long-running
//! parent, and chains of them). Both halves are one crate because a plugin run in-process runs
//! through its own entry point, and a plugin's request says how its delegates run.
//!
//! Must not: touch netlink, Kubernetes or any store (`plexus-net`, `plexus-k8s`, `plexus-ipam`).

pub mod builtin;
pub mod chain;
pub mod delegate;
mod device_info;
pub mod ipam;
pub mod logging;
mod plugin;
pub mod role;
#[cfg(feature = "testing")]
pub mod testing;
pub mod trace;
pub mod undo;

pub use plugin::{
    About, IDENTIFY_ENV, Plugin, RUNTIME_ARGS, Request, STDIN_MAX_BYTES, ValidAttachment, dispatch, identity,
    refuse_as_delegate, run,
};
