//! Results of every spec version (prevResult, a delegate's stdout, the cache): what parses
//! prints in every version it can be printed in, and that print parses and prints the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plexus_cni::{CniResult, SpecVersion};

fuzz_target!(|data: &[u8]| {
    let Ok(result) = CniResult::parse(data) else { return };
    for version in SpecVersion::SUPPORTED {
        let Ok(doc) = result.to_value(version) else { continue };
        let again = CniResult::from_value(doc.clone())
            .unwrap_or_else(|e| panic!("{version:?}: a printed result does not parse: {}", e.msg));
        let reprinted =
            again.to_value(version).unwrap_or_else(|e| panic!("{version:?}: does not print again: {}", e.msg));
        assert_eq!(reprinted, doc, "{version:?}: parse → print → parse is not stable");
    }
});
