//! IPAM errors, each mapped to its CNI code.

use std::net::IpAddr;

use plexus_cni::{Error, code};

#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    /// A configuration value that cannot be used (names the key and the value).
    #[error("{0}")]
    Config(String),
    /// A config that can never hold an allocation here — a store the node policy does not allow
    /// it, a range with no address its store can hold (names the key, the value and the rule):
    /// nothing was ever stored under it, so DEL has nothing to release.
    #[error("{0}")]
    Refused(String),
    /// No free address left in a range.
    #[error("no free address left in range {range}")]
    Exhausted { range: String },
    /// A requested address held by another attachment.
    #[error("requested address {ip} is already allocated to {holder}")]
    InUse { ip: IpAddr, holder: String },
    /// A requested address outside every configured range (or excluded).
    #[error("requested address {ip} is outside every range of this network (or excluded)")]
    Outside { ip: IpAddr },
    /// The store cannot be reached or did not answer in time: the runtime should retry.
    #[error("IPAM store unavailable: {0}")]
    Unavailable(String),
    /// A local store failure (file system).
    #[error("IPAM store: {0}")]
    Store(String),
    /// A record of a later plexus's format (`plexus_node::format`): refused, left as it is.
    #[error("{0}")]
    Format(Error),
}

impl From<IpamError> for Error {
    fn from(e: IpamError) -> Self {
        let c = match &e {
            IpamError::Format(e) => return e.clone(),
            IpamError::Config(_) | IpamError::Refused(_) => code::INVALID_NETWORK_CONFIG,
            IpamError::Exhausted { .. } => code::IPAM_EXHAUSTED,
            IpamError::InUse { .. } => code::IPAM_ADDRESS_IN_USE,
            IpamError::Outside { .. } => code::IPAM_ADDRESS_OUTSIDE,
            IpamError::Unavailable(_) => code::TRY_AGAIN_LATER,
            IpamError::Store(_) => code::IO_FAILURE,
        };
        Error::new(c, e.to_string())
    }
}
