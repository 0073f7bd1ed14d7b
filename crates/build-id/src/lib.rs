//! plexus-build-id: which build of plexus this is.
//!
//! Owns: [`BUILD`], a digest of everything that decides what the plugins' code does — every
//! source file and manifest of the workspace's `crates/` and `plugins/`, `Cargo.lock`, the
//! compiler's version and the build profile — computed once per build by `build.rs`. Two
//! binaries with the same [`BUILD`] run the same plugin code: `plexus-daemon` runs a delegate
//! in-process only when the binary it would exec reports the daemon's own [`BUILD`]
//! (`plexus_plugin::builtin`).
//!
//! Must not: depend on anything, or hold anything but the constant (every crate that uses it is
//! rebuilt when it changes).

/// This build's identity: 16 hex digits of a SHA-256 over the sources, lock file, compiler and
/// profile.
pub const BUILD: &str = env!("PLEXUS_BUILD_ID");
