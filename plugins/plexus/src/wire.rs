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
//! 4. The daemon writes a [`Response`] (one JSON document) when it is done, and closes.

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
pub const REQUEST_MAX_BYTES: usize = plexus_cni::plugin::STDIN_MAX_BYTES + 64 * 1024;

/// What the shim was invoked with.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Request {
    pub version: u32,
    /// The `CNI_*` variables and `PLEXUS_POLICY`, as the runtime set them.
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

/// The variables a request carries: what the runtime sets for a plugin, and the node policy's
/// path.
pub fn forwarded(key: &str) -> bool {
    key.starts_with("CNI_") || key == plexus_cni::paths::POLICY_ENV
}
