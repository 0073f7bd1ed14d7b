//! NetworkAttachmentDefinition manifests (nadDir: YAML with several documents, JSON, Lists) and
//! the objects the API returns.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plexus_k8s::nad::parse_manifest;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = parse_manifest(text, true);
    let _ = parse_manifest(text, false);
});
