//! One attachment: a delegate network (a single conf or a conflist) with its interface name and
//! capability arguments, and how to run each verb on it (libcni's rules for lists: runtimeConfig
//! from capabilities, prevResult along the chain on ADD, the cached result on CHECK and DEL, DEL
//! in reverse).
//!
//! How the meta-plugin runs an attachment's delegate is the seam between its steps (order,
//! parallel groups, cache, rollback) and the delegates themselves ([`Delegates`]): [`Chains`]
//! runs an attachment's chain of plugins (`plexus_plugin::chain`: each plugin exec'd, or run
//! in-process when plexus-daemon carries it) and tells an [`Observer`] how each call went; the
//! unit tests (`tests.rs`) put a recording fake in its place, so the steps are tested without
//! root.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use plexus_cni::{CniEnv, CniResult, Command, ConfList, Error};
use plexus_plugin::builtin::Runner;
use plexus_plugin::chain;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// What every delegate of one request runs with: the CNI environment its own derives from, and
/// how it runs — the request's [`Runner`] (exec'd; in plexus-daemon, a plugin it carries runs
/// in-process).
#[derive(Clone, Debug)]
pub struct DelegateEnv {
    pub cni: CniEnv,
    pub runner: Runner,
}

/// An attachment as the cache records it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Attachment {
    /// `namespace/nad`, or the conf's own name for cluster and default networks.
    pub network: String,
    pub ifname: String,
    /// The cluster network: its result is the one the runtime gets. (Cached as `master`, the
    /// name Multus's delegates use for it.)
    #[serde(default, rename = "master")]
    pub cluster_network: bool,
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
    /// `CNI_ARGS` this attachment's delegate gets besides the pod's: `IP=` and `MAC=` when the
    /// selection asked for addresses or a MAC (as Multus does, for plugins that read `CNI_ARGS`
    /// rather than the `ips`/`mac` capabilities).
    #[serde(default, rename = "cniArgs", skip_serializing_if = "Vec::is_empty")]
    pub cni_args: Vec<(String, String)>,
    /// The selection's `default-route` gateways; present (even empty) when it had the key.
    #[serde(default, rename = "defaultRoute", skip_serializing_if = "Option::is_none")]
    pub default_route: Option<Vec<std::net::IpAddr>>,
    /// The DRA claim's device this attachment is (its result goes to the claim's status, not to
    /// network-status). Not cached: DEL needs only the delegate, and the driver clears the claim's
    /// status when it unprepares it.
    #[serde(skip)]
    pub claim: Option<ClaimedDevice>,
}

/// A DRA claim's device, as its status entry names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimedDevice {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub pool: String,
    pub device: String,
    pub share_id: Option<String>,
    pub rdma_device: String,
    pub pci_address: String,
}

/// What a delegate config may not carry through plexus (a NAD is tenant-written): its own
/// `runtimeConfig` (only the runtime's capability arguments fill it) and log settings (the
/// admin's, which plexus hands its delegates in their environment) — also whereabouts'
/// `ipam.log_file`/`log_level`, which root would otherwise append to.
fn drop_tenant_keys(plugin: &mut Map<String, Value>) {
    for key in ["runtimeConfig", "logFile", "logLevel", "logToStderr"] {
        plugin.remove(key);
    }
    if let Some(ipam) = plugin.get_mut("ipam").and_then(Value::as_object_mut) {
        ipam.remove("log_file");
        ipam.remove("log_level");
    }
}

/// plexus's own attaching plugins always understand `CNIDeviceInfoFile` (device-info with the
/// RoCE GIDs they find): they get it whether or not their config declares the capability.
fn declare_own_capabilities(plugin: &mut Map<String, Value>) {
    let t = plugin.get("type").and_then(Value::as_str).unwrap_or_default();
    if matches!(t, "plexus-macvlan" | "plexus-host-device") {
        let caps = plugin.entry("capabilities").or_insert_with(|| Value::Object(Map::new()));
        if let Some(caps) = caps.as_object_mut() {
            caps.insert("CNIDeviceInfoFile".into(), Value::Bool(true));
        }
    }
}

impl Attachment {
    /// The conf as a list (a single conf is a list of one), without the keys a delegate config
    /// may not carry.
    fn list(&self) -> Result<ConfList, Error> {
        let conf = self.conf.clone();
        let mut list = if plexus_k8s::nad::is_conflist(&conf) {
            ConfList::from_value(conf)
        } else {
            ConfList::from_single_value(conf)
        }
        .map_err(|e| e.context(format!("network {}", self.network)))?;
        list.plugins.iter_mut().for_each(drop_tenant_keys);
        list.plugins.iter_mut().for_each(declare_own_capabilities);
        Ok(list)
    }

    /// Refuse a network that would run, as a plugin or as a plugin's IPAM, what the delegation
    /// seam never runs as a delegate (a meta-plugin, one of plexus's binaries that are not
    /// plugins: `plexus_plugin::delegate::resolve`), before any of its plugins runs (code 7). The
    /// seam refuses it anyway, on every path; this only refuses it before anything else runs.
    pub fn refuse_forbidden_plugins(&self, cni_path: &[PathBuf]) -> Result<(), Error> {
        for plugin in self.list()?.plugins {
            let t = plugin.get("type").and_then(Value::as_str);
            let ipam = plugin.get("ipam").and_then(|i| i.get("type")).and_then(Value::as_str);
            for named in [t, ipam].into_iter().flatten() {
                plexus_plugin::delegate::refuse_forbidden(named, cni_path).map_err(|e| self.named(e))?;
            }
        }
        Ok(())
    }

    /// The type of the delegate's first plugin (`macvlan`, `plexus-host-device`, ...), as the
    /// daemon's metrics label a delegate.
    pub fn delegate_type(&self) -> String {
        let first = match self.conf.get("plugins").and_then(Value::as_array) {
            Some(plugins) => plugins.first(),
            None => Some(&self.conf),
        };
        first.and_then(|p| p.get("type")).and_then(Value::as_str).unwrap_or_default().to_string()
    }

    /// `network <name> (<ifname>)`, as errors and logs name an attachment.
    pub fn describe(&self) -> String {
        format!("network {} ({})", self.network, self.ifname)
    }

    fn env(&self, base: &CniEnv) -> CniEnv {
        let mut env = CniEnv { ifname: self.ifname.clone(), ..base.clone() };
        if !self.cni_args.is_empty() {
            env.args.set("IgnoreUnknown", "true");
            for (k, v) in &self.cni_args {
                env.args.set(k, v);
            }
        }
        env
    }

    fn named(&self, e: Error) -> Error {
        e.context(format!("network {}", self.network))
    }

    /// ADD: the chain in order, each plugin given the previous result; returns the final result.
    pub fn add(&self, base: &DelegateEnv) -> Result<(CniResult, Value), Error> {
        chain::add(&base.runner, &self.list()?, &self.capability_args, &self.env(&base.cni))
    }

    /// A result as this attachment's chain prints it (its list's version), for the cache.
    pub fn render(&self, result: &CniResult) -> Result<Value, Error> {
        result.to_value(self.list()?.version()?)
    }

    /// DEL: the chain in reverse, each plugin given the cached result; keeps going past errors.
    pub fn del(&self, base: &DelegateEnv) -> Result<(), Error> {
        chain::del(&base.runner, &self.list()?, &self.capability_args, &self.env(&base.cni), self.result.as_ref())
    }

    /// CHECK: the chain in order with the cached result.
    pub fn check(&self, base: &DelegateEnv) -> Result<(), Error> {
        chain::check(&base.runner, &self.list()?, &self.capability_args, &self.env(&base.cni), self.result.as_ref())
            .map_err(|e| self.named(e))
    }

    /// STATUS or GC on every plugin of the list (GC with the `valid` attachments).
    pub fn status_or_gc(&self, base: &DelegateEnv, command: Command, valid: Option<&Value>) -> Result<(), Error> {
        chain::status_or_gc(&base.runner, &self.list()?, &self.env(&base.cni), command, valid)
            .map_err(|e| self.named(e))
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

/// Runs an attachment's delegate.
pub(crate) trait Delegates: Send + Sync {
    /// ADD: the final result, and as the delegate printed it (for the cache).
    fn add(&self, a: &Attachment, env: &DelegateEnv) -> Result<(CniResult, Value), Error>;
    fn del(&self, a: &Attachment, env: &DelegateEnv) -> Result<(), Error>;
    fn check(&self, a: &Attachment, env: &DelegateEnv) -> Result<(), Error>;
}

/// Told of every delegate call (the daemon's metrics and spans).
pub trait Observer: Send + Sync {
    fn delegate(&self, call: &DelegateCall<'_>);
}

/// One delegate call, as an [`Observer`] is told of it when it has ended.
pub struct DelegateCall<'a> {
    pub command: Command,
    /// The network (`namespace/nad`, or the conf's own name).
    pub network: &'a str,
    /// The network's first plugin, or [`UNKNOWN_TYPE`].
    pub delegate_type: &'a str,
    pub started: SystemTime,
    pub took: Duration,
    /// The error when it failed.
    pub error: Option<&'a Error>,
    /// The `TRACEPARENT` the delegate was handed, when it was handed one.
    pub traceparent: Option<&'a str>,
}

/// The delegate type an observer is told for a type that names no installed plugin.
pub const UNKNOWN_TYPE: &str = "(not installed)";

/// The delegates as they are: each attachment's chain of plugins, each call told to the
/// observers.
#[derive(Default)]
pub(crate) struct Chains {
    pub observers: Vec<Arc<dyn Observer>>,
}

impl Chains {
    /// Run one delegate verb, telling the observers how long it took and how it ended.
    fn observed<T>(
        &self,
        command: Command,
        a: &Attachment,
        env: &DelegateEnv,
        call: impl FnOnce() -> Result<T, Error>,
    ) -> Result<T, Error> {
        if self.observers.is_empty() {
            return call();
        }
        let (started, start) = (SystemTime::now(), Instant::now());
        let out = call();
        let took = start.elapsed();
        let delegate_type = observed_type(a, env);
        let traceparent = env.cni.vars.iter().find(|(k, _)| k == "TRACEPARENT").map(|(_, v)| v.as_str());
        let call = DelegateCall {
            command,
            network: &a.network,
            delegate_type: &delegate_type,
            started,
            took,
            error: out.as_ref().err(),
            traceparent,
        };
        for observer in &self.observers {
            observer.delegate(&call);
        }
        out
    }
}

impl Delegates for Chains {
    fn add(&self, a: &Attachment, env: &DelegateEnv) -> Result<(CniResult, Value), Error> {
        self.observed(Command::Add, a, env, || a.add(env))
    }

    fn del(&self, a: &Attachment, env: &DelegateEnv) -> Result<(), Error> {
        self.observed(Command::Del, a, env, || a.del(env))
    }

    fn check(&self, a: &Attachment, env: &DelegateEnv) -> Result<(), Error> {
        self.observed(Command::Check, a, env, || a.check(env))
    }
}

/// The delegate type an observer is told: the attachment's first plugin when it is a plugin
/// installed where delegates are found (the admin's `binDir` and `CNI_PATH`), else
/// [`UNKNOWN_TYPE`] — a NAD's `type` is any string a tenant writes, and a metric label per string
/// would grow without bound.
fn observed_type(a: &Attachment, env: &DelegateEnv) -> String {
    let t = a.delegate_type();
    match plexus_plugin::delegate::find_plugin(&t, &env.cni.path) {
        Ok(_) => t,
        Err(_) => UNKNOWN_TYPE.into(),
    }
}
