//! The kubelet's device-plugin checkpoint (both DeviceIDs shapes): the IDs come back sorted and
//! without duplicates.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plexus_k8s::checkpoint::parse_device_ids;

fuzz_target!(|data: &[u8]| {
    let Ok(ids) = parse_device_ids(data, "uid-1", "nvidia.com/rdma_shared") else { return };
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "not sorted and unique: {ids:?}");
});
