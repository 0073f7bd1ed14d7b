//! Result conversions checked against the reference: the fixtures under `fixtures/results` are
//! what the Debian reference plugins printed at each version, and `fixtures/converted` holds what
//! libcni itself made of each of them at every other version (`scripts/fixtures/capture.sh`).

use std::path::{Path, PathBuf};

use plexus_cni::{CniResult, SpecVersion};
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn read(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The one formatting difference we accept: libcni 1.1.2 (Debian) printed an empty `"dns": {}`
/// at 1.0.0; current libcni omits it there, and so does plexus.
fn without_empty_dns(mut v: Value) -> Value {
    if let Some(doc) = v.as_object_mut()
        && doc.get("dns").is_some_and(|d| d.as_object().is_some_and(|o| o.is_empty()))
    {
        doc.remove("dns");
    }
    v
}

fn result_fixtures() -> Vec<(String, PathBuf)> {
    let mut all: Vec<(String, PathBuf)> = std::fs::read_dir(fixtures().join("results"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.file_stem().unwrap().to_string_lossy().into_owned(), p))
        .collect();
    all.sort();
    assert!(all.len() >= 11, "fixtures missing: {all:?}");
    all
}

const LIBCNI_TARGETS: [SpecVersion; 6] = [
    SpecVersion::V0_1_0,
    SpecVersion::V0_2_0,
    SpecVersion::V0_3_0,
    SpecVersion::V0_3_1,
    SpecVersion::V0_4_0,
    SpecVersion::V1_0_0,
];

#[test]
fn every_reference_result_converts_to_every_version_as_libcni_does() {
    let mut compared = 0;
    for (name, path) in result_fixtures() {
        let parsed = CniResult::parse(&std::fs::read(&path).unwrap()).unwrap_or_else(|e| panic!("{name}: {e}"));
        for to in LIBCNI_TARGETS {
            let expected = read(&fixtures().join(format!("converted/{name}.to-{to}.json")));
            match (parsed.to_value(to), expected.get("error")) {
                (Ok(ours), None) => {
                    assert_eq!(without_empty_dns(ours), without_empty_dns(expected), "{name} -> {to}")
                }
                (Err(ours), Some(theirs)) => assert_eq!(ours.msg, theirs.as_str().unwrap(), "{name} -> {to}"),
                (ours, theirs) => panic!("{name} -> {to}: plexus {ours:?}, libcni {theirs:?}"),
            }
            compared += 1;
        }
    }
    assert_eq!(compared, result_fixtures().len() * LIBCNI_TARGETS.len());
}

#[test]
fn every_reference_result_prints_back_unchanged_at_its_own_version() {
    for (name, path) in result_fixtures() {
        let original = read(&path);
        let version: SpecVersion = original["cniVersion"].as_str().unwrap().parse().unwrap();
        let again = CniResult::from_value(original.clone()).unwrap().to_value(version).unwrap();
        assert_eq!(without_empty_dns(again), without_empty_dns(original), "{name}");
    }
}

#[test]
fn results_at_1_1_0_are_the_1_0_0_form_with_the_1_1_fields() {
    for (name, path) in result_fixtures() {
        let parsed = CniResult::parse(&std::fs::read(&path).unwrap()).unwrap();
        let mut v100 = parsed.to_value(SpecVersion::V1_0_0).unwrap();
        v100["cniVersion"] = "1.1.0".into();
        assert_eq!(parsed.to_value(SpecVersion::V1_1_0).unwrap(), v100, "{name}");
    }
}

#[test]
fn l2_only_reference_result_has_no_legacy_form() {
    let parsed = CniResult::parse(&std::fs::read(fixtures().join("results/macvlan-l2-1.0.0.json")).unwrap()).unwrap();
    assert!(parsed.ips.is_empty());
    assert_eq!(parsed.interfaces.len(), 1);
    for to in [SpecVersion::V0_1_0, SpecVersion::V0_2_0] {
        assert_eq!(parsed.to_value(to).unwrap_err().msg, "cannot convert: no valid IP addresses");
    }
}
