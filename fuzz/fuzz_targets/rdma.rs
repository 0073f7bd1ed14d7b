//! RDMA netlink replies (device dumps, system mode, errors): an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = plexus_net::rdma::decode(data);
});
