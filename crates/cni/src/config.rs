//! Network configuration: the single-plugin config a plugin reads on stdin, and the conflist a
//! runtime (or the meta-plugin) reads from disk.
//!
//! Unknown keys are kept in `extra` and written back unchanged: the spec requires plugins to pass
//! configuration they do not understand on to their delegates.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::Error;
use crate::result::{CniResult, Dns};
use crate::version::SpecVersion;

/// The `ipam` section: only `type` is common to every IPAM plugin.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Ipam {
    #[serde(rename = "type", default, skip_serializing_if = "String::is_empty")]
    pub plugin_type: String,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The configuration one plugin receives (spec §1 plugin object plus the derived keys of §3).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NetConf {
    #[serde(rename = "cniVersion", default, skip_serializing_if = "String::is_empty")]
    pub cni_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(rename = "type", default, skip_serializing_if = "String::is_empty")]
    pub plugin_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<BTreeMap<String, bool>>,
    #[serde(rename = "runtimeConfig", default, skip_serializing_if = "Option::is_none")]
    pub runtime_config: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Value>,
    #[serde(rename = "ipMasq", default, skip_serializing_if = "Option::is_none")]
    pub ip_masq: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipam: Option<Ipam>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<Dns>,
    /// Kept raw: its form depends on its own `cniVersion`. Read it with [`NetConf::prev_result`].
    #[serde(rename = "prevResult", default, skip_serializing_if = "Option::is_none")]
    pub prev_result: Option<Value>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl NetConf {
    pub fn parse(bytes: &[u8]) -> Result<NetConf, Error> {
        serde_json::from_slice(bytes).map_err(|e| Error::decoding(format!("error unmarshall network config: {e}")))
    }

    /// The spec version this config asks for.
    pub fn version(&self) -> Result<SpecVersion, Error> {
        SpecVersion::from_config_field(Some(&self.cni_version))
    }

    /// The previous result in a chain, if the runtime sent one.
    pub fn prev_result(&self) -> Result<Option<CniResult>, Error> {
        match &self.prev_result {
            None | Some(Value::Null) => Ok(None),
            Some(v) => CniResult::from_value(v.clone()).map(Some).map_err(|e| e.context("prevResult")),
        }
    }

    /// `prevResult`, which CHECK requires (libcni's words when it is missing, code 7).
    pub fn prev_result_for_check(&self) -> Result<CniResult, Error> {
        self.prev_result()?
            .ok_or_else(|| Error::invalid_config("Required prevResult missing").with_details("CHECK needs prevResult"))
    }

    /// The IPAM plugin type, if an `ipam` section names one.
    pub fn ipam_type(&self) -> Option<&str> {
        self.ipam.as_ref().map(|i| i.plugin_type.as_str()).filter(|t| !t.is_empty())
    }

    /// A `runtimeConfig` value, when the runtime passed this capability.
    pub fn runtime(&self, capability: &str) -> Option<&Value> {
        self.runtime_config.as_ref().and_then(|r| r.get(capability))
    }

    /// `args.cni.<key>` (CONVENTIONS.md).
    pub fn cni_arg(&self, key: &str) -> Option<&Value> {
        self.args.as_ref()?.get("cni")?.get(key)
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a NetConf always serializes")
    }
}

/// A network configuration list (spec §1): what `.conflist` files hold.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ConfList {
    #[serde(rename = "cniVersion", default, skip_serializing_if = "String::is_empty")]
    pub cni_version: String,
    /// 1.1: the runtime picks the highest one it supports.
    #[serde(rename = "cniVersions", default, skip_serializing_if = "Vec::is_empty")]
    pub cni_versions: Vec<String>,
    #[serde(default)]
    pub name: String,
    #[serde(rename = "disableCheck", default, skip_serializing_if = "Option::is_none")]
    pub disable_check: Option<bool>,
    #[serde(rename = "disableGC", default, skip_serializing_if = "Option::is_none")]
    pub disable_gc: Option<bool>,
    /// Kept raw so each plugin's unknown keys reach it untouched.
    #[serde(default)]
    pub plugins: Vec<Map<String, Value>>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ConfList {
    pub fn parse(bytes: &[u8]) -> Result<ConfList, Error> {
        serde_json::from_slice::<ConfList>(bytes)
            .map_err(|e| Error::decoding(format!("error parsing configuration list: {e}")))?
            .validated()
    }

    /// [`ConfList::parse`] of a document already read (a NAD's, the meta-plugin's cache): no
    /// round trip through text.
    pub fn from_value(doc: Value) -> Result<ConfList, Error> {
        serde_json::from_value::<ConfList>(doc)
            .map_err(|e| Error::decoding(format!("error parsing configuration list: {e}")))?
            .validated()
    }

    /// A single-plugin config file (`.conf`) seen as a list of one.
    pub fn from_single(bytes: &[u8]) -> Result<ConfList, Error> {
        let plugin: Map<String, Value> =
            serde_json::from_slice(bytes).map_err(|e| Error::decoding(format!("error parsing configuration: {e}")))?;
        ConfList::of_one(plugin)
    }

    /// [`ConfList::from_single`] of a document already read.
    pub fn from_single_value(doc: Value) -> Result<ConfList, Error> {
        match doc {
            Value::Object(plugin) => ConfList::of_one(plugin),
            other => Err(Error::decoding(format!("error parsing configuration: not an object: {other}"))),
        }
    }

    fn of_one(plugin: Map<String, Value>) -> Result<ConfList, Error> {
        let text = |k: &str| plugin.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        ConfList {
            cni_version: text("cniVersion"),
            name: text("name"),
            disable_check: plugin.get("disableCheck").and_then(Value::as_bool),
            plugins: vec![plugin],
            ..Default::default()
        }
        .validated()
    }

    /// The list's own rules: a name, at least one plugin, a type for each.
    fn validated(self) -> Result<ConfList, Error> {
        if self.name.is_empty() {
            return Err(Error::invalid_config("error parsing configuration list: no name"));
        }
        if self.plugins.is_empty() {
            return Err(Error::invalid_config(format!(
                "error parsing configuration list {:?}: no plugins in list",
                self.name
            )));
        }
        for (i, p) in self.plugins.iter().enumerate() {
            if !matches!(p.get("type"), Some(Value::String(t)) if !t.is_empty()) {
                return Err(Error::invalid_config(format!("network {:?}: plugin {i} has no \"type\"", self.name)));
            }
        }
        Ok(self)
    }

    /// The version to run this list at: the highest of `cniVersions` plexus knows, else `cniVersion`.
    pub fn version(&self) -> Result<SpecVersion, Error> {
        let best = self.cni_versions.iter().filter_map(|v| v.parse::<SpecVersion>().ok()).max();
        match best {
            Some(v) => Ok(v),
            None => SpecVersion::from_config_field(Some(&self.cni_version)),
        }
    }

    /// The config plugin `index` receives (spec §3): `cniVersion` and `name` injected,
    /// `runtimeConfig` = the plugin's `capabilities` ∩ the runtime's capability args,
    /// `prevResult` when given, `capabilities` removed.
    pub fn invocation_config(
        &self,
        index: usize,
        capability_args: &Map<String, Value>,
        prev_result: Option<&Value>,
    ) -> Result<Value, Error> {
        let version = self.version()?;
        let mut plugin = self.plugins[index].clone();
        plugin.insert("cniVersion".into(), version.as_str().into());
        plugin.insert("name".into(), self.name.clone().into());
        derive_runtime_config(&mut plugin, capability_args);
        if let Some(prev) = prev_result {
            plugin.insert("prevResult".into(), prev.clone());
        }
        Ok(Value::Object(plugin))
    }
}

/// Replace a plugin's `capabilities` with the `runtimeConfig` it is entitled to.
pub fn derive_runtime_config(plugin: &mut Map<String, Value>, capability_args: &Map<String, Value>) {
    let Some(Value::Object(caps)) = plugin.remove("capabilities") else { return };
    let runtime: Map<String, Value> = caps
        .iter()
        .filter(|(_, on)| on.as_bool() == Some(true))
        .filter_map(|(cap, _)| capability_args.get(cap).map(|v| (cap.clone(), v.clone())))
        .collect();
    if !runtime.is_empty() {
        plugin.insert("runtimeConfig".into(), Value::Object(runtime));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_keys_survive_a_round_trip() {
        let input = json!({
            "cniVersion": "1.1.0", "name": "roce", "type": "plexus-macvlan",
            "master": "ens1f0", "mtu": 9000, "multiRail": true,
            "ipam": {"type": "plexus-ipam", "range": "198.18.0.0/24", "exclude": ["198.18.0.1"]},
            "cni.dev/custom": {"deep": [1, 2, {"x": null}]},
            "dns": {"nameservers": ["198.18.0.53"]},
            "capabilities": {"ips": true}
        });
        let conf: NetConf = serde_json::from_value(input.clone()).unwrap();
        assert_eq!(conf.ipam_type(), Some("plexus-ipam"));
        assert_eq!(conf.extra["master"], "ens1f0");
        assert_eq!(conf.to_value(), input);
    }

    #[test]
    fn conflist_invocation_gets_version_name_runtime_config_and_prev_result() {
        let list = ConfList::parse(
            json!({"cniVersion": "1.0.0", "cniVersions": ["0.4.0", "1.1.0", "9.0.0"], "name": "rail0",
                   "plugins": [{"type": "plexus-macvlan", "capabilities": {"mac": true, "ips": false}, "x": 1}]})
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        let caps = json!({"mac": "02:00:00:00:00:09", "ips": ["198.18.0.9/24"], "portMappings": []});
        let prev = json!({"cniVersion": "1.1.0"});
        let conf = list.invocation_config(0, caps.as_object().unwrap(), Some(&prev)).unwrap();
        assert_eq!(
            conf,
            json!({"type": "plexus-macvlan", "x": 1, "cniVersion": "1.1.0", "name": "rail0",
                   "runtimeConfig": {"mac": "02:00:00:00:00:09"}, "prevResult": {"cniVersion": "1.1.0"}})
        );
    }

    #[test]
    fn conflist_without_plugins_or_type_is_invalid_config() {
        let e = ConfList::parse(br#"{"name":"n","plugins":[]}"#).unwrap_err();
        assert_eq!(e.code, crate::error::code::INVALID_NETWORK_CONFIG);
        let e = ConfList::parse(br#"{"name":"n","plugins":[{"mtu":1}]}"#).unwrap_err();
        assert!(e.msg.contains("no \"type\""), "{e}");
    }
}
