//! What the DaemonSet's pod does on its node, as a library: put plexus's binaries, the meta config
//! and the node policy in place ([`node`]), write the service-account kubeconfig and keep it
//! current ([`credentials`]), and take it all away again. Every file is written beside its final
//! name (`O_EXCL|O_NOFOLLOW`), synced and renamed into place, so a runtime exec'ing a plugin or
//! reading the CNI conf dir during an upgrade finds the old file or the new one, never half of one.
//!
//! Who sets what: everything here comes from the DaemonSet's arguments and mounts (the cluster
//! admin's); nothing comes from a NAD or a pod.

pub mod credentials;
pub mod node;

use std::path::PathBuf;

/// What went wrong, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

impl InstallError {
    pub(crate) fn io(what: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> InstallError {
        let path = path.into();
        move |source| InstallError::Io { what, path, source }
    }
}
