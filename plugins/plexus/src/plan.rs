//! Which attachments a pod gets, in order: the cluster network (or the first inline delegate),
//! the default networks, the selected networks, then the devices of its DRA claims — each
//! resolved to its delegate config, with its interface name, device ID and capability arguments;
//! refused whole, before anything runs, when it asks for too much or for what never runs as a
//! delegate.
//!
//! A claim's device is a pod's second selection source, next to its annotation: plexus's DRA
//! driver (`plexus-daemon --dra`) prepared the claims reserved for the pod before its sandbox was
//! made and kept them in `draClaimsDir`; each device is attached with plexus-host-device (an
//! exclusive port: the netdev and its RDMA device move into the pod) or plexus-macvlan (a shared
//! port: a macvlan on it), configured by the claim (`ClaimConfig`), and its result goes to the
//! claim's status (KEP-4817, `status.rs`) instead of network-status. The same node policy,
//! rollback, cache and DEL as a NAD's attachment.

use std::path::{Path, PathBuf};

use plexus_cni::Error;
use plexus_dra::claims::{Prepared, PreparedDevice, Store};
use plexus_dra::nics::Mode;
use plexus_k8s::nad::{self, NadSource};
use plexus_k8s::selection::parse_default_network;
use plexus_k8s::{K8sError, NetworkSelection, checkpoint, parse_selections, podresources};
use plexus_plugin::Request;
use serde_json::{Map, Value, json};

use crate::attachment::{Attachment, ClaimedDevice, merge_cni_args};
use crate::cluster::SelectionSource;
use crate::conf::MetaConf;
use crate::pod::Pod;

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
    // The kubelet's pod-resources API first (by pod name), then its checkpoint file (by UID).
    let socket = conf.pod_resources_socket.clone().unwrap_or_else(|| podresources::DEFAULT_SOCKET.into());
    let from_api = match pod.who.name.is_empty() {
        true => None,
        false => match podresources::device_ids(&socket, &pod.who.namespace, &pod.who.name, resource, conf.api_timeout)
        {
            Ok(Some((ids, source))) => {
                tracing::debug!(?source, resource, ?ids, "devices from the kubelet's pod-resources API");
                Some((ids, format!("pod-resources {}", socket.display())))
            }
            Ok(None) => {
                tracing::info!(pod = %pod.who.name, "the kubelet's pod-resources API does not list the pod: reading its checkpoint");
                None
            }
            Err(e) => {
                tracing::info!("{e}: reading the kubelet's checkpoint");
                None
            }
        },
    };
    let (ids, source) = match from_api {
        Some(found) => found,
        None => {
            if pod.who.uid.is_empty() {
                return Err(refused(
                    "the runtime named no pod UID (K8S_POD_UID) to look the kubelet's allocation up".into(),
                ));
            }
            let cp = conf.kubelet_checkpoint.clone().unwrap_or_else(|| checkpoint::DEFAULT_CHECKPOINT.into());
            (checkpoint::device_ids(&cp, &pod.who.uid, resource)?, cp.display().to_string())
        }
    };
    ids.get(n).cloned().ok_or_else(|| {
        refused(format!(
            "the kubelet allocated {} to pod {} ({source})",
            ids.len(),
            pod.who.reference().unwrap_or_else(|| pod.who.uid.clone())
        ))
    })
}

/// Every attachment of this pod, in order, with interface names `net1`, `net2`, ... for the
/// secondaries (an explicit `interface` does not renumber the rest: `a@foo,b` gives foo, net2).
/// NADs are read from `nads`; a network that would run a meta-plugin or one of plexus's binaries
/// that are not plugins (found in `cni_path`, where its delegates are) is refused before any runs.
pub fn plan(
    req: &Request,
    conf: &MetaConf,
    pod: &Pod,
    nads: &dyn NadSource,
    selection: SelectionSource<'_>,
    cni_path: &[PathBuf],
) -> Result<Vec<Attachment>, Error> {
    // A NAD is tenant-written: no larger than the policy allows, wherever it is read from.
    let nads = &nad::SizeCapped { source: nads, max: req.policy.limits.nad_config_bytes };
    let (selections, default_network) = read_selection(selection)?;
    check_default_routes(&selections)?;
    let cluster_network = conf.cluster_network.as_deref().filter(|c| !c.is_empty());
    let default_networks: &[String] =
        if conf.system_namespaces.contains(&pod.who.namespace) { &[] } else { &conf.default_networks };
    // Refused before any NAD is read or any delegate runs.
    let claims = claims_of(conf, pod);
    let claimed: usize = claims.iter().map(|c| c.devices.len()).sum();
    let asked = usize::from(cluster_network.is_some())
        + conf.delegates.len()
        + default_networks.len()
        + selections.len()
        + claimed;
    refuse_too_many(req, pod, asked)?;
    let mut replacement = default_network.map(|sel| replacement_network(&sel, conf, pod, nads)).transpose()?;
    let mut out = Planned::new(req);
    if let Some(cn) = cluster_network {
        let (name, v) = match replacement.take() {
            Some(r) => r,
            None => resolve_network(cn, conf, nads)?,
        };
        out.push(name, v, true, Map::new(), None);
    }
    for (i, d) in conf.delegates.iter().enumerate() {
        let (name, v) = match replacement.take().filter(|_| i == 0) {
            Some(r) => r,
            None => (d.get("name").and_then(Value::as_str).unwrap_or("delegate").to_string(), d.clone()),
        };
        out.push(name, v, i == 0, Map::new(), None);
    }
    for dn in default_networks {
        let (name, v) = resolve_network(dn, conf, nads)?;
        out.push(name, v, false, Map::new(), None);
    }
    let mut devices = DeviceCursor::default();
    for sel in selections {
        out.push_selected(&sel, conf, pod, nads, &mut devices)?;
    }
    for claim in &claims {
        for d in &claim.devices {
            out.push_claimed(claim, d, conf, nads)?;
        }
    }
    out.finish(cni_path)
}

/// The selected networks and the default network asked for, from the annotations or the config.
fn read_selection(selection: SelectionSource<'_>) -> Result<(Vec<NetworkSelection>, Option<NetworkSelection>), Error> {
    Ok(match selection {
        SelectionSource::Annotation { networks, default_network } => (
            parse_selections(networks.as_deref().unwrap_or_default())?,
            default_network.as_deref().map(parse_default_network).transpose()?,
        ),
        SelectionSource::Config(c) => (parse_selections(c.unwrap_or_default())?, None),
    })
}

/// More attachments than the node policy's `maxAttachments`: refused.
fn refuse_too_many(req: &Request, pod: &Pod, asked: usize) -> Result<(), Error> {
    if asked <= req.policy.max_attachments {
        return Ok(());
    }
    Err(Error::invalid_config(format!(
        "pod {}: {asked} attachments asked for, the node policy allows at most {}",
        pod.who.reference().unwrap_or_else(|| "(standalone)".into()),
        req.policy.max_attachments
    ))
    .with_details(format!("maxAttachments (policy: {})", req.policy.source)))
}

/// The network the pod's default-network annotation names, which replaces the cluster network
/// (or the first inline delegate); looked up in multusNamespace unless it names a namespace
/// (Multus).
fn replacement_network(
    sel: &NetworkSelection,
    conf: &MetaConf,
    pod: &Pod,
    nads: &dyn NadSource,
) -> Result<(String, Value), Error> {
    let ns = sel.namespace_or(&conf.multus_namespace).to_string();
    // Unlike Multus, namespace isolation holds here too: the admin's namespace, the pod's own
    // and the global ones only.
    let globals = &conf.global_namespaces;
    if conf.namespace_isolation && ns != conf.multus_namespace && ns != pod.who.namespace && !globals.contains(&ns) {
        return Err(Error::invalid_config(format!(
            "namespace isolation: pod {}/{} may not use network-attachment-definition {ns}/{} as its default network",
            pod.who.namespace, pod.who.name, sel.name
        )));
    }
    let v = nads.nad(&ns, &sel.name)?.cni_config(&conf.conf_dir)?;
    Ok((format!("{ns}/{}", sel.name), v))
}

/// How many devices of each resource the pod's selections have taken so far (the n-th
/// selection of a resource gets the kubelet's n-th device of it).
type DeviceCursor = std::collections::BTreeMap<String, usize>;

/// The attachments planned so far.
struct Planned<'r> {
    req: &'r Request,
    /// The runtime's own capability arguments: they reach every delegate.
    runtime_caps: Map<String, Value>,
    out: Vec<Attachment>,
}

impl<'r> Planned<'r> {
    fn new(req: &'r Request) -> Planned<'r> {
        Planned { req, runtime_caps: req.config.runtime_config.clone().unwrap_or_default(), out: Vec::new() }
    }

    /// The next attachment: the cluster network gets the runtime's interface name, the others
    /// theirs or the next `net<n>`.
    fn push(
        &mut self,
        network: String,
        conf: Value,
        cluster_network: bool,
        caps: Map<String, Value>,
        ifname: Option<String>,
    ) -> &mut Attachment {
        let idx = self.out.len();
        let ifname = match (cluster_network, ifname) {
            (true, _) => self.req.env.ifname.clone(),
            (false, Some(i)) => i,
            (false, None) => {
                format!("net{}", if self.out.first().is_some_and(|a| a.cluster_network) { idx } else { idx + 1 })
            }
        };
        // The selection's capability arguments win over the runtime's.
        let mut capability_args = self.runtime_caps.clone();
        capability_args.extend(caps);
        self.out.push(Attachment {
            network,
            ifname,
            cluster_network,
            conf,
            capability_args,
            result: None,
            device_info_file: None,
            resource_name: None,
            device_id: None,
            default_route: None,
            cni_args: Vec::new(),
            claim: None,
        });
        self.out.last_mut().expect("just pushed")
    }

    /// A network the pod selected: its NAD (within namespace isolation), its `cni-args`, the
    /// device the kubelet allocated for a `resourceName` NAD, the selection's IPs, MAC and
    /// default route, and its device-info file.
    fn push_selected(
        &mut self,
        sel: &NetworkSelection,
        conf: &MetaConf,
        pod: &Pod,
        nads: &dyn NadSource,
        devices: &mut DeviceCursor,
    ) -> Result<(), Error> {
        let ns = sel.namespace_or(&pod.who.namespace).to_string();
        let globals = &conf.global_namespaces;
        if conf.namespace_isolation && ns != pod.who.namespace && !globals.contains(&ns) {
            return Err(Error::invalid_config(format!(
                "namespace isolation: pod {}/{} may not use network-attachment-definition {ns}/{}",
                pod.who.namespace, pod.who.name, sel.name
            ))
            .with_details(format!("allowed: its own namespace and {globals:?}")));
        }
        let nad = nads.nad(&ns, &sel.name)?;
        let mut v = nad.cni_config(&conf.conf_dir)?;
        if let Some(args) = &sel.cni_args {
            merge_cni_args(&mut v, args);
        }
        let mut caps = selection_caps(sel);
        // A `resourceName` NAD takes only a device the kubelet allocated to this pod, injected
        // into every plugin of the chain (Multus). A `deviceID` from the annotation is the
        // tenant's word: it reaches only plugins that declare the `deviceID` capability.
        let device = match &nad.resource_name {
            Some(resource) => {
                let n = devices.entry(resource.clone()).or_default();
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
        let device_info_dir = self.req.policy.device_info_dir.clone();
        let container_id = self.req.env.container_id.clone();
        let a = self.push(format!("{ns}/{}", sel.name), v, false, caps, sel.interface.clone());
        a.default_route = sel.default_route.clone();
        if !sel.ips.is_empty() {
            a.cni_args.push(("IP".into(), sel.ips.join(",")));
        }
        if let Some(mac) = &sel.mac {
            a.cni_args.push(("MAC".into(), mac.clone()));
        }
        // Every selected network is offered a device-info file (plugins that declare the
        // CNIDeviceInfoFile capability get it; plexus's own attaching plugins always do): a
        // device's, and the RoCE GIDs plexus-macvlan and plexus-host-device find, reach
        // network-status through it. Multus offers one only with a device ID.
        let file = device_info_dir.join(format!("{}-{container_id}_{}", a.network.replace('/', "-"), a.ifname));
        a.capability_args.insert("CNIDeviceInfoFile".into(), file.display().to_string().into());
        a.device_info_file = Some(file);
        if device.is_some() {
            a.resource_name = nad.resource_name.clone();
            a.device_id = device;
        }
        Ok(())
    }

    /// A device of a DRA claim reserved for the pod: its port attached as the claim says, under
    /// the interface name it asks for (else the port's), offered a device-info file.
    fn push_claimed(
        &mut self,
        claim: &Prepared,
        d: &PreparedDevice,
        conf: &MetaConf,
        nads: &dyn NadSource,
    ) -> Result<(), Error> {
        let v = delegate_conf(claim, d, conf, nads)?;
        let device_info_dir = self.req.policy.device_info_dir.clone();
        let container_id = self.req.env.container_id.clone();
        let network = format!("{}/{}", claim.namespace, network_name(claim, d));
        let a = self.push(network, v, false, Map::new(), Some(d.ifname_in_pod().to_string()));
        let file = device_info_dir.join(format!("{}-{container_id}_{}", a.network.replace('/', "-"), a.ifname));
        a.capability_args.insert("CNIDeviceInfoFile".into(), file.display().to_string().into());
        a.device_info_file = Some(file);
        a.claim = Some(claimed_device(claim, d));
        Ok(())
    }

    /// The plan, unless two attachments ask for one interface name or one would run what is
    /// never a delegate (found in `cni_path`).
    fn finish(self, cni_path: &[PathBuf]) -> Result<Vec<Attachment>, Error> {
        let mut seen = std::collections::HashSet::new();
        for a in &self.out {
            if !seen.insert(a.ifname.clone()) {
                return Err(Error::invalid_config(format!("two attachments ask for interface {:?}", a.ifname)));
            }
            a.refuse_forbidden_plugins(cni_path)?;
        }
        Ok(self.out)
    }
}

/// The prepared claims reserved for `pod` (none without `draClaimsDir` or a pod UID).
pub(crate) fn claims_of(conf: &MetaConf, pod: &Pod) -> Vec<Prepared> {
    match (&conf.dra_claims_dir, pod.who.uid.is_empty()) {
        (Some(dir), false) => Store::new(dir).for_pod(&pod.who.uid),
        _ => Vec::new(),
    }
}

/// The plugin config of device `d` of `claim`: the NAD its config names (in the claim's
/// namespace) or a plexus-host-device / plexus-macvlan config of its own, with the allocated port
/// as its device and the claim's MTU, `multiRail`, IPAM and macvlan mode.
fn delegate_conf(claim: &Prepared, d: &PreparedDevice, conf: &MetaConf, nads: &dyn NadSource) -> Result<Value, Error> {
    let plugin_type = match d.mode {
        Mode::Exclusive => "plexus-host-device",
        Mode::Shared => "plexus-macvlan",
    };
    let mut v = match &d.config.network {
        Some(name) => nads.nad(&claim.namespace, name)?.cni_config(&conf.conf_dir)?,
        None => json!({"cniVersion": "1.1.0", "name": network_name(claim, d), "type": plugin_type}),
    };
    let plugin = match v.get_mut("plugins").and_then(Value::as_array_mut) {
        Some(list) => list.first_mut(),
        None => Some(&mut v),
    }
    .and_then(Value::as_object_mut)
    .ok_or_else(|| {
        Error::invalid_config(format!("claim {}/{}: its network's config has no plugin", claim.namespace, claim.name))
    })?;
    if plugin.get("type").and_then(Value::as_str) != Some(plugin_type) {
        return Err(Error::invalid_config(format!(
            "claim {}/{}: device {} is a {} port, attached by {plugin_type}; network {:?} runs {}",
            claim.namespace,
            claim.name,
            d.device,
            d.mode.as_str(),
            d.config.network.as_deref().unwrap_or_default(),
            plugin.get("type").and_then(Value::as_str).unwrap_or("nothing")
        )));
    }
    set_port(plugin, d);
    if let Some(mtu) = d.config.mtu {
        plugin.insert("mtu".into(), mtu.into());
    }
    if let Some(m) = d.config.multi_rail {
        plugin.insert("multiRail".into(), m.into());
    }
    if let Some(ipam) = &d.config.ipam {
        plugin.insert("ipam".into(), ipam.clone());
    }
    Ok(v)
}

/// The allocated port as the plugin's device, whatever the NAD said.
fn set_port(plugin: &mut Map<String, Value>, d: &PreparedDevice) {
    match d.mode {
        Mode::Exclusive => {
            for key in ["pciBusID", "kernelpath", "hwaddr", "deviceID"] {
                plugin.remove(key);
            }
            plugin.insert("device".into(), d.ifname.clone().into());
        }
        Mode::Shared => {
            plugin.insert("master".into(), d.ifname.clone().into());
            if let Some(mode) = &d.config.macvlan_mode {
                plugin.insert("mode".into(), mode.clone().into());
            }
        }
    }
}

/// Which claim's device `d` is.
pub(crate) fn claimed_device(claim: &Prepared, d: &PreparedDevice) -> ClaimedDevice {
    ClaimedDevice {
        namespace: claim.namespace.clone(),
        name: claim.name.clone(),
        uid: claim.uid.clone(),
        pool: d.pool.clone(),
        device: d.device.clone(),
        share_id: d.share_id.clone(),
        rdma_device: d.rdma_device.clone(),
        pci_address: d.pci_address.clone(),
    }
}

/// The CNI network name of a claimed device: `dra-<claim>-<request>` (also its IPAM domain).
fn network_name(claim: &Prepared, d: &PreparedDevice) -> String {
    format!("dra-{}-{}", claim.name, d.request.replace('/', "-"))
}

#[cfg(test)]
mod multus_cases;

#[cfg(test)]
mod claim_cases;
