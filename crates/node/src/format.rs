//! The formats of the files plexus keeps on a node, and how one build reads another's.
//!
//! Each format carries its version in the file (`"version"`); a file without one is version 1,
//! what plexus wrote before its formats carried versions. A build reads every version up to its
//! own, and refuses a later one with [`code::FORMAT_TOO_NEW`], naming the file, the version found
//! and the versions it reads: a file of a newer plexus (after a downgrade) is never misread,
//! never taken for absent, and never removed. A format's version goes up only when a build that
//! does not know the change would misread the file; a new optional field needs no new version
//! (every reader ignores fields it does not know). Each format's files of every version are kept
//! as fixtures beside its reader's tests.

use plexus_cni::{Error, code};

/// One format: what its files are, and the latest version this build writes.
#[derive(Clone, Copy, Debug)]
pub struct Format {
    pub what: &'static str,
    pub current: u32,
}

/// The meta-plugin's delegate cache (`<cniDir>/<containerID>`).
pub const META_CACHE: Format = Format { what: "the meta-plugin's delegate cache", current: 1 };
/// plexus-host-device's state of a device it moved (`<dataDir>/<containerID>=<ifname>`).
/// Version 2: the moved device carries its marker as an alternative name and its host name as its
/// alias (version 1: the marker as its alias) — a version 1 build would not find such a device.
pub const HOST_DEVICE_STATE: Format = Format { what: "plexus-host-device's state file", current: 2 };
/// plexus-ipam's record of an attachment (the file store's `attachments/`, the etcd store's
/// record values; its address and pod-index entries are not versioned: they hold a key only).
pub const IPAM_RECORD: Format = Format { what: "plexus-ipam's attachment record", current: 1 };
/// plexus-daemon's network-status journal (one file per pod).
pub const STATUS_JOURNAL: Format = Format { what: "plexus-daemon's network-status journal entry", current: 1 };

/// The version of a file that carries none: the first.
pub fn first() -> u32 {
    1
}

/// The version a file's JSON says it is: [`first`] when it says none; anything but a number
/// (which no plexus writes) is taken as later than every build reads.
pub fn version_of(file: &serde_json::Value) -> u32 {
    match file.get("version") {
        None => first(),
        Some(v) => v.as_u64().and_then(|v| u32::try_from(v).ok()).unwrap_or(u32::MAX),
    }
}

impl Format {
    /// Whether this build reads version `found`.
    pub fn reads(&self, found: u32) -> bool {
        (1..=self.current).contains(&found)
    }

    /// [`Format::check`] of the version the JSON of `file` says it is ([`version_of`]).
    pub fn check_json(&self, file: &str, json: &serde_json::Value) -> Result<(), Error> {
        self.check(file, version_of(json))
    }

    /// Whether this build reads version `found` of `file`: code [`code::FORMAT_TOO_NEW`] when it
    /// is later than this build's (or 0, which no plexus wrote).
    pub fn check(&self, file: &str, found: u32) -> Result<(), Error> {
        if self.reads(found) {
            return Ok(());
        }
        Err(Error::new(
            code::FORMAT_TOO_NEW,
            format!("{file}: {} of format version {found}, which this plexus does not read", self.what),
        )
        .with_details(format!(
            "this build reads versions 1 to {}: the file was written by a later plexus; run that version \
             again (or a later one) to use or release what the file holds — it is left as it is",
            self.current
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_without_a_version_is_the_first_and_one_that_is_not_a_number_is_refused() {
        assert_eq!(version_of(&serde_json::json!({"name": "x"})), 1);
        assert_eq!(version_of(&serde_json::json!({"version": 2})), 2);
        for odd in [serde_json::json!("1"), serde_json::json!(-1), serde_json::json!(1.5), serde_json::json!(u64::MAX)]
        {
            assert_eq!(version_of(&serde_json::json!({ "version": odd })), u32::MAX, "{odd}");
        }
    }

    #[test]
    fn a_format_reads_every_version_up_to_its_own_and_names_a_later_one() {
        let f = Format { what: "a test format", current: 2 };
        assert!(f.check("/f", 1).is_ok() && f.check("/f", 2).is_ok());
        for found in [0, 3] {
            let e = f.check("/var/lib/x", found).unwrap_err();
            assert_eq!(e.code, code::FORMAT_TOO_NEW);
            assert!(e.msg.starts_with(&format!("/var/lib/x: a test format of format version {found}")), "{e}");
            assert!(e.details.contains("versions 1 to 2"), "{e:?}");
        }
    }
}
