//! CNI results of every version, parsed into one model and printed at any version.
//!
//! The model is the 1.1 result. Conversions follow libcni (`pkg/types/{020,040,100}`):
//! - 0.3.x/0.4.0 carry `ips[].version`; their interfaces have only `name`, `mac`, `sandbox`.
//! - 1.0.0 and 1.1.0 share one type (libcni `types100`), so the 1.1 interface fields
//!   `mtu`, `socketPath`, `pciID` are printed at both.
//! - Route fields `mtu`, `advmss`, `priority`, `table`, `scope` live on libcni's shared
//!   `types.Route` and are kept at every version from 0.3.0 on; 0.1.0/0.2.0 keep only `dst`/`gw`.
//! - 0.1.0/0.2.0 carry one `ip4` and one `ip6` object (the first address of each family) with the
//!   routes of that family folded in; a result without addresses cannot be expressed there.
//! - Empty `dns` is omitted at 1.x (current libcni) and printed as `{}` below 1.0.0 (libcni has no
//!   omit rule for those types).

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::error::{Error, code};
use crate::version::SpecVersion;

/// DNS settings of a result or a config.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub domain: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty() && self.domain.is_empty() && self.search.is_empty() && self.options.is_empty()
    }
}

/// One interface a plugin created or touched.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// 1.1
    #[serde(default, skip_serializing_if = "is_none_or_zero")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// 1.1
    #[serde(rename = "socketPath", default, skip_serializing_if = "Option::is_none")]
    pub socket_path: Option<String>,
    /// 1.1
    #[serde(rename = "pciID", default, skip_serializing_if = "Option::is_none")]
    pub pci_id: Option<String>,
}

/// One address: `address` keeps the host part (`198.18.0.2/24`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// Index into `interfaces`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
    pub address: IpNetwork,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
}

/// One route. The fields after `gw` are the 1.1 additions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub dst: IpNetwork,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "is_none_or_zero")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "is_none_or_zero")]
    pub advmss: Option<u32>,
    #[serde(default, skip_serializing_if = "is_none_or_zero")]
    pub priority: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u8>,
}

impl Route {
    pub fn new(dst: IpNetwork, gw: Option<IpAddr>) -> Self {
        Route { dst, gw, mtu: None, advmss: None, priority: None, table: None, scope: None }
    }
}

fn is_none_or_zero(v: &Option<u32>) -> bool {
    matches!(v, None | Some(0))
}

/// A CNI result, whatever version it was read from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniResult {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<Interface>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<IpConfig>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    #[serde(default, skip_serializing_if = "Dns::is_empty")]
    pub dns: Dns,
}

// Wire forms of the older versions.

#[derive(Deserialize)]
struct Result040 {
    #[serde(default)]
    interfaces: Vec<Interface040>,
    // 0.3.0's spec text named the list `ip`; libcni reads `ips`. Accept both.
    #[serde(default, alias = "ip")]
    ips: Vec<IpConfig040>,
    #[serde(default)]
    routes: Vec<Route>,
    #[serde(default)]
    dns: Dns,
}

#[derive(Deserialize)]
struct Interface040 {
    name: String,
    #[serde(default)]
    mac: Option<String>,
    #[serde(default)]
    sandbox: Option<String>,
}

#[derive(Deserialize)]
struct IpConfig040 {
    #[serde(default)]
    interface: Option<usize>,
    address: IpNetwork,
    #[serde(default)]
    gateway: Option<IpAddr>,
}

#[derive(Deserialize)]
struct Result020 {
    #[serde(default)]
    ip4: Option<IpConfig020>,
    #[serde(default)]
    ip6: Option<IpConfig020>,
    #[serde(default)]
    dns: Dns,
}

#[derive(Deserialize)]
struct IpConfig020 {
    ip: IpNetwork,
    #[serde(default)]
    gateway: Option<IpAddr>,
    #[serde(default)]
    routes: Vec<Route>,
}

fn decode_err(version: &str, e: impl std::fmt::Display) -> Error {
    Error::decoding(format!("failed to parse {version} result: {e}"))
}

impl CniResult {
    /// The addresses of `ips`, without their prefix lengths.
    pub fn addresses(&self) -> Vec<IpAddr> {
        self.ips.iter().map(|ip| ip.address.ip()).collect()
    }

    /// Parse a result document of any supported version (its `cniVersion` decides the form;
    /// an empty or absent one is 0.2.0, as in libcni).
    pub fn parse(bytes: &[u8]) -> Result<CniResult, Error> {
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| Error::decoding(format!("failed to parse result: {e}")))?;
        CniResult::from_value(value)
    }

    pub fn from_value(value: Value) -> Result<CniResult, Error> {
        let version = match value.get("cniVersion") {
            None | Some(Value::Null) => SpecVersion::V0_2_0,
            Some(Value::String(s)) if s.is_empty() => SpecVersion::V0_2_0,
            Some(Value::String(s)) => s.parse::<SpecVersion>().map_err(|_| {
                Error::new(code::INCOMPATIBLE_CNI_VERSION, format!("unsupported result version {s:?}"))
                    .with_details(format!("plexus reads results of [{}]", SpecVersion::supported_strings().join(" ")))
            })?,
            Some(other) => return Err(Error::decoding(format!("result cniVersion is not a string: {other}"))),
        };
        let v = version.as_str();
        if version.is_legacy_result() {
            let r: Result020 = serde_json::from_value(value).map_err(|e| decode_err(v, e))?;
            let mut out = CniResult { dns: r.dns, ..Default::default() };
            for ipc in [r.ip4, r.ip6].into_iter().flatten() {
                out.ips.push(IpConfig { interface: None, address: ipc.ip, gateway: ipc.gateway });
                out.routes.extend(ipc.routes);
            }
            Ok(out)
        } else if version.has_ip_version_field() {
            let r: Result040 = serde_json::from_value(value).map_err(|e| decode_err(v, e))?;
            Ok(CniResult {
                interfaces: r
                    .interfaces
                    .into_iter()
                    .map(|i| Interface { name: i.name, mac: i.mac, sandbox: i.sandbox, ..Default::default() })
                    .collect(),
                ips: r
                    .ips
                    .into_iter()
                    .map(|i| IpConfig { interface: i.interface, address: i.address, gateway: i.gateway })
                    .collect(),
                routes: r.routes,
                dns: r.dns,
            })
        } else {
            serde_json::from_value(value).map_err(|e| decode_err(v, e))
        }
    }

    /// The result as a JSON document of `version`.
    pub fn to_value(&self, version: SpecVersion) -> Result<Value, Error> {
        let mut doc = Map::new();
        doc.insert("cniVersion".into(), version.as_str().into());
        if version.is_legacy_result() {
            self.legacy_into(&mut doc)?;
            doc.insert("dns".into(), to_json(&self.dns));
            return Ok(Value::Object(doc));
        }
        if !self.interfaces.is_empty() {
            let ifaces: Vec<Value> = if version.has_ip_version_field() {
                self.interfaces
                    .iter()
                    .map(|i| {
                        to_json(&Interface {
                            name: i.name.clone(),
                            mac: i.mac.clone(),
                            sandbox: i.sandbox.clone(),
                            ..Default::default()
                        })
                    })
                    .collect()
            } else {
                self.interfaces.iter().map(to_json).collect()
            };
            doc.insert("interfaces".into(), ifaces.into());
        }
        if !self.ips.is_empty() {
            let ips: Vec<Value> = self
                .ips
                .iter()
                .map(|ip| {
                    let mut v = Map::new();
                    if version.has_ip_version_field() {
                        v.insert("version".into(), if ip.address.is_ipv4() { "4" } else { "6" }.into());
                    }
                    let Value::Object(rest) = to_json(ip) else { unreachable!("IpConfig is an object") };
                    v.extend(rest);
                    Value::Object(v)
                })
                .collect();
            doc.insert("ips".into(), ips.into());
        }
        if !self.routes.is_empty() {
            doc.insert("routes".into(), to_json(&self.routes));
        }
        if !self.dns.is_empty() || version.has_ip_version_field() {
            doc.insert("dns".into(), to_json(&self.dns));
        }
        Ok(Value::Object(doc))
    }

    fn legacy_into(&self, doc: &mut Map<String, Value>) -> Result<(), Error> {
        let first = |v4: bool| self.ips.iter().find(|ip| ip.address.is_ipv4() == v4);
        let mut any = false;
        for (key, v4) in [("ip4", true), ("ip6", false)] {
            let Some(ip) = first(v4) else { continue };
            any = true;
            let mut cfg = Map::new();
            cfg.insert("ip".into(), ip.address.to_string().into());
            if let Some(gw) = ip.gateway {
                cfg.insert("gateway".into(), gw.to_string().into());
            }
            let routes: Vec<Value> = self
                .routes
                .iter()
                .filter(|r| r.dst.is_ipv4() == v4)
                .map(|r| to_json(&Route::new(r.dst, r.gw)))
                .collect();
            if !routes.is_empty() {
                cfg.insert("routes".into(), routes.into());
            }
            doc.insert(key.into(), Value::Object(cfg));
        }
        if !any {
            return Err(Error::new(code::INCOMPATIBLE_CNI_VERSION, "cannot convert: no valid IP addresses")
                .with_details("a 0.1.0/0.2.0 result must carry an IP address; use cniVersion 0.3.0 or later for L2-only attachments"));
        }
        Ok(())
    }
}

fn to_json<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or_else(|e| json!({"error": e.to_string()}))
}

/// Write one JSON document indented with four spaces (libcni's `MarshalIndent`), then a newline,
/// in a single write (stdout is line-buffered; one document should be one write).
pub fn write_json(v: &Value, out: &mut impl std::io::Write) -> Result<(), Error> {
    use serde::Serialize as _;
    let mut buf = Vec::with_capacity(1024);
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
    v.serialize(&mut ser).map_err(|e| Error::io(format!("writing result: {e}")))?;
    buf.push(b'\n');
    out.write_all(&buf).and_then(|_| out.flush()).map_err(|e| Error::io(format!("writing result: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CniResult {
        CniResult::from_value(json!({
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "net1", "mac": "02:00:00:00:00:01", "mtu": 9000, "sandbox": "/run/netns/p", "pciID": "0000:3b:00.0"}],
            "ips": [
                {"interface": 0, "address": "198.18.0.2/24", "gateway": "198.18.0.1"},
                {"interface": 0, "address": "2001:db8::2/64"}
            ],
            "routes": [{"dst": "0.0.0.0/0", "gw": "198.18.0.1", "table": 100}, {"dst": "2001:db8:1::/48"}],
            "dns": {"nameservers": ["198.18.0.53"]}
        }))
        .unwrap()
    }

    #[test]
    fn down_to_0_4_0_adds_ip_version_and_drops_1_1_interface_fields() {
        let v = sample().to_value(SpecVersion::V0_4_0).unwrap();
        assert_eq!(v["ips"][0]["version"], "4");
        assert_eq!(v["ips"][1]["version"], "6");
        assert_eq!(v["interfaces"][0], json!({"name":"net1","mac":"02:00:00:00:00:01","sandbox":"/run/netns/p"}));
        assert_eq!(v["routes"][0]["table"], 100, "libcni keeps route fields on its shared Route type");
    }

    #[test]
    fn l2_only_result_cannot_be_printed_at_0_2_0() {
        let r = CniResult {
            interfaces: vec![Interface { name: "net1".into(), ..Default::default() }],
            ..Default::default()
        };
        let e = r.to_value(SpecVersion::V0_2_0).unwrap_err();
        assert_eq!(e.msg, "cannot convert: no valid IP addresses");
    }

    #[test]
    fn result_without_version_is_read_as_0_2_0() {
        let r =
            CniResult::from_value(json!({"ip4": {"ip": "198.18.0.2/24", "routes": [{"dst": "0.0.0.0/0"}]}})).unwrap();
        assert_eq!(r.ips[0].address.to_string(), "198.18.0.2/24");
        assert_eq!(r.routes.len(), 1);
    }

    #[test]
    fn unknown_result_version_is_code_1() {
        let e = CniResult::from_value(json!({"cniVersion": "2.0.0"})).unwrap_err();
        assert_eq!(e.code, code::INCOMPATIBLE_CNI_VERSION);
    }
}
