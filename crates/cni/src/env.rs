//! The CNI environment: `CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_IFNAME`, `CNI_ARGS`,
//! `CNI_PATH`, which of them each verb requires, and the name rules (libcni `pkg/skel`,
//! `pkg/utils`).

use std::fmt;
use std::path::PathBuf;

use crate::error::{Error, code};

/// The longest interface name the kernel takes (IFNAMSIZ - 1).
pub const IFNAME_MAX_LEN: usize = 15;

/// A CNI verb.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Gc,
    Status,
    Version,
}

impl Command {
    pub fn parse(s: &str) -> Result<Command, Error> {
        Ok(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "GC" => Command::Gc,
            "STATUS" => Command::Status,
            "VERSION" => Command::Version,
            other => return Err(Error::invalid_env(format!("unknown CNI_COMMAND: {other}"))),
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Gc => "GC",
            Command::Status => "STATUS",
            Command::Version => "VERSION",
        }
    }

    /// Whether this verb acts on one attachment (container ID + interface name).
    pub fn is_per_attachment(self) -> bool {
        matches!(self, Command::Add | Command::Del | Command::Check)
    }

    /// The variables this verb cannot run without, in libcni's order. `CNI_PATH` follows
    /// libcni's skel for ADD/DEL/CHECK/GC; STATUS follows the spec, where it is optional.
    fn required(self) -> &'static [&'static str] {
        match self {
            Command::Add | Command::Check => &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"],
            Command::Del => &["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"],
            Command::Gc => &["CNI_PATH"],
            Command::Status | Command::Version => &[],
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The environment of one invocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CniEnv {
    pub command: Command,
    pub container_id: String,
    /// Absent on DEL from containerd (`CNI_NETNS` empty), on GC and STATUS.
    pub netns: Option<PathBuf>,
    pub ifname: String,
    pub args: CniArgs,
    pub path: Vec<PathBuf>,
    /// `CNI_NETNS_OVERRIDE`: skip the check that CNI_NETNS is not the plugin's own netns.
    pub netns_override: bool,
    /// Further variables a delegate gets (the meta-plugin's log settings and its mark).
    pub vars: Vec<(String, String)>,
    /// When this request gives up ([`crate::deadline`]); a delegate gets it in its environment.
    pub deadline: crate::Deadline,
}

impl CniEnv {
    /// Read the environment through `get` (the process environment in a plugin); the deadline
    /// is [`crate::deadline::DEADLINE_ENV`]'s, never later than `timeout` from now.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>, timeout: std::time::Duration) -> Result<CniEnv, Error> {
        let var = |k: &str| get(k).filter(|v| !v.is_empty());
        let Some(cmd) = var("CNI_COMMAND") else {
            return Err(Error::invalid_env("required env variables [CNI_COMMAND] missing"));
        };
        let command = Command::parse(&cmd)?;
        let missing: Vec<&str> = command.required().iter().copied().filter(|k| var(k).is_none()).collect();
        if !missing.is_empty() {
            return Err(Error::invalid_env(format!("required env variables [{}] missing", missing.join(","))));
        }
        let container_id = var("CNI_CONTAINERID").unwrap_or_default();
        let ifname = var("CNI_IFNAME").unwrap_or_default();
        if command.is_per_attachment() {
            validate_container_id(&container_id)?;
            validate_ifname(&ifname)?;
        }
        Ok(CniEnv {
            command,
            container_id,
            netns: var("CNI_NETNS").map(PathBuf::from),
            ifname,
            args: CniArgs::parse(&var("CNI_ARGS").unwrap_or_default())?,
            path: var("CNI_PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default(),
            netns_override: var("CNI_NETNS_OVERRIDE").is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true")),
            vars: Vec::new(),
            deadline: crate::Deadline::from_env(&get, timeout),
        })
    }
}

/// The key of one attachment (container ID, interface name) in caches, IPAM stores and state
/// files: `<containerID>=<ifname>`. A container ID is a CNI name (no `=`), so the first `=` splits
/// a key back into the two.
pub fn attachment_key(container_id: &str, ifname: &str) -> String {
    format!("{container_id}={ifname}")
}

/// A short, stable name of one attachment (container ID, interface name): 16 hex digits of a
/// SHA-256, for marks a plugin leaves in the kernel (a moved device's alias, a macvlan's temporary
/// name) so that DEL finds exactly what that attachment left, even after a crash mid-ADD.
pub fn attachment_tag(container_id: &str, ifname: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(attachment_key(container_id, ifname).as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

fn is_cni_name(s: &str) -> bool {
    // libcni pkg/utils: ^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// A container ID as libcni accepts it; it also becomes part of file names, so this is the
/// path-safety check too (no `/`, no `..` prefix, no leading dot).
pub fn validate_container_id(id: &str) -> Result<(), Error> {
    if id.is_empty() {
        return Err(Error::new(code::UNKNOWN_CONTAINER, "missing containerID"));
    }
    if !is_cni_name(id) {
        return Err(Error::invalid_env("invalid characters in containerID").with_details(id));
    }
    Ok(())
}

/// A network name as libcni accepts it (also used in file names).
pub fn validate_network_name(name: &str) -> Result<(), Error> {
    if name.is_empty() {
        return Err(Error::invalid_config("missing network name"));
    }
    if !is_cni_name(name) {
        return Err(Error::invalid_config("invalid characters found in network name").with_details(name));
    }
    Ok(())
}

/// An interface name the kernel and a path component can both take (libcni
/// `ValidateInterfaceName`): not empty, at most 15 bytes, not `.`/`..`, no `/`, `:` or whitespace.
pub fn validate_ifname(name: &str) -> Result<(), Error> {
    if name.is_empty() {
        return Err(Error::invalid_env("interface name is empty"));
    }
    if name.len() > IFNAME_MAX_LEN {
        return Err(Error::invalid_env("interface name is too long")
            .with_details(format!("interface name should be less than {} characters", IFNAME_MAX_LEN + 1)));
    }
    if name == "." || name == ".." {
        return Err(Error::invalid_env("interface name is . or .."));
    }
    if name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace()) {
        return Err(Error::invalid_env("interface name contains / or : or whitespace characters"));
    }
    Ok(())
}

/// `CNI_ARGS`: `K=V;K2=V2`. Runtimes add keys plugins do not know (`K8S_POD_NAME`, ...), which
/// libcni tolerates only with `IgnoreUnknown=1`; [`CniArgs::check_known`] applies that rule.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CniArgs {
    pairs: Vec<(String, String)>,
}

impl CniArgs {
    pub fn parse(raw: &str) -> Result<CniArgs, Error> {
        let mut pairs = Vec::new();
        for item in raw.split(';').filter(|s| !s.is_empty()) {
            match item.split_once('=') {
                Some((k, v)) if !k.is_empty() && !v.contains('=') => pairs.push((k.to_string(), v.to_string())),
                _ => {
                    return Err(Error::invalid_env(format!("ARGS: invalid pair {item:?}"))
                        .with_details("CNI_ARGS must be K=V pairs separated by ';'"));
                }
            }
        }
        Ok(CniArgs { pairs })
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// Set `key` (replacing an earlier value), keeping the order of first appearance.
    pub fn set(&mut self, key: &str, value: &str) {
        match self.pairs.iter_mut().find(|(k, _)| k == key) {
            Some(pair) => pair.1 = value.to_string(),
            None => self.pairs.push((key.to_string(), value.to_string())),
        }
    }

    pub fn pairs(&self) -> &[(String, String)] {
        &self.pairs
    }

    pub fn ignore_unknown(&self) -> bool {
        self.get("IgnoreUnknown").is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
    }

    /// Refuse keys outside `known` unless `IgnoreUnknown` is set (libcni `types.LoadArgs`).
    pub fn check_known(&self, known: &[&str]) -> Result<(), Error> {
        if self.ignore_unknown() {
            return Ok(());
        }
        let unknown: Vec<String> = self
            .pairs
            .iter()
            .filter(|(k, _)| k != "IgnoreUnknown" && !known.contains(&k.as_str()))
            .map(|(k, _)| format!("{k:?}"))
            .collect();
        if unknown.is_empty() {
            return Ok(());
        }
        // libcni's words: `ARGS: unknown args ["A" "B"]`.
        Err(Error::invalid_env(format!("ARGS: unknown args [{}]", unknown.join(" ")))
            .with_details("set IgnoreUnknown=1 in CNI_ARGS to pass keys this plugin does not use"))
    }

    /// Serialize back to `K=V;...` (for delegates).
    pub fn to_env_string(&self) -> String {
        self.pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(";")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> Result<CniEnv, Error> {
        let m: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        CniEnv::from_lookup(|k| m.get(k).cloned(), std::time::Duration::from_secs(60))
    }

    #[test]
    fn missing_variables_are_listed_in_libcni_order() {
        let e = env(&[("CNI_COMMAND", "ADD")]).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENVIRONMENT_VARIABLES);
        assert_eq!(e.msg, "required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME,CNI_PATH] missing");
        let e = env(&[("CNI_COMMAND", "DEL"), ("CNI_CONTAINERID", "c")]).unwrap_err();
        assert_eq!(e.msg, "required env variables [CNI_IFNAME,CNI_PATH] missing");
    }

    #[test]
    fn del_without_netns_is_accepted() {
        let e =
            env(&[("CNI_COMMAND", "DEL"), ("CNI_CONTAINERID", "c1"), ("CNI_IFNAME", "net1"), ("CNI_PATH", "/a:/b")])
                .unwrap();
        assert_eq!(e.netns, None);
        assert_eq!(e.path, vec![PathBuf::from("/a"), PathBuf::from("/b")]);
    }

    #[test]
    fn interface_names_follow_the_four_rules() {
        assert!(validate_ifname("net1").is_ok());
        assert!(validate_ifname("abcdefghijklmno").is_ok());
        for bad in ["", "abcdefghijklmnop", ".", "..", "a/b", "a:b", "a b", "a\tb"] {
            assert_eq!(validate_ifname(bad).unwrap_err().code, code::INVALID_ENVIRONMENT_VARIABLES, "{bad:?}");
        }
    }

    #[test]
    fn container_ids_that_could_escape_a_path_are_refused() {
        for bad in ["../x", "/etc", ".hidden", "a/b", "x y"] {
            assert_eq!(validate_container_id(bad).unwrap_err().code, code::INVALID_ENVIRONMENT_VARIABLES, "{bad:?}");
        }
        assert_eq!(validate_container_id("").unwrap_err().code, code::UNKNOWN_CONTAINER);
        assert!(validate_container_id("cnitool-0123abcd_x.y-z").is_ok());
    }

    #[test]
    fn cni_args_parse_and_ignore_unknown() {
        let a = CniArgs::parse("IgnoreUnknown=1;K8S_POD_NAME=p;IP=198.18.0.5").unwrap();
        assert_eq!(a.get("IP"), Some("198.18.0.5"));
        assert!(a.check_known(&["IP"]).is_ok());
        let strict = CniArgs::parse("K8S_POD_NAME=p").unwrap();
        assert!(strict.check_known(&["IP"]).unwrap_err().msg.contains("K8S_POD_NAME"));
        assert!(CniArgs::parse("novalue").is_err());
        assert!(CniArgs::parse("=v").is_err());
        assert_eq!(a.to_env_string(), "IgnoreUnknown=1;K8S_POD_NAME=p;IP=198.18.0.5");
    }
}
