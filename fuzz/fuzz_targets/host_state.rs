//! plexus-host-device's state file as DEL and GC read it back (any bytes after a crash or a
//! full disk): the marker it names points back at the device's host name.
#![no_main]

#[allow(dead_code)]
#[path = "../../plugins/host-device/src/state.rs"]
mod state;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = serde_json::from_slice::<state::HostState>(data) else { return };
    let marker = s.marker();
    if !s.name.is_empty() && !s.name.contains(':') {
        assert_eq!(state::host_name_of(&marker), Some(s.name.as_str()), "marker {marker:?}");
    }
    let _ = state::Mark::of("c1", "net1", Some(&s));
});
