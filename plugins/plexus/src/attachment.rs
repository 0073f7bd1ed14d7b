//! One attachment: a delegate network (a single conf or a conflist) with its interface name and
//! capability arguments, and how to run each verb on it (libcni's rules for lists: runtimeConfig
//! from capabilities, prevResult along the chain on ADD, the cached result on CHECK and DEL, DEL
//! in reverse).

use std::path::PathBuf;

use plexus_cni::delegate;
use plexus_cni::{CniEnv, CniResult, Command, ConfList, Error, SpecVersion};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// An attachment as the cache records it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Attachment {
    /// `namespace/nad`, or the conf's own name for cluster and default networks.
    pub network: String,
    pub ifname: String,
    /// The cluster network: its result is the one the runtime gets.
    #[serde(default)]
    pub master: bool,
    /// The delegate's full configuration (single plugin or list), as it is run.
    pub conf: Value,
    /// Capability arguments offered to the delegate's plugins (`runtimeConfig` by capability).
    #[serde(default)]
    pub capability_args: Map<String, Value>,
    /// The final ADD result (the delegate's version): prevResult for CHECK and DEL.
    #[serde(default)]
    pub result: Option<Value>,
    #[serde(default)]
    pub device_info_file: Option<PathBuf>,
    /// The NAD's `resourceName` and the device the kubelet allocated for it.
    #[serde(default)]
    pub resource_name: Option<String>,
    #[serde(default)]
    pub device_id: Option<String>,
}

impl Attachment {
    /// The conf as a list (a single conf is a list of one).
    fn list(&self) -> Result<ConfList, Error> {
        let bytes = serde_json::to_vec(&self.conf).expect("json");
        if plexus_k8s::nad::is_conflist(&self.conf) { ConfList::parse(&bytes) } else { ConfList::from_single(&bytes) }
            .map_err(|e| e.context(format!("network {}", self.network)))
    }

    fn env(&self, base: &CniEnv, command: Command) -> CniEnv {
        CniEnv { command, ifname: self.ifname.clone(), ..base.clone() }
    }

    fn plugin_type(plugin: &Value) -> String {
        plugin.get("type").and_then(Value::as_str).unwrap_or_default().to_string()
    }

    /// ADD: the chain in order, each plugin given the previous result; returns the final result.
    pub fn add(&self, base: &CniEnv) -> Result<(CniResult, Value), Error> {
        let list = self.list()?;
        let version = list.version()?;
        let env = self.env(base, Command::Add);
        let mut prev: Option<Value> = None;
        let mut result = CniResult::default();
        for (i, plugin) in list.plugins.iter().enumerate() {
            let conf = list.invocation_config(i, &self.capability_args, prev.as_ref())?;
            result = delegate::exec(&Self::plugin_type(&Value::Object(plugin.clone())), Command::Add, &env, &conf)?
                .unwrap_or_default();
            prev = Some(result.to_value(version)?);
        }
        Ok((result, prev.unwrap_or(Value::Null)))
    }

    /// DEL: the chain in reverse, each plugin given the cached result; keeps going past errors.
    pub fn del(&self, base: &CniEnv) -> Result<(), Error> {
        let list = self.list()?;
        let env = self.env(base, Command::Del);
        let mut errors = Vec::new();
        for i in (0..list.plugins.len()).rev() {
            let conf = list.invocation_config(i, &self.capability_args, self.result.as_ref())?;
            let plugin = Self::plugin_type(&Value::Object(list.plugins[i].clone()));
            if let Err(e) = delegate::exec(&plugin, Command::Del, &env, &conf) {
                errors.push(e);
            }
        }
        errors.into_iter().next().map_or(Ok(()), Err)
    }

    /// CHECK: the chain in order with the cached result (skipped for `disableCheck` lists and
    /// below 0.4.0, where CHECK does not exist).
    pub fn check(&self, base: &CniEnv) -> Result<(), Error> {
        let list = self.list()?;
        if list.disable_check == Some(true) || list.version()? < SpecVersion::CHECK_MIN {
            return Ok(());
        }
        let prev = self.result.as_ref().ok_or_else(|| {
            Error::new(plexus_cni::code::CHECK_FAILED, format!("network {}: no ADD result recorded", self.network))
        })?;
        let env = self.env(base, Command::Check);
        for i in 0..list.plugins.len() {
            let conf = list.invocation_config(i, &self.capability_args, Some(prev))?;
            delegate::exec(&Self::plugin_type(&Value::Object(list.plugins[i].clone())), Command::Check, &env, &conf)
                .map_err(|e| e.context(format!("network {}", self.network)))?;
        }
        Ok(())
    }

    /// STATUS or GC on every plugin of the list (GC with `valid` attachments); only for lists at
    /// 1.1.0 or later. Keeps going past errors.
    pub fn status_or_gc(&self, base: &CniEnv, command: Command, valid: Option<&Value>) -> Result<(), Error> {
        let list = self.list()?;
        if list.version()? < SpecVersion::GC_STATUS_MIN || (command == Command::Gc && list.disable_gc == Some(true)) {
            return Ok(());
        }
        let env = self.env(base, command);
        let mut errors = Vec::new();
        for i in 0..list.plugins.len() {
            let mut conf = list.invocation_config(i, &Map::new(), None)?;
            if let (Some(v), Some(m)) = (valid, conf.as_object_mut()) {
                m.insert("cni.dev/valid-attachments".into(), v.clone());
                m.insert("cni.dev/attachments".into(), v.clone());
            }
            if let Err(e) =
                delegate::exec(&Self::plugin_type(&Value::Object(list.plugins[i].clone())), command, &env, &conf)
            {
                errors.push(e.context(format!("network {}", self.network)));
            }
        }
        errors.into_iter().next().map_or(Ok(()), Err)
    }
}

/// Give every plugin of a delegate conf the `args.cni` keys (annotation `cni-args`; the annotation
/// wins over the config).
pub fn merge_cni_args(conf: &mut Value, cni_args: &Map<String, Value>) {
    let merge = |plugin: &mut Map<String, Value>| {
        let args = plugin.entry("args").or_insert_with(|| Value::Object(Map::new()));
        if let Some(args) = args.as_object_mut() {
            let cni = args.entry("cni").or_insert_with(|| Value::Object(Map::new()));
            if let Some(cni) = cni.as_object_mut() {
                cni.extend(cni_args.clone());
            }
        }
    };
    match conf.get_mut("plugins").and_then(Value::as_array_mut) {
        Some(plugins) => plugins.iter_mut().filter_map(Value::as_object_mut).for_each(merge),
        None => {
            if let Some(m) = conf.as_object_mut() {
                merge(m)
            }
        }
    }
}

/// The results of several attachments as one (no cluster network): interfaces concatenated,
/// addresses re-pointed at them, routes concatenated, the first DNS.
pub fn combine(results: &[CniResult]) -> CniResult {
    let mut all = CniResult::default();
    for r in results {
        let offset = all.interfaces.len();
        all.interfaces.extend(r.interfaces.iter().cloned());
        for ip in &r.ips {
            let mut ip = ip.clone();
            ip.interface = ip.interface.map(|i| i + offset);
            all.ips.push(ip);
        }
        all.routes.extend(r.routes.iter().cloned());
        if all.dns.is_empty() {
            all.dns = r.dns.clone();
        }
    }
    all
}
