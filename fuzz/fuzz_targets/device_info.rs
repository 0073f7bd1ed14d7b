//! A device-info file (written by a device plugin) as plexus folds it into network-status.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plexus_cni::CniResult;
use plexus_k8s::status::{annotation_patch, statuses};

fuzz_target!(|data: &[u8]| {
    let Ok(info) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    let result = CniResult::parse(
        br#"{"cniVersion":"1.0.0","interfaces":[{"name":"net1","sandbox":"/x"}],
        "ips":[{"address":"198.18.0.5/24","interface":0}]}"#,
    )
    .expect("fixed result");
    let all = statuses("ns/rail0", "net1", &result, false, Some(&info));
    assert_eq!(all.len(), 1);
    let _ = annotation_patch(&all, "");
});
