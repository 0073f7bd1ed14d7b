//! The DRA driver's errors. Each ends as a message: in the kubelet's answer to a prepare or
//! unprepare (which the kubelet shows in the pod's events), or in the daemon's log.

/// What went wrong, and where.
#[derive(Debug, thiserror::Error)]
pub enum DraError {
    /// The claim cannot be prepared on this node: its allocation, its config or its devices.
    #[error("claim {namespace}/{name}: {why}")]
    Claim { namespace: String, name: String, why: String },
    /// The API did not give what was asked (the claim, its status).
    #[error("{0}")]
    Api(String),
    /// A file of the driver's (a CDI spec, a prepared claim, a device node) could not be used.
    #[error("{0}")]
    File(String),
    /// A prepared claim written by a later plexus: not read as this build's.
    #[error("{path}: format {version} of a later plexus: not read")]
    LaterFormat { path: String, version: u32 },
    /// The node's ports could not be scanned (netlink, the node policy).
    #[error("scanning the node's ports: {0}")]
    Scan(String),
}

pub type Result<T> = std::result::Result<T, DraError>;
