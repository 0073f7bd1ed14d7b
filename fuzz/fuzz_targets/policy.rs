//! The node policy (admin-written, but read by every binary as root on every call).
#![no_main]

use libfuzzer_sys::fuzz_target;
use plexus_node::Policy;

fuzz_target!(|data: &[u8]| {
    let _ = Policy::parse(data);
});
