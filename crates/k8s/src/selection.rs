//! The pod's network selection (`k8s.v1.cni.cncf.io/networks`) in both of its forms: the comma
//! form `[ns/]name[@ifname], ...` and the JSON list of NetworkSelectionElements (multi-net spec
//! v1.3 §4.1.2), validated the way Multus validates them.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::K8sError;

/// The annotation that selects a pod's networks.
pub const NETWORKS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/networks";
/// The annotation that replaces the cluster network for one pod (Multus).
pub const DEFAULT_NETWORK_ANNOTATION: &str = "v1.multus-cni.io/default-network";

/// One requested attachment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NetworkSelection {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, alias = "interfaceRequest", skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Gateways for the pod's default route through this attachment. Present at all (even
    /// empty) means the pod's default routes are managed (Multus).
    #[serde(rename = "default-route", default, skip_serializing_if = "Option::is_none")]
    pub default_route: Option<Vec<IpAddr>>,
    #[serde(rename = "portMappings", default, skip_serializing_if = "Option::is_none")]
    pub port_mappings: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<Value>,
    #[serde(rename = "cni-args", default, skip_serializing_if = "Option::is_none")]
    pub cni_args: Option<Map<String, Value>>,
    #[serde(rename = "infiniband-guid", default, skip_serializing_if = "Option::is_none")]
    pub infiniband_guid: Option<String>,
    #[serde(rename = "deviceID", default, skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
}

pub use crate::names::is_dns_label;

fn bad(item: &str, why: impl std::fmt::Display) -> K8sError {
    K8sError::Selection(format!("invalid network selection {item:?}: {why}"))
}

impl NetworkSelection {
    fn validate(&self, item: &str) -> Result<(), K8sError> {
        if self.name.is_empty() {
            return Err(bad(item, "\"name\" is required"));
        }
        if !is_dns_label(&self.name) {
            return Err(bad(item, format!("name {:?} is not a DNS-1123 label", self.name)));
        }
        if let Some(ns) = &self.namespace
            && !is_dns_label(ns)
        {
            return Err(bad(item, format!("namespace {ns:?} is not a DNS-1123 label")));
        }
        if let Some(i) = &self.interface {
            plexus_cni::env::validate_ifname(i).map_err(|e| bad(item, format!("interface {i:?}: {}", e.msg)))?;
        }
        for ip in &self.ips {
            let addr = ip.split('/').next().unwrap_or_default();
            if addr.parse::<IpAddr>().is_err() || (ip.contains('/') && ip.parse::<ipnetwork::IpNetwork>().is_err()) {
                return Err(bad(item, format!("ips: {ip:?} is not an IP address or CIDR")));
            }
        }
        if let Some(mac) = &self.mac
            && plexus_node::hw::parse_mac(mac).is_none()
        {
            return Err(bad(item, format!("mac {mac:?} is not a MAC address")));
        }
        Ok(())
    }

    /// The namespace to look the NAD up in.
    pub fn namespace_or<'a>(&'a self, pod_namespace: &'a str) -> &'a str {
        self.namespace.as_deref().unwrap_or(pod_namespace)
    }
}

/// Parse the annotation (either form). An empty value selects nothing.
pub fn parse_selections(value: &str) -> Result<Vec<NetworkSelection>, K8sError> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(Vec::new());
    }
    if value.contains(['[', '{', '"']) {
        let list: Vec<NetworkSelection> = serde_json::from_str(value)
            .map_err(|e| K8sError::Selection(format!("invalid network selection JSON: {e}")))?;
        for (i, s) in list.iter().enumerate() {
            s.validate(&format!("element {i}"))?;
        }
        return Ok(list);
    }
    value
        .split(',')
        .map(str::trim)
        .map(|item| {
            if item.is_empty() {
                return Err(bad(item, "empty element"));
            }
            // Spaces around each part are trimmed, as Multus does (`default / net1 @ eth9`).
            let (ns_name, ifname) = match item.split_once('@') {
                Some((a, i)) => (a, Some(i.trim().to_string())),
                None => (item, None),
            };
            let parts: Vec<&str> = ns_name.split('/').map(str::trim).collect();
            let (namespace, name) = match parts.as_slice() {
                [name] => (None, name.to_string()),
                [ns, name] => (Some(ns.to_string()), name.to_string()),
                _ => return Err(bad(item, "expected [namespace/]name[@interface]")),
            };
            let s = NetworkSelection { name, namespace, interface: ifname, ..Default::default() };
            s.validate(item)?;
            Ok(s)
        })
        .collect()
}

/// The `v1.multus-cni.io/default-network` annotation: exactly one network, in either form.
pub fn parse_default_network(value: &str) -> Result<NetworkSelection, K8sError> {
    let mut list = parse_selections(value)?;
    match list.len() {
        1 => Ok(list.remove(0)),
        0 => Err(K8sError::Selection(format!("{DEFAULT_NETWORK_ANNOTATION} names no network"))),
        _ => Err(K8sError::Selection(format!(
            "{DEFAULT_NETWORK_ANNOTATION}: more than one default network is specified: {value}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comma_form_with_namespaces_and_interfaces() {
        let s = parse_selections(" rail0, ml/rail1@roce1 ,rail0 ").unwrap();
        assert_eq!(s.len(), 3, "the same NAD may appear twice");
        assert_eq!((s[0].name.as_str(), s[0].namespace.as_deref(), s[0].interface.as_deref()), ("rail0", None, None));
        assert_eq!(
            (s[1].name.as_str(), s[1].namespace.as_deref(), s[1].interface.as_deref()),
            ("rail1", Some("ml"), Some("roce1"))
        );
    }

    #[test]
    fn json_form_with_every_field() {
        let s = parse_selections(
            r#"[{"name":"rail0","namespace":"ml","interface":"net7","ips":["198.18.0.5/24"],"mac":"02:00:00:00:00:01",
                "default-route":["198.18.0.1"],"portMappings":[{"hostPort":80,"containerPort":80}],
                "bandwidth":{"ingressRate":1},"cni-args":{"k":"v"},"infiniband-guid":"c2:cc:aa","deviceID":"0000:3b:00.2"},
                {"name":"rail1","interfaceRequest":"net8"}]"#,
        )
        .unwrap();
        assert_eq!(s[0].ips, ["198.18.0.5/24"]);
        assert_eq!(s[0].default_route.as_ref().unwrap()[0].to_string(), "198.18.0.1");
        assert_eq!(s[0].cni_args.as_ref().unwrap()["k"], "v");
        assert_eq!(s[0].device_id.as_deref(), Some("0000:3b:00.2"));
        assert_eq!(s[1].interface.as_deref(), Some("net8"), "the deprecated interfaceRequest");
        assert!(parse_selections("").unwrap().is_empty());
    }

    #[test]
    fn invalid_selections_are_refused_like_multus() {
        for bad in [
            "a/b/c",
            "Rail0",
            "rail_0",
            "-rail",
            "ns/",
            "rail0@",
            "rail0@abcdefghijklmnop",
            "rail0@a b",
            "rail0,,rail1",
            r#"[{"name":""}]"#,
            r#"[{"name":"r","ips":["nope"]}]"#,
            r#"[{"name":"r","mac":"zz"}]"#,
            r#"[{"name":"r","namespace":"Bad"}]"#,
            r#"{"name":"r"}"#,
            r#"[{"name":"r","default-route":["x"]}]"#,
        ] {
            assert!(parse_selections(bad).is_err(), "{bad} must be refused");
        }
    }

    #[test]
    fn spaces_around_each_part_are_trimmed_as_multus_does() {
        let s = parse_selections("default / net1 @ my_interface , net2").unwrap();
        assert_eq!(
            (s[0].namespace.as_deref(), s[0].name.as_str(), s[0].interface.as_deref()),
            (Some("default"), "net1", Some("my_interface"))
        );
        assert_eq!(s[1].name, "net2");
        assert!(parse_selections("default/net1@my ifc").is_err(), "a space inside a part is still refused");
    }

    #[test]
    fn an_empty_default_route_list_is_kept_apart_from_an_absent_one() {
        let s = parse_selections(r#"[{"name":"a","default-route":[]},{"name":"b"}]"#).unwrap();
        assert_eq!(s[0].default_route, Some(vec![]));
        assert_eq!(s[1].default_route, None);
    }

    #[test]
    fn the_default_network_annotation_names_exactly_one_network() {
        assert_eq!(parse_default_network("kube-system/net1").unwrap().namespace.as_deref(), Some("kube-system"));
        assert_eq!(parse_default_network(r#"[{"name":"net1"}]"#).unwrap().name, "net1");
        let e = parse_default_network("net1,net2").unwrap_err();
        assert!(e.to_string().contains("more than one default network is specified: net1,net2"), "{e}");
        assert!(parse_default_network("").is_err());
    }
}
