//! The pod's `k8s.v1.cni.cncf.io/networks` and default-network annotations, both forms: what
//! parses is valid (DNS-1123 names, a usable interface name) and survives a JSON round trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plexus_k8s::selection::{is_dns_label, parse_default_network, parse_selections};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    let _ = parse_default_network(s);
    let Ok(list) = parse_selections(s) else { return };
    for sel in &list {
        assert!(is_dns_label(&sel.name), "name {:?}", sel.name);
        assert!(sel.namespace.as_deref().is_none_or(is_dns_label), "namespace {:?}", sel.namespace);
        if let Some(i) = &sel.interface {
            assert!(plexus_cni::env::validate_ifname(i).is_ok(), "interface {i:?}");
        }
    }
    let json = serde_json::to_string(&list).expect("prints");
    let again = parse_selections(&json).unwrap_or_else(|e| panic!("{json} does not parse again: {e}"));
    assert_eq!(again, list);
});
