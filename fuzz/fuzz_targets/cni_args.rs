//! `CNI_ARGS` (tenant input through runtimes and Multus's cni-args).
#![no_main]

use libfuzzer_sys::fuzz_target;
use plexus_cni::env::CniArgs;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = CniArgs::parse(s);
    }
});
