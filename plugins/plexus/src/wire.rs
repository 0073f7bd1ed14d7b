//! The protocol between the `plexus` shim and `plexus-daemon`, over the daemon's root-only unix
//! socket: one request per connection.
//!
//! 1. The shim writes a [`Request`]: one JSON document on one line (ended by `\n`).
//! 2. The daemon answers one byte at once: [`TAKEN`] when it will run the request (it may wait in
//!    the daemon's queue), or [`NOT_TAKEN`] followed by why (its queue is full, another protocol
//!    version, a request it cannot read, it is stopping) — the shim then runs the request itself.
//! 3. The shim answers [`GO`] if it got [`TAKEN`] within its deadline; past the deadline it runs
//!    the request itself and sends nothing, and the daemon, without [`GO`], does not run it: a
//!    request is never run by both.
//! 4. The daemon writes a [`Response`] (one JSON document) when it is done, and closes — at the
//!    latest [`OVERRUN_GRACE`] after the request's deadline ([`plexus_cni::deadline`]): a request
//!    still running then is answered with code 11 and its slot given back.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The protocol version; a daemon of another version does not take the request.
pub const VERSION: u32 = 1;
/// The daemon has the request.
pub const TAKEN: u8 = b'+';
/// The daemon does not take the request; the reason follows, as text, to the end.
pub const NOT_TAKEN: u8 = b'-';
/// The shim waits for the daemon's answer.
pub const GO: u8 = b'+';
/// The most a request may be: the largest config a plugin reads plus room for the environment.
pub const REQUEST_MAX_BYTES: usize = plexus_plugin::STDIN_MAX_BYTES + 64 * 1024;

/// What the shim was invoked with.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Request {
    pub version: u32,
    /// The variables [`forwarded`] names (`CNI_*`, `PLEXUS_POLICY`, `PLEXUS_DEADLINE`, the trace
    /// context), as the runtime set them.
    pub env: BTreeMap<String, String>,
    /// The config the runtime gave on stdin.
    pub stdin: String,
}

/// What the shim prints and exits with.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Response {
    pub exit: u8,
    pub stdout: String,
}

/// How long after a request's deadline the daemon answers for it, whatever the request does.
pub const OVERRUN_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// The variables a request carries: what the runtime sets for a plugin, the node policy's path,
/// the sysfs root, a deadline the runtime's environment already had, whether a delegation made
/// it, and the runtime's trace context.
pub fn forwarded(key: &str) -> bool {
    key.starts_with("CNI_")
        || key == plexus_node::paths::POLICY_ENV
        || key == plexus_node::paths::SYSFS_ROOT_ENV
        || key == plexus_cni::deadline::DEADLINE_ENV
        || key == plexus_plugin::delegate::DELEGATED_ENV
        || plexus_plugin::trace::TRACE_CONTEXT_ENV.iter().any(|(k, _)| *k == key)
}

/// The deadline of a request with the environment `env`, to be run by `runner`: the node
/// policy's request timeout from now (the policy read through `runner`), or sooner if the
/// environment says so. A policy that cannot be read leaves the default (the request itself then
/// fails on it).
pub fn deadline(runner: &plexus_plugin::builtin::Runner, env: impl Fn(&str) -> Option<String>) -> plexus_cni::Deadline {
    let limits = runner.policy(&env).map(|p| p.limits).unwrap_or_default();
    plexus_cni::Deadline::from_env(env, limits.request_timeout())
}
