//! `k8s.v1.cni.cncf.io/network-status`: one element per attachment, in Multus's format
//! (`name`, `interface`, `ips` without prefix, `mac`, `mtu`, `default`, `dns`, `gateway`,
//! `device-info`).

use plexus_cni::CniResult;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The annotation plexus writes after every attachment succeeded.
pub const NETWORK_STATUS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/network-status";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NetworkStatus {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub default: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateway: Vec<String>,
    #[serde(rename = "device-info", default, skip_serializing_if = "Option::is_none")]
    pub device_info: Option<Value>,
}

/// The status elements of one attachment's result: one per sandbox interface (Multus
/// `CreateNetworkStatuses`); a result without interfaces still yields one, named after `ifname`.
pub fn statuses(
    network: &str,
    ifname: &str,
    result: &CniResult,
    default: bool,
    device_info: Option<&Value>,
) -> Vec<NetworkStatus> {
    let gateways: Vec<String> = result
        .routes
        .iter()
        .filter(|r| r.dst.prefix() == 0)
        .filter_map(|r| r.gw.or_else(|| result.ips.iter().find(|i| i.address.is_ipv4() == r.dst.is_ipv4())?.gateway))
        .map(|g| g.to_string())
        .collect();
    let dns = (!result.dns.is_empty()).then(|| serde_json::to_value(&result.dns).expect("json"));
    let in_sandbox: Vec<(usize, &plexus_cni::Interface)> = result
        .interfaces
        .iter()
        .enumerate()
        .filter(|(_, i)| i.sandbox.as_deref().is_some_and(|s| !s.is_empty()))
        .collect();
    let one = |idx: Option<usize>, iface: Option<&plexus_cni::Interface>| NetworkStatus {
        name: network.to_string(),
        interface: Some(iface.map(|i| i.name.clone()).unwrap_or_else(|| ifname.to_string())),
        ips: result
            .ips
            .iter()
            .filter(|ip| idx.is_none() || ip.interface.is_none() || ip.interface == idx)
            .map(|ip| ip.address.ip().to_string())
            .collect(),
        mac: iface.and_then(|i| i.mac.clone()),
        mtu: iface.and_then(|i| i.mtu).filter(|m| *m != 0),
        default,
        dns: dns.clone(),
        gateway: gateways.clone(),
        device_info: device_info.cloned(),
    };
    if in_sandbox.is_empty() {
        vec![one(None, None)]
    } else {
        in_sandbox.into_iter().map(|(i, iface)| one(Some(i), Some(iface))).collect()
    }
}

/// The pod a network-status is for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    /// As the runtime named it; empty when it named none (then the PATCH names no UID). Absent
    /// from entries journaled before the UID was kept.
    #[serde(default)]
    pub uid: String,
}

impl PodRef {
    /// `namespace/name`, as logs and the meta-plugin's cache name the pod; `None` without a pod
    /// (a standalone request).
    pub fn reference(&self) -> Option<String> {
        (!self.name.is_empty()).then(|| format!("{}/{}", self.namespace, self.name))
    }
}

/// The JSON merge patch that sets the annotation on the pod; with the pod's `uid` (not empty)
/// it applies only to that pod, not to a later one of the same name.
pub fn annotation_patch(statuses: &[NetworkStatus], uid: &str) -> Value {
    let text = serde_json::to_string_pretty(statuses).expect("json");
    let mut patch = serde_json::json!({"metadata": {"annotations": {NETWORK_STATUS_ANNOTATION: text}}});
    if !uid.is_empty() {
        patch["metadata"]["uid"] = uid.into();
    }
    patch
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn status_has_bare_ips_mac_mtu_gateway_and_device_info() {
        let r = CniResult::from_value(json!({"cniVersion": "1.1.0",
            "interfaces": [{"name": "net1", "mac": "02:00:00:00:00:01", "mtu": 9000, "sandbox": "/proc/1/ns/net"}],
            "ips": [{"interface": 0, "address": "198.18.0.5/24", "gateway": "198.18.0.1"}],
            "routes": [{"dst": "0.0.0.0/0"}], "dns": {"nameservers": ["198.18.0.53"]}}))
        .unwrap();
        let info = json!({"type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:3b:00.2"}});
        let s = statuses("ml/rail0", "net1", &r, false, Some(&info));
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            json!([{"name": "ml/rail0", "interface": "net1", "ips": ["198.18.0.5"], "mac": "02:00:00:00:00:01",
                    "mtu": 9000, "dns": {"nameservers": ["198.18.0.53"]}, "gateway": ["198.18.0.1"], "device-info": info}])
        );
        let patch = annotation_patch(&s, "");
        assert!(patch["metadata"]["annotations"][NETWORK_STATUS_ANNOTATION].as_str().unwrap().contains("ml/rail0"));
        assert_eq!(patch["metadata"].get("uid"), None);
    }

    #[test]
    fn the_patch_names_the_pods_uid_when_it_is_known() {
        let patch = annotation_patch(&[], "b9c0bef6-3fd6-4547-9350-a684f863e347");
        assert_eq!(patch["metadata"]["uid"], "b9c0bef6-3fd6-4547-9350-a684f863e347");
        assert_eq!(patch["metadata"]["annotations"][NETWORK_STATUS_ANNOTATION], "[]");
    }
}
