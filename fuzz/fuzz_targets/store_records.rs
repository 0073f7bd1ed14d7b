//! IPAM store records as read back: the file and etcd stores' records and allocations (after a
//! crash), and whereabouts' IPPool / OverlappingRangeIPReservation objects (written by any
//! allocator), for IPv4 and IPv6 ranges up to a whole family.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plexus_ipam_core::range::{IpRange, RangeSpec};
use plexus_ipam_core::store::fuzzing::read_records;

fuzz_target!(|data: &[u8]| {
    for r in ["198.18.0.0/24", "198.18.0.0/32", "2001:db8::/64", "::/0", "0.0.0.0/0"] {
        let range = IpRange::parse(&RangeSpec { range: r, ..Default::default() }).expect("fixed range");
        read_records(data, &range);
    }
});
