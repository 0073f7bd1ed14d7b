//! Which attachments a pod gets, in order: the cluster network (or the first inline delegate),
//! the default networks, then the selected networks — each resolved to its delegate config, with
//! its interface name, device ID and capability arguments.

use std::path::{Path, PathBuf};

use plexus_cni::{Error, Request};
use plexus_k8s::nad::{self, NadSource};
use plexus_k8s::{K8sError, NetworkSelection, checkpoint, parse_selections};
use serde_json::{Map, Value};

use crate::attachment::{Attachment, merge_cni_args};
use crate::conf::MetaConf;

/// Where per-attachment device-info files go (device-info spec §4).
pub const DEVINFO_CNI_DIR: &str = "/var/run/k8s.cni.cncf.io/devinfo/cni";
/// Where device plugins leave theirs (device-info spec §5).
pub const DEVINFO_DP_DIR: &str = "/var/run/k8s.cni.cncf.io/devinfo/dp";

/// The device plugin's device-info file of `device` of `resource`, if it wrote one.
pub fn device_plugin_info(resource: &str, device: &str) -> PathBuf {
    PathBuf::from(DEVINFO_DP_DIR).join(format!("{}-{device}-device.json", resource.replace('/', "-")))
}

/// The pod, as the runtime names it in `CNI_ARGS`.
#[derive(Clone, Debug)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub infra_container_id: String,
}

impl Default for Pod {
    /// No pod (STATUS, GC, standalone use): NADs are looked up in `default`.
    fn default() -> Pod {
        Pod { namespace: "default".into(), name: String::new(), uid: String::new(), infra_container_id: String::new() }
    }
}

impl Pod {
    pub fn from_request(req: &Request) -> Pod {
        let arg = |k: &str| req.env.args.get(k).unwrap_or_default().to_string();
        let namespace = arg("K8S_POD_NAMESPACE");
        Pod {
            namespace: if namespace.is_empty() { "default".into() } else { namespace },
            name: arg("K8S_POD_NAME"),
            uid: arg("K8S_POD_UID"),
            infra_container_id: arg("K8S_POD_INFRA_CONTAINER_ID"),
        }
    }

    pub fn reference(&self) -> Option<String> {
        (!self.name.is_empty()).then(|| format!("{}/{}", self.namespace, self.name))
    }
}

/// Where the selection comes from: the pod annotation (API) or the config's `networks`.
pub enum SelectionSource<'a> {
    Annotation(Option<String>),
    Config(Option<&'a str>),
}

/// A cluster/default network: a NAD name (in `multusNamespace`), a conf name in `confDir`, or a
/// path to a conf file or a directory (its first conf by name).
pub fn resolve_network(reference: &str, conf: &MetaConf, nads: &dyn NadSource) -> Result<(String, Value), Error> {
    if reference.contains('/') {
        let path = PathBuf::from(reference);
        let file = if path.is_dir() { first_conf(&path)? } else { path };
        let v = read_conf(&file)?;
        let name = v.get("name").and_then(Value::as_str).unwrap_or(reference).to_string();
        return Ok((name, v));
    }
    match nads.nad(&conf.multus_namespace, reference) {
        Ok(nad) => Ok((reference.to_string(), nad.cni_config(&conf.conf_dir)?)),
        Err(K8sError::NadNotFound { .. }) => {
            nad::find_conf_by_name(&conf.conf_dir, reference)?.map(|v| (reference.to_string(), v)).ok_or_else(|| {
                Error::invalid_config(format!(
                    "network {reference:?}: no network-attachment-definition in {} and no conf of that name in {}",
                    conf.multus_namespace,
                    conf.conf_dir.display()
                ))
            })
        }
        Err(e) => Err(e.into()),
    }
}

fn first_conf(dir: &Path) -> Result<PathBuf, Error> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::invalid_config(format!("{}: {e}", dir.display())))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("conf" | "conflist" | "json")))
        .collect();
    files.sort();
    files.into_iter().next().ok_or_else(|| Error::invalid_config(format!("no CNI conf in {}", dir.display())))
}

fn read_conf(file: &Path) -> Result<Value, Error> {
    let bytes = std::fs::read(file).map_err(|e| Error::invalid_config(format!("{}: {e}", file.display())))?;
    serde_json::from_slice(&bytes).map_err(|e| Error::decoding(format!("{}: {e}", file.display())))
}

/// The capability arguments one selection asks for (multi-net spec §4.1.2.1).
fn selection_caps(sel: &NetworkSelection) -> Map<String, Value> {
    let mut caps = Map::new();
    if !sel.ips.is_empty() {
        caps.insert("ips".into(), sel.ips.clone().into());
    }
    if let Some(mac) = &sel.mac {
        caps.insert("mac".into(), mac.clone().into());
    }
    if let Some(pm) = &sel.port_mappings {
        caps.insert("portMappings".into(), pm.clone());
    }
    if let Some(bw) = &sel.bandwidth {
        caps.insert("bandwidth".into(), bw.clone());
    }
    if let Some(guid) = &sel.infiniband_guid {
        caps.insert("infinibandGUID".into(), guid.clone().into());
    }
    caps
}

/// Every attachment of this pod, in order, with interface names `net1`, `net2`, ... for the
/// secondaries (an explicit `interface` does not renumber the rest: `a@foo,b` gives foo, net2).
pub fn plan(
    req: &Request,
    conf: &MetaConf,
    pod: &Pod,
    nads: &dyn NadSource,
    selection: SelectionSource<'_>,
) -> Result<Vec<Attachment>, Error> {
    let runtime_caps = req.config.runtime_config.clone().unwrap_or_default();
    let mut out: Vec<Attachment> = Vec::new();
    let push = |out: &mut Vec<Attachment>,
                network: String,
                conf_v: Value,
                master: bool,
                caps: Map<String, Value>,
                ifname: Option<String>| {
        let idx = out.len();
        let ifname = match (master, ifname) {
            (true, _) => req.env.ifname.clone(),
            (false, Some(i)) => i,
            (false, None) => format!("net{}", if out.first().is_some_and(|a| a.master) { idx } else { idx + 1 }),
        };
        // The runtime's own capability arguments reach every delegate; the selection's win.
        let mut all_caps = runtime_caps.clone();
        all_caps.extend(caps);
        out.push(Attachment {
            network,
            ifname,
            master,
            conf: conf_v,
            capability_args: all_caps,
            result: None,
            device_info_file: None,
            resource_name: None,
            device_id: None,
        });
    };
    if let Some(cn) = conf.cluster_network.as_deref().filter(|c| !c.is_empty()) {
        let (name, v) = resolve_network(cn, conf, nads)?;
        push(&mut out, name, v, true, Map::new(), None);
    }
    for (i, d) in conf.delegates.iter().enumerate() {
        let name = d.get("name").and_then(Value::as_str).unwrap_or("delegate").to_string();
        push(&mut out, name, d.clone(), i == 0, Map::new(), None);
    }
    if !conf.system_namespaces.contains(&pod.namespace) {
        for dn in &conf.default_networks {
            let (name, v) = resolve_network(dn, conf, nads)?;
            push(&mut out, name, v, false, Map::new(), None);
        }
    }
    let selections = match selection {
        SelectionSource::Annotation(a) => parse_selections(a.as_deref().unwrap_or_default())?,
        SelectionSource::Config(c) => parse_selections(c.unwrap_or_default())?,
    };
    let mut device_cursor: std::collections::BTreeMap<String, usize> = Default::default();
    let globals = conf.global_namespaces();
    for sel in selections {
        let ns = sel.namespace_or(&pod.namespace).to_string();
        if conf.namespace_isolation && ns != pod.namespace && !globals.contains(&ns) {
            return Err(Error::invalid_config(format!(
                "namespace isolation: pod {}/{} may not use network-attachment-definition {ns}/{}",
                pod.namespace, pod.name, sel.name
            ))
            .with_details(format!("allowed: its own namespace and {globals:?}")));
        }
        let nad = nads.nad(&ns, &sel.name)?;
        let mut v = nad.cni_config(&conf.conf_dir)?;
        if let Some(args) = &sel.cni_args {
            merge_cni_args(&mut v, args);
        }
        let mut caps = selection_caps(&sel);
        // The kubelet-allocated device wins over a deviceID in the annotation (Multus).
        let device = match &nad.resource_name {
            Some(resource) if !pod.uid.is_empty() => {
                let cp = conf.kubelet_checkpoint.clone().unwrap_or_else(|| checkpoint::DEFAULT_CHECKPOINT.into());
                let ids = checkpoint::device_ids(&cp, &pod.uid, resource)?;
                let n = device_cursor.entry(resource.clone()).or_default();
                let id = ids.get(*n).cloned();
                *n += 1;
                id.or_else(|| sel.device_id.clone())
            }
            _ => sel.device_id.clone(),
        };
        if let Some(id) = &device {
            nad::inject_device_id(&mut v, id);
            caps.insert("deviceID".into(), id.clone().into());
        }
        let network = format!("{ns}/{}", sel.name);
        push(&mut out, network, v, false, caps, sel.interface.clone());
        if device.is_some() {
            let a = out.last_mut().expect("just pushed");
            let file = PathBuf::from(DEVINFO_CNI_DIR).join(format!(
                "{}-{}_{}",
                a.network.replace('/', "-"),
                req.env.container_id,
                a.ifname
            ));
            a.capability_args.insert("CNIDeviceInfoFile".into(), file.display().to_string().into());
            a.device_info_file = Some(file);
            a.resource_name = nad.resource_name.clone();
            a.device_id = device.clone();
        }
    }
    let mut seen = std::collections::HashSet::new();
    for a in &out {
        if !seen.insert(a.ifname.clone()) {
            return Err(Error::invalid_config(format!("two attachments ask for interface {:?}", a.ifname)));
        }
    }
    Ok(out)
}
