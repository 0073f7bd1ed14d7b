//! Errors at the kernel boundary, each naming the operation that failed.

use std::io;
use std::path::PathBuf;

use plexus_cni::{Error as CniError, code};

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The kernel refused a netlink request.
    #[error("{op}: {source}")]
    Netlink { op: String, source: io::Error },
    /// The netlink conversation itself broke (socket closed, unexpected reply).
    #[error("{op}: {msg}")]
    Protocol { op: String, msg: String },
    /// A network namespace path that cannot be opened.
    #[error("failed to open netns {path:?}: {source}")]
    NetnsOpen { path: PathBuf, source: io::Error },
    /// A file under /proc/sys or /sys, or a namespace switch.
    #[error("{op}: {source}")]
    Io { op: String, source: io::Error },
}

impl NetError {
    pub fn netlink(op: impl Into<String>, source: io::Error) -> Self {
        NetError::Netlink { op: op.into(), source }
    }

    pub fn io(op: impl Into<String>, source: io::Error) -> Self {
        NetError::Io { op: op.into(), source }
    }

    /// The errno behind this error, when the kernel gave one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NetError::Netlink { source, .. } | NetError::Io { source, .. } | NetError::NetnsOpen { source, .. } => {
                source.raw_os_error()
            }
            NetError::Protocol { .. } => None,
        }
    }

    /// The object is not there (ENODEV, ENOENT, ESRCH): what DEL treats as already done.
    pub fn is_not_found(&self) -> bool {
        matches!(self.errno(), Some(nix::libc::ENODEV | nix::libc::ENOENT | nix::libc::ESRCH))
    }

    /// The object exists already (EEXIST).
    pub fn is_exists(&self) -> bool {
        self.errno() == Some(nix::libc::EEXIST)
    }
}

impl From<NetError> for CniError {
    fn from(e: NetError) -> Self {
        let code = match &e {
            NetError::NetnsOpen { .. } => code::INVALID_NETNS,
            _ => code::KERNEL,
        };
        CniError::new(code, e.to_string())
    }
}

pub type Result<T, E = NetError> = std::result::Result<T, E>;
