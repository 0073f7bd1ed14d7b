//! Which attachments a pod gets, in order: the cluster network (or the first inline delegate),
//! the default networks, then the selected networks — each resolved to its delegate config, with
//! its interface name, device ID and capability arguments.

use std::path::{Path, PathBuf};

use plexus_cni::{Error, Request};
use plexus_k8s::nad::{self, NadSource};
use plexus_k8s::selection::parse_default_network;
use plexus_k8s::{K8sError, NetworkSelection, checkpoint, parse_selections};
use serde_json::{Map, Value};

use crate::attachment::{Attachment, merge_cni_args};
use crate::conf::MetaConf;

/// The device plugin's device-info file of `device` of `resource` (device-info spec §5), if it
/// wrote one; the name is one path component (the resource name is a NAD's, the device the
/// kubelet's).
pub fn device_plugin_info(resource: &str, device: &str) -> PathBuf {
    let name = format!("{}-{}-device.json", resource.replace('/', "-"), device.replace('/', "-"));
    PathBuf::from(plexus_cni::paths::DEVICE_INFO_DP_DIR).join(name)
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

/// Where the selection comes from: the pod's annotations (API: `k8s.v1.cni.cncf.io/networks`
/// and `v1.multus-cni.io/default-network`) or the config's `networks`.
pub enum SelectionSource<'a> {
    Annotation { networks: Option<String>, default_network: Option<String> },
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

/// Multus's rule: at most one IPv4 and one IPv6 gateway across every `default-route` of the pod
/// (a default route through two attachments would be ECMP).
fn check_default_routes(selections: &[NetworkSelection]) -> Result<(), Error> {
    let gateways: Vec<_> = selections.iter().flat_map(|s| s.default_route.iter().flatten()).collect();
    for (family, v4) in [("IPv4", true), ("IPv6", false)] {
        let of_family: Vec<String> = gateways.iter().filter(|g| g.is_ipv4() == v4).map(|g| g.to_string()).collect();
        if of_family.len() > 1 {
            return Err(Error::invalid_config(format!(
                "default-route: {} {family} gateways across the selection ({}): one default route per family \
                 (ECMP is not supported, as in Multus)",
                of_family.len(),
                of_family.join(", ")
            )));
        }
    }
    Ok(())
}

/// The `n`-th device the kubelet allocated to the pod for `resource` (sorted): the NAD
/// `ns/name` asks for one, so none is an error.
fn kubelet_device(conf: &MetaConf, pod: &Pod, ns: &str, name: &str, resource: &str, n: usize) -> Result<String, Error> {
    let refused = |why: String| {
        Error::invalid_config(format!("network-attachment-definition {ns}/{name} needs a device of {resource}: {why}"))
            .with_details("request the resource in the pod's containers; a deviceID in the annotation is not enough")
    };
    if pod.uid.is_empty() {
        return Err(refused("the runtime named no pod UID (K8S_POD_UID) to look the kubelet's allocation up".into()));
    }
    let cp = conf.kubelet_checkpoint.clone().unwrap_or_else(|| checkpoint::DEFAULT_CHECKPOINT.into());
    let ids = checkpoint::device_ids(&cp, &pod.uid, resource)?;
    ids.get(n)
        .cloned()
        .ok_or_else(|| refused(format!("the kubelet allocated {} to pod {} ({})", ids.len(), pod.uid, cp.display())))
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
            default_route: None,
        });
    };
    let (selections, default_network) = match selection {
        SelectionSource::Annotation { networks, default_network } => (
            parse_selections(networks.as_deref().unwrap_or_default())?,
            default_network.as_deref().map(parse_default_network).transpose()?,
        ),
        SelectionSource::Config(c) => (parse_selections(c.unwrap_or_default())?, None),
    };
    check_default_routes(&selections)?;
    let cluster_network = conf.cluster_network.as_deref().filter(|c| !c.is_empty());
    let default_networks: &[String] =
        if conf.system_namespaces.contains(&pod.namespace) { &[] } else { &conf.default_networks };
    // Refused before any NAD is read or any delegate runs.
    let asked =
        usize::from(cluster_network.is_some()) + conf.delegates.len() + default_networks.len() + selections.len();
    if asked > req.policy.max_attachments {
        return Err(Error::invalid_config(format!(
            "pod {}: {asked} attachments asked for, the node policy allows at most {}",
            pod.reference().unwrap_or_else(|| "(standalone)".into()),
            req.policy.max_attachments
        ))
        .with_details(format!("maxAttachments (policy: {})", req.policy.source)));
    }
    // The pod's default-network annotation replaces the cluster network (or the first inline
    // delegate); it is looked up in multusNamespace unless it names a namespace (Multus).
    let replacement = match &default_network {
        Some(sel) => {
            let ns = sel.namespace_or(&conf.multus_namespace).to_string();
            let v = nads.nad(&ns, &sel.name)?.cni_config(&conf.conf_dir)?;
            Some((format!("{ns}/{}", sel.name), v))
        }
        None => None,
    };
    let mut replacement = replacement;
    if let Some(cn) = cluster_network {
        let (name, v) = match replacement.take() {
            Some(r) => r,
            None => resolve_network(cn, conf, nads)?,
        };
        push(&mut out, name, v, true, Map::new(), None);
    }
    for (i, d) in conf.delegates.iter().enumerate() {
        let (name, v) = match replacement.take().filter(|_| i == 0) {
            Some(r) => r,
            None => (d.get("name").and_then(Value::as_str).unwrap_or("delegate").to_string(), d.clone()),
        };
        push(&mut out, name, v, i == 0, Map::new(), None);
    }
    for dn in default_networks {
        let (name, v) = resolve_network(dn, conf, nads)?;
        push(&mut out, name, v, false, Map::new(), None);
    }
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
        // A `resourceName` NAD takes only a device the kubelet allocated to this pod, injected
        // into every plugin of the chain (Multus). A `deviceID` from the annotation is the
        // tenant's word: it reaches only plugins that declare the `deviceID` capability.
        let device = match &nad.resource_name {
            Some(resource) => {
                let n = device_cursor.entry(resource.clone()).or_default();
                let id = kubelet_device(conf, pod, &ns, &sel.name, resource, *n)?;
                *n += 1;
                nad::inject_device_id(&mut v, &id);
                Some(id)
            }
            None => sel.device_id.clone(),
        };
        if let Some(id) = &device {
            caps.insert("deviceID".into(), id.clone().into());
        }
        let network = format!("{ns}/{}", sel.name);
        push(&mut out, network, v, false, caps, sel.interface.clone());
        out.last_mut().expect("just pushed").default_route = sel.default_route.clone();
        if device.is_some() {
            let a = out.last_mut().expect("just pushed");
            let file = req.policy.device_info_dir.join(format!(
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
