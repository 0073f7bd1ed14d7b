//! The meta-plugin's delegate cache as DEL and CHECK read it back after a crash (head plus
//! appended result records, torn or not): what parses is saved and parsed back the same.
#![no_main]

#[allow(dead_code)]
#[path = "../../plugins/plexus/src/attachment.rs"]
mod attachment;
#[allow(dead_code)]
#[path = "../../plugins/plexus/src/cache.rs"]
mod cache;
#[allow(dead_code)]
#[path = "../../plugins/plexus/src/conf.rs"]
mod conf;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok((c, _torn)) = cache::parse(data) else { return };
    let head = serde_json::to_vec(&c).expect("prints");
    let (again, torn) = cache::parse(&head).unwrap_or_else(|e| panic!("a saved cache does not parse: {e}"));
    assert!(!torn);
    assert_eq!(again.container_id, c.container_id);
    assert_eq!(again.attachments.len(), c.attachments.len());
    for (a, b) in again.attachments.iter().zip(&c.attachments) {
        assert_eq!((&a.network, &a.ifname, &a.result), (&b.network, &b.ifname, &b.result));
    }
});
