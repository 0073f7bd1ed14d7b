//! Helpers for the plugins' unit tests (feature `testing`, dev-dependencies only): an invocation
//! built from variables and a config, and an IPAM delegate that is a real process (a script)
//! recording its calls.

use std::path::{Path, PathBuf};

/// A plugin invocation for a unit test: `CNI_*` variables from `vars` (`CNI_COMMAND` included),
/// the network config `config`, the node policy `policy`.
pub fn request(vars: &[(&str, &str)], config: &serde_json::Value, policy: plexus_node::Policy) -> crate::Request {
    let env = plexus_cni::CniEnv::from_lookup(
        |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()),
        policy.limits.request_timeout(),
    )
    .expect("test environment");
    let stdin = serde_json::to_vec(config).expect("json");
    let config = plexus_cni::NetConf::parse(&stdin).expect("test config");
    let version = config.version().expect("test config version");
    crate::Request {
        env,
        version,
        config,
        stdin,
        policy,
        log: Default::default(),
        runner: Default::default(),
        delegated: false,
    }
}

/// An IPAM plugin for unit tests, `fake-ipam` in `dir` (a CNI_PATH): a real delegate process
/// that hands out `address` (with `gateway`, and a route to 198.19.0.0/16) on ADD and appends
/// every call (`ADD <containerID> <ifname>`) to `dir/ipam.log`.
pub fn fake_ipam(dir: &Path, address: &str, gateway: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let script = format!(
        r#"#!/bin/sh
echo "$CNI_COMMAND $CNI_CONTAINERID $CNI_IFNAME" >> "{log}"
if [ "$CNI_COMMAND" = ADD ]; then
  echo '{{"cniVersion":"1.0.0","ips":[{{"address":"{address}","gateway":"{gateway}"}}],"routes":[{{"dst":"198.19.0.0/16"}}]}}'
fi
"#,
        log = dir.join("ipam.log").display()
    );
    let bin = dir.join("fake-ipam");
    std::fs::write(&bin, script).expect("write fake IPAM");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod fake IPAM");
    bin
}

/// The calls [`fake_ipam`] in `dir` received, in order.
pub fn ipam_calls(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("ipam.log")).unwrap_or_default().lines().map(String::from).collect()
}
