//! The CNI error: a code, a message and details, printed as JSON on stdout.
//!
//! Every CNI code plexus uses is defined in [`code`], once.

use serde::{Deserialize, Serialize};

use crate::version::SpecVersion;

/// CNI error codes. 0–99 belong to the spec; 100 and up are plexus's own.
pub mod code {
    /// Incompatible CNI version.
    pub const INCOMPATIBLE_CNI_VERSION: u32 = 1;
    /// Unsupported field in network configuration.
    pub const UNSUPPORTED_FIELD: u32 = 2;
    /// Container unknown or does not exist (no cleanup needed).
    pub const UNKNOWN_CONTAINER: u32 = 3;
    /// Invalid necessary environment variables (CNI_COMMAND, CNI_IFNAME, ...).
    pub const INVALID_ENVIRONMENT_VARIABLES: u32 = 4;
    /// I/O failure (e.g. reading stdin).
    pub const IO_FAILURE: u32 = 5;
    /// Failed to decode content (bad JSON).
    pub const DECODING_FAILURE: u32 = 6;
    /// Invalid network config.
    pub const INVALID_NETWORK_CONFIG: u32 = 7;
    /// Invalid network namespace (libcni `ErrInvalidNetNS`; not in the spec text).
    pub const INVALID_NETNS: u32 = 8;
    /// Try again later: a transient condition (store or API unreachable).
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// STATUS: the plugin is not available.
    pub const PLUGIN_NOT_AVAILABLE: u32 = 50;
    /// STATUS: the plugin is not available, existing containers may be degraded.
    pub const PLUGIN_NOT_AVAILABLE_DEGRADED: u32 = 51;

    // plexus's own codes.
    /// A delegate plugin named by `type` is not in `CNI_PATH`.
    pub const DELEGATE_NOT_FOUND: u32 = 100;
    /// A delegate plugin failed without a CNI error of its own, or printed something unreadable.
    pub const DELEGATE_FAILED: u32 = 101;
    /// A kernel operation (netlink, sysctl, namespace) failed.
    pub const KERNEL: u32 = 102;
    /// ADD: `CNI_IFNAME` is already in use in the container (spec: ADD must fail then).
    pub const IFNAME_TAKEN: u32 = 103;
    /// CHECK: the attachment is not as ADD left it (names what differs).
    pub const CHECK_FAILED: u32 = 104;
    /// A file plexus keeps on the node (cache, state, record, journal) is in a format version
    /// later than this build reads: written by a newer plexus, left as it is (`plexus_node::format`).
    pub const FORMAT_TOO_NEW: u32 = 105;
    /// IPAM: no free address left in a range.
    pub const IPAM_EXHAUSTED: u32 = 110;
    /// IPAM: a requested address is held by another attachment.
    pub const IPAM_ADDRESS_IN_USE: u32 = 111;
    /// IPAM: a requested address is outside every range.
    pub const IPAM_ADDRESS_OUTSIDE: u32 = 112;

    /// An unexpected internal failure (libcni `ErrInternal`).
    pub const INTERNAL: u32 = 999;
}

/// A CNI error as the spec defines it: `{"cniVersion","code","msg","details"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{msg}{}", if details.is_empty() { String::new() } else { format!("; {details}") })]
pub struct Error {
    pub code: u32,
    pub msg: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl Error {
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        Error { code, msg: msg.into(), details: String::new() }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// Prefix the message with what was being done, keeping code and details.
    pub fn context(mut self, what: impl std::fmt::Display) -> Self {
        self.msg = format!("{what}: {}", self.msg);
        self
    }

    pub fn incompatible_version(config: &str) -> Self {
        let supported: Vec<String> = SpecVersion::supported_strings().iter().map(|v| format!("{v:?}")).collect();
        Error::new(code::INCOMPATIBLE_CNI_VERSION, "incompatible CNI versions")
            .with_details(format!("config is {config:?}, plugin supports [{}]", supported.join(" ")))
    }

    pub fn invalid_config(msg: impl Into<String>) -> Self {
        Error::new(code::INVALID_NETWORK_CONFIG, msg)
    }

    pub fn invalid_env(msg: impl Into<String>) -> Self {
        Error::new(code::INVALID_ENVIRONMENT_VARIABLES, msg)
    }

    pub fn decoding(msg: impl Into<String>) -> Self {
        Error::new(code::DECODING_FAILURE, msg)
    }

    pub fn io(msg: impl Into<String>) -> Self {
        Error::new(code::IO_FAILURE, msg)
    }

    pub fn try_again_later(msg: impl Into<String>) -> Self {
        Error::new(code::TRY_AGAIN_LATER, msg)
    }

    pub fn kernel(msg: impl Into<String>) -> Self {
        Error::new(code::KERNEL, msg)
    }

    pub fn internal(msg: impl Into<String>) -> Self {
        Error::new(code::INTERNAL, msg)
    }

    /// The JSON document a plugin prints on stdout for this error.
    pub fn to_json(&self, version: SpecVersion) -> serde_json::Value {
        let mut doc = serde_json::Map::new();
        doc.insert("cniVersion".into(), version.as_str().into());
        doc.insert("code".into(), self.code.into());
        doc.insert("msg".into(), self.msg.clone().into());
        if !self.details.is_empty() {
            doc.insert("details".into(), self.details.clone().into());
        }
        serde_json::Value::Object(doc)
    }
}

/// The failures of steps that each went on past the others' (the DELs of every attachment, a
/// GC), each kept with what failed and its own code, and rendered once as one CNI error.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErrorList(Vec<(String, Error)>);

impl ErrorList {
    /// `what` (the network and interface, say) failed with `e`.
    pub fn push(&mut self, what: impl Into<String>, e: Error) {
        self.0.push((what.into(), e));
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// `Ok` when nothing failed. Otherwise one error: the failures' code when they all have the
    /// same one (a runtime retries a code 11 as it would one delegate's), else `mixed`; `summary`
    /// as its message, and in its details each failure (what failed, its code, its message) in
    /// order.
    pub fn into_result(self, mixed: u32, summary: impl Into<String>) -> Result<(), Error> {
        let Some((_, first)) = self.0.first() else { return Ok(()) };
        let code = if self.0.iter().all(|(_, e)| e.code == first.code) { first.code } else { mixed };
        Err(Error::new(code, summary).with_details(self.describe()))
    }

    /// Each failure — what failed, its code, its message — in order, `; ` between them.
    pub fn describe(&self) -> String {
        let each: Vec<String> = self.0.iter().map(|(what, e)| format!("{what}: code {}: {e}", e.code)).collect();
        each.join("; ")
    }
}

impl Extend<(String, Error)> for ErrorList {
    fn extend<I: IntoIterator<Item = (String, Error)>>(&mut self, iter: I) {
        self.0.extend(iter);
    }
}

impl FromIterator<(String, Error)> for ErrorList {
    fn from_iter<I: IntoIterator<Item = (String, Error)>>(iter: I) -> Self {
        ErrorList(iter.into_iter().collect())
    }
}

impl IntoIterator for ErrorList {
    type Item = (String, Error);
    type IntoIter = std::vec::IntoIter<(String, Error)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_json_has_version_code_msg_and_details_only_when_set() {
        let e = Error::invalid_config("bad mtu");
        let v = e.to_json(SpecVersion::V1_0_0);
        assert_eq!(v, serde_json::json!({"cniVersion":"1.0.0","code":7,"msg":"bad mtu"}));
        let v = e.with_details("mtu 9001 > 9000").to_json(SpecVersion::V0_4_0);
        assert_eq!(v["details"], "mtu 9001 > 9000");
    }

    #[test]
    fn display_joins_msg_and_details_like_libcni() {
        let e = Error::new(4, "interface name is too long").with_details("x");
        assert_eq!(e.to_string(), "interface name is too long; x");
        assert_eq!(Error::new(4, "m").to_string(), "m");
    }

    #[test]
    fn an_error_list_keeps_each_failures_code_and_renders_them_once() {
        assert_eq!(ErrorList::default().into_result(code::DELEGATE_FAILED, "DEL failed"), Ok(()));
        let mut one = ErrorList::default();
        one.push("network a (net1)", Error::try_again_later("API server unreachable"));
        let e = one.clone().into_result(code::DELEGATE_FAILED, "DEL failed for 1 attachment(s)").unwrap_err();
        assert_eq!(e.code, code::TRY_AGAIN_LATER, "one failure keeps its code");
        assert_eq!(e.msg, "DEL failed for 1 attachment(s)");
        assert_eq!(e.details, "network a (net1): code 11: API server unreachable");
        one.push("network b (net2)", Error::try_again_later("etcd unreachable").with_details("deadline"));
        let e = one.clone().into_result(code::DELEGATE_FAILED, "DEL failed for 2 attachment(s)").unwrap_err();
        assert_eq!(e.code, code::TRY_AGAIN_LATER, "failures of one code keep it");
        assert_eq!(
            e.details,
            "network a (net1): code 11: API server unreachable; network b (net2): code 11: etcd unreachable; deadline"
        );
        one.push("network c (net3)", Error::kernel("no such device"));
        let e = one.into_result(code::DELEGATE_FAILED, "DEL failed for 3 attachment(s)").unwrap_err();
        assert_eq!(e.code, code::DELEGATE_FAILED, "failures of several codes");
        assert!(e.details.ends_with("network c (net3): code 102: no such device"), "{}", e.details);
    }
}
