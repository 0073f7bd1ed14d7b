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
    /// A requested address held by another attachment, shown as the asking pod may see it.
    #[error("requested address {ip} is already allocated to {holder}")]
    InUse { ip: IpAddr, holder: Holder },
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

/// Who holds an address, as an error shows it to the pod that asked for it. An error reaches a
/// tenant (the pod's events, the runtime's logs, a claim's status): it names the holder's pod
/// when it is of the asking pod's namespace, else only that a pod of another namespace holds it,
/// and never a container ID. The only way to make one a pod's is [`Holder::as_seen_by`], so no
/// store can show more.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder(String);

impl Holder {
    /// The holder whose pod is `held_by` (`namespace/name`, when the store knows it), as the
    /// attachment `asking` may see it.
    pub fn as_seen_by(held_by: Option<&str>, asking: &crate::Owner) -> Holder {
        let ns_of = |p: &str| p.split_once('/').map(|(ns, _)| ns.to_string());
        let theirs = held_by.filter(|p| !p.is_empty());
        Holder(match (theirs.and_then(ns_of), asking.pod_ref.as_deref().and_then(ns_of)) {
            (Some(t), Some(mine)) if t == mine => theirs.unwrap_or_default().to_string(),
            (Some(_), _) => "a pod of another namespace".into(),
            (None, _) => "another attachment".into(),
        })
    }
}

impl Holder {
    /// The node itself: an address configured on its interface `ifname` (a port's, the uplink's).
    pub fn node(ifname: &str) -> Holder {
        Holder(format!("this node ({ifname})"))
    }

    /// The range's gateway.
    pub fn gateway() -> Holder {
        Holder("the range's gateway".into())
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
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
