//! Devices of DRA claims as attachments: a pod's second selection source, next to its
//! annotation. plexus's DRA driver (`plexus-daemon --dra`) prepared the claims reserved for the
//! pod before its sandbox was made and kept them in `draClaimsDir`; ADD attaches each device with
//! plexus-host-device (an exclusive port: the netdev and its RDMA device move into the pod) or
//! plexus-macvlan (a shared port: a macvlan on it), configured by the claim (`ClaimConfig`), and
//! writes the result to the claim's status (KEP-4817) instead of network-status. The same plan,
//! node policy, rollback, cache and DEL as a NAD's attachment.

use plexus_cni::Error;
use plexus_dra::claims::{Prepared, PreparedDevice, Store};
use plexus_dra::nics::Mode;
use plexus_k8s::nad::NadSource;
use serde_json::{Map, Value, json};

use crate::attachment::ClaimedDevice;
use crate::conf::MetaConf;
use crate::plan::Pod;

/// The prepared claims reserved for `pod` (none without `draClaimsDir` or a pod UID).
pub fn of_pod(conf: &MetaConf, pod: &Pod) -> Vec<Prepared> {
    match (&conf.dra_claims_dir, pod.uid.is_empty()) {
        (Some(dir), false) => Store::new(dir).for_pod(&pod.uid),
        _ => Vec::new(),
    }
}

/// The plugin config of device `d` of `claim`: the NAD its config names (in the claim's
/// namespace) or a plexus-host-device / plexus-macvlan config of its own, with the allocated port
/// as its device and the claim's MTU, `multiRail`, IPAM and macvlan mode.
pub fn delegate_conf(
    claim: &Prepared,
    d: &PreparedDevice,
    conf: &MetaConf,
    nads: &dyn NadSource,
) -> Result<Value, Error> {
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
pub fn claimed_device(claim: &Prepared, d: &PreparedDevice) -> ClaimedDevice {
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
pub fn network_name(claim: &Prepared, d: &PreparedDevice) -> String {
    format!("dra-{}-{}", claim.name, d.request.replace('/', "-"))
}

/// The device's KEP-4817 status entry after an ADD: `Ready`, the interface, its addresses and MAC
/// in `networkData`, and the RDMA device, PCI address and RoCE GIDs (from its device-info) in
/// `data`.
pub fn ready(c: &ClaimedDevice, ifname: &str, result: &plexus_cni::CniResult, device_info: Option<&Value>) -> Value {
    let iface = result.interfaces.iter().position(|i| i.name == ifname && i.sandbox.is_some());
    let ips: Vec<String> = result
        .ips
        .iter()
        .filter(|ip| iface.is_none() || ip.interface == iface)
        .map(|ip| ip.address.to_string())
        .take(16)
        .collect();
    let mac = iface.and_then(|i| result.interfaces[i].mac.clone());
    let gids = device_info.and_then(|d| d.pointer("/pci/roce-gids")).cloned();
    let mut data = json!({"rdmaDevice": c.rdma_device, "pciAddress": c.pci_address});
    if let Some(g) = gids {
        data["roceGids"] = g;
    }
    let mut network = json!({"interfaceName": ifname, "ips": ips});
    if let Some(mac) = mac {
        network["hardwareAddress"] = mac.into();
    }
    entry(
        c,
        plexus_k8s::claims::ready_condition("True", "NetworkDeviceReady", &format!("{ifname} attached")),
        Some(network),
        Some(data),
    )
}

/// After a failed ADD of `pod`: each device of its claims says `Ready` false, and why (best
/// effort: what the API does not take is logged).
pub fn tell_failed(view: &dyn crate::ClusterView, conf: &MetaConf, pod: &Pod, e: &Error) {
    for claim in of_pod(conf, pod) {
        let claimed: Vec<ClaimedDevice> = claim.devices.iter().map(|d| claimed_device(&claim, d)).collect();
        let Some(c) = claimed.first().map(crate::cluster::claim_ref) else { continue };
        let devices: Vec<Value> = claimed.iter().map(|d| failed(d, &e.msg)).collect();
        if let Err(why) = view.set_claim_status(&c, &devices) {
            tracing::warn!("status of claim {}/{} not written: {why}", c.namespace, c.name);
        }
    }
}

/// The device's status entry after a failed ADD: `Ready` false, why.
pub fn failed(c: &ClaimedDevice, why: &str) -> Value {
    let message: String = why.chars().take(1024).collect();
    entry(c, plexus_k8s::claims::ready_condition("False", "AttachFailed", &message), None, None)
}

fn entry(c: &ClaimedDevice, condition: Value, network: Option<Value>, data: Option<Value>) -> Value {
    let mut e = json!({"driver": plexus_dra::DRIVER, "pool": c.pool, "device": c.device, "conditions": [condition]});
    if let Some(s) = &c.share_id {
        e["shareID"] = s.clone().into();
    }
    if let Some(n) = network {
        e["networkData"] = n;
    }
    if let Some(d) = data {
        e["data"] = d;
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device() -> ClaimedDevice {
        ClaimedDevice {
            namespace: "team-a".into(),
            name: "nics".into(),
            uid: "u".into(),
            pool: "node-1".into(),
            device: "rail1".into(),
            share_id: Some("aaaaaaaa-0000-0000-0000-000000000001".into()),
            rdma_device: "mlx5_1".into(),
            pci_address: "0000:3b:00.1".into(),
        }
    }

    #[test]
    fn a_ready_entry_carries_the_interface_its_addresses_mac_and_the_rdma_facts() {
        let result: plexus_cni::CniResult = serde_json::from_value(json!({
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "rail1"}, {"name": "roce1", "mac": "02:00:00:00:00:07", "sandbox": "/var/run/netns/p"}],
            "ips": [{"interface": 1, "address": "198.18.7.5/24"}, {"interface": 1, "address": "2001:db8:7::5/64"}]
        }))
        .unwrap();
        let info = json!({"type": "pci", "pci": {"pci-address": "0000:3b:00.1", "roce-gids": [{"index": 3, "gid": "0000:0000:0000:0000:0000:ffff:c612:0705", "type": "RoCE v2"}]}});
        let e = ready(&device(), "roce1", &result, Some(&info));
        assert_eq!(
            (e["driver"].as_str(), e["pool"].as_str(), e["device"].as_str()),
            (Some("plexus.dev"), Some("node-1"), Some("rail1"))
        );
        assert_eq!(e["shareID"], "aaaaaaaa-0000-0000-0000-000000000001");
        assert_eq!(
            e["networkData"],
            json!({"interfaceName": "roce1", "ips": ["198.18.7.5/24", "2001:db8:7::5/64"], "hardwareAddress": "02:00:00:00:00:07"})
        );
        assert_eq!(e["data"]["rdmaDevice"], "mlx5_1");
        assert_eq!(e["data"]["pciAddress"], "0000:3b:00.1");
        assert_eq!(e["data"]["roceGids"][0]["index"], 3);
        assert_eq!(
            (e["conditions"][0]["type"].as_str(), e["conditions"][0]["status"].as_str()),
            (Some("Ready"), Some("True"))
        );
        let f = failed(&device(), "plexus-ipam: range 198.18.7.0/24 is full");
        assert_eq!(
            (f["conditions"][0]["status"].as_str(), f["conditions"][0]["reason"].as_str()),
            (Some("False"), Some("AttachFailed"))
        );
        assert!(f["conditions"][0]["message"].as_str().unwrap().contains("is full"));
        assert!(f.get("networkData").is_none());
    }
}
