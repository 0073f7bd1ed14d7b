//! Errors of the Kubernetes side, each with its CNI code.

use plexus_cni::{Error, code};

#[derive(Debug, thiserror::Error)]
pub enum K8sError {
    /// The network selection annotation (or `networks`) does not parse.
    #[error("{0}")]
    Selection(String),
    /// A NetworkAttachmentDefinition that is not there.
    #[error("cannot find a network-attachment-definition ({name}) in namespace ({namespace})")]
    NadNotFound { namespace: String, name: String },
    /// A NAD or conf file that does not parse, or a refused namespace.
    #[error("{0}")]
    Config(String),
    /// The API server did not answer in time, or answered with a server error.
    #[error("Kubernetes API: {0}")]
    Unavailable(String),
    /// The API server refused the request itself (400, 409, 413, 422...): the same request
    /// would be refused again, so a writer that outlives the call (plexus-daemon's network-status)
    /// gives it up rather than retrying. A runtime still gets code 11: its retry is a new request.
    #[error("Kubernetes API: {0}")]
    Refused(String),
    /// Reading local files (NAD dir, checkpoint, cache).
    #[error("{0}")]
    Io(String),
}

impl From<K8sError> for Error {
    fn from(e: K8sError) -> Self {
        let c = match &e {
            K8sError::Selection(_) | K8sError::NadNotFound { .. } | K8sError::Config(_) => code::INVALID_NETWORK_CONFIG,
            K8sError::Unavailable(_) | K8sError::Refused(_) => code::TRY_AGAIN_LATER,
            K8sError::Io(_) => code::IO_FAILURE,
        };
        Error::new(c, e.to_string())
    }
}
