//! Network configuration and conflist as the plugins read them from stdin and from
//! `/etc/cni/net.d`, then the IPAM section as plexus-ipam reads it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plexus_cni::{ConfList, NetConf};
use plexus_node::Policy;
use plexus_ipam_core::config::IpamConfig;

fuzz_target!(|data: &[u8]| {
    if let Ok(conf) = NetConf::parse(data) {
        let _ = IpamConfig::from_netconf(&conf, &Policy::default());
    }
    let _ = ConfList::parse(data);
    let _ = ConfList::from_single(data);
});
