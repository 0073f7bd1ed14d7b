//! CNI specification versions: the one list of what plexus speaks.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// A CNI specification version that plexus knows.
///
/// Ordered oldest to newest, so `<`/`>=` compare spec versions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SpecVersion {
    V0_1_0,
    V0_2_0,
    V0_3_0,
    V0_3_1,
    V0_4_0,
    V1_0_0,
    V1_1_0,
}

impl SpecVersion {
    /// Every version a plexus plugin accepts and answers VERSION with.
    pub const SUPPORTED: [SpecVersion; 7] = [
        SpecVersion::V0_1_0,
        SpecVersion::V0_2_0,
        SpecVersion::V0_3_0,
        SpecVersion::V0_3_1,
        SpecVersion::V0_4_0,
        SpecVersion::V1_0_0,
        SpecVersion::V1_1_0,
    ];

    /// The newest version: what plexus prints when it has no version to follow.
    pub const LATEST: SpecVersion = SpecVersion::V1_1_0;

    /// First version with CHECK and prevResult on DEL.
    pub const CHECK_MIN: SpecVersion = SpecVersion::V0_4_0;

    /// First version with GC and STATUS.
    pub const GC_STATUS_MIN: SpecVersion = SpecVersion::V1_1_0;

    pub fn as_str(self) -> &'static str {
        match self {
            SpecVersion::V0_1_0 => "0.1.0",
            SpecVersion::V0_2_0 => "0.2.0",
            SpecVersion::V0_3_0 => "0.3.0",
            SpecVersion::V0_3_1 => "0.3.1",
            SpecVersion::V0_4_0 => "0.4.0",
            SpecVersion::V1_0_0 => "1.0.0",
            SpecVersion::V1_1_0 => "1.1.0",
        }
    }

    /// The version a config states; an absent or empty `cniVersion` means 0.1.0
    /// (libcni `version.ConfigDecoder`).
    pub fn from_config_field(field: Option<&str>) -> Result<SpecVersion, Error> {
        match field {
            None | Some("") => Ok(SpecVersion::V0_1_0),
            Some(v) => v.parse(),
        }
    }

    /// Results of this version carry `ip4`/`ip6` objects instead of lists.
    pub fn is_legacy_result(self) -> bool {
        self <= SpecVersion::V0_2_0
    }

    /// Results of this version carry `ips[].version`.
    pub fn has_ip_version_field(self) -> bool {
        (SpecVersion::V0_3_0..=SpecVersion::V0_4_0).contains(&self)
    }

    /// Supported versions as strings, in the order VERSION lists them.
    pub fn supported_strings() -> Vec<&'static str> {
        Self::SUPPORTED.iter().map(|v| v.as_str()).collect()
    }
}

impl fmt::Display for SpecVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SpecVersion {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SpecVersion::SUPPORTED.iter().copied().find(|v| v.as_str() == s).ok_or_else(|| Error::incompatible_version(s))
    }
}

impl serde::Serialize for SpecVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_ordered_oldest_first() {
        assert!(SpecVersion::V0_3_1 < SpecVersion::V0_4_0);
        assert!(SpecVersion::V1_1_0 > SpecVersion::V1_0_0);
        assert_eq!(SpecVersion::SUPPORTED.last(), Some(&SpecVersion::LATEST));
    }

    #[test]
    fn empty_config_version_means_0_1_0() {
        assert_eq!(SpecVersion::from_config_field(None).unwrap(), SpecVersion::V0_1_0);
        assert_eq!(SpecVersion::from_config_field(Some("")).unwrap(), SpecVersion::V0_1_0);
    }

    #[test]
    fn unknown_version_is_code_1_naming_the_version() {
        let e = "0.5.0".parse::<SpecVersion>().unwrap_err();
        assert_eq!(e.code, crate::error::code::INCOMPATIBLE_CNI_VERSION);
        assert!(e.details.contains("\"0.5.0\""), "{e:?}");
    }
}
