//! What an ADD records in the cluster beside its result: network-status on the pod for the
//! attachments of its NADs (Multus's), and for a DRA claim's device its entry in the claim's
//! status (KEP-4817: `Ready`, the interface, its addresses and MAC, the RDMA device, PCI address
//! and RoCE GIDs) — or, when the ADD failed, `Ready` false and why.

use std::collections::BTreeMap;

use plexus_cni::{CniResult, Error};
use plexus_k8s::claims::ClaimRef;
use plexus_k8s::status;
use serde_json::{Value, json};

use crate::attach::Record;
use crate::attachment::{Attachment, ClaimedDevice};
use crate::cluster::{Cluster, ClusterView};
use crate::conf::MetaConf;
use crate::plan;
use crate::pod::Pod;

/// What an ADD of `pod` records in `cluster` ([`write_status`]).
pub(crate) struct Recorded<'a> {
    pub cluster: &'a Cluster,
    pub pod: &'a Pod,
}

impl Record for Recorded<'_> {
    fn record(&self, attachments: &[Attachment], results: &[CniResult]) -> Result<(), Error> {
        write_status(self.cluster, self.pod, attachments, results)
    }
}

/// network-status for the pod (API only): one element per attachment of its NADs, device-info
/// included; a DRA claim's device goes to the claim's status instead.
fn write_status(cluster: &Cluster, pod: &Pod, attachments: &[Attachment], results: &[CniResult]) -> Result<(), Error> {
    let Some(api) = &cluster.view else { return Ok(()) };
    if pod.who.name.is_empty() {
        return Ok(());
    }
    let mut all = Vec::new();
    let mut claims: BTreeMap<ClaimRef, Vec<Value>> = BTreeMap::new();
    for (a, r) in attachments.iter().zip(results) {
        let info = a
            .device_info_file
            .as_ref()
            .and_then(|f| std::fs::read(f).ok())
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
        match &a.claim {
            Some(c) => claims.entry(claim_ref(c)).or_default().push(ready(c, &a.ifname, r, info.as_ref())),
            None => all.extend(status::statuses(&a.network, &a.ifname, r, a.cluster_network, info.as_ref())),
        }
    }
    api.set_network_status(&pod.who, &all)?;
    for (claim, devices) in claims {
        api.set_claim_status(&claim, &devices)?;
    }
    Ok(())
}

/// The claim a device's status entry goes to.
fn claim_ref(c: &ClaimedDevice) -> ClaimRef {
    ClaimRef { namespace: c.namespace.clone(), name: c.name.clone(), uid: c.uid.clone() }
}

/// The device's KEP-4817 status entry after an ADD: `Ready`, the interface, its addresses and MAC
/// in `networkData`, and the RDMA device, PCI address and RoCE GIDs (from its device-info) in
/// `data`.
fn ready(c: &ClaimedDevice, ifname: &str, result: &plexus_cni::CniResult, device_info: Option<&Value>) -> Value {
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
pub(crate) fn claims_failed(view: &dyn ClusterView, conf: &MetaConf, pod: &Pod, e: &Error) {
    for claim in plan::claims_of(conf, pod) {
        let claimed: Vec<ClaimedDevice> = claim.devices.iter().map(|d| plan::claimed_device(&claim, d)).collect();
        let Some(c) = claimed.first().map(claim_ref) else { continue };
        let devices: Vec<Value> = claimed.iter().map(|d| failed(d, &e.msg)).collect();
        if let Err(why) = view.set_claim_status(&c, &devices) {
            tracing::warn!("status of claim {}/{} not written: {why}", c.namespace, c.name);
        }
    }
}

/// The device's status entry after a failed ADD: `Ready` false, why.
fn failed(c: &ClaimedDevice, why: &str) -> Value {
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
