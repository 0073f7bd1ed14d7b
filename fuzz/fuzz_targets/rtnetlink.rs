//! rtnetlink replies (links, addresses, routes, rules) decoded and turned into plexus's types.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = plexus_net::link::fuzzing::decode_replies(data);
});
