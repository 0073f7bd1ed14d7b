//! The node's ResourceSlices: one pool named after the node, a device per offered port, one slice
//! per [`SLICE_MAX_DEVICES`] of them (a node with many VFs offers more than a slice holds).
//!
//! Attributes (at most 32 with the capacities, per device):
//! - `resource.kubernetes.io/pcieRoot` — the standard one: a claim's `matchAttribute` on it
//!   puts its NICs on its GPUs' PCIe root;
//! - `plexus.dev/…`: `ifName`, `pciAddress`, `rdmaDevice`, `rdma` (true), `mode` (`exclusive` or
//!   `shared`), `function` (`pf`, `vf`, `sf`), `numaNode`, `mtu`, `linkSpeedMbps`,
//!   `hardwareAddress`, `rdmaNetnsMode` (`shared` or `exclusive`, the node's RDMA subsystem);
//! - Multus's `k8s.cni.cncf.io/deviceID` (the PCI address) and, when the admin names one,
//!   `k8s.cni.cncf.io/resourceName`, so that Multus's own DRA path can use plexus's slices.
//!
//! A shared port may be allocated to many claims at once (`allowMultipleAllocations`, KEP-5075
//! consumable capacity, feature gate `DRAConsumableCapacity`): its capacity
//! `plexus.dev/macvlans` is how many pods' macvlans it takes, each claim consuming one.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, Device, DeviceAttribute, DeviceCapacity, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::DRIVER;
use crate::nics::{Mode, Nic};

/// The standard attribute of a device's PCIe root complex.
pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
/// Multus's attributes for a device it may attach (`deviceID`: the PCI address).
pub const MULTUS_DEVICE_ID: &str = "k8s.cni.cncf.io/deviceID";
pub const MULTUS_RESOURCE_NAME: &str = "k8s.cni.cncf.io/resourceName";
/// The capacity of a shared port: macvlans, one per claim.
pub const MACVLANS: &str = "plexus.dev/macvlans";

/// What the slice says beyond the ports: the admin's choices (plexus-daemon's flags).
#[derive(Clone, Debug, Default)]
pub struct Publishing {
    /// `k8s.cni.cncf.io/resourceName` on every device (the NADs' `resourceName`).
    pub resource_name: Option<String>,
    /// How many claims a shared port takes at once.
    pub macvlans_per_port: i64,
    /// The node's RDMA netns mode (`shared`, `exclusive`), when it could be read.
    pub rdma_netns_mode: Option<String>,
}

/// The Node the slice belongs to: it goes with the Node (owner reference).
#[derive(Clone, Debug)]
pub struct NodeRef {
    pub name: String,
    pub uid: String,
}

/// The most devices one ResourceSlice holds (the API's limit).
pub const SLICE_MAX_DEVICES: usize = 128;

/// The object name of slice `index` of the node's pool: `<node>-plexus-dev`, then `…-1`, `…-2`.
pub fn slice_name(node: &str, index: usize) -> String {
    match index {
        0 => format!("{node}-{}", DRIVER.replace('.', "-")),
        i => format!("{node}-{}-{i}", DRIVER.replace('.', "-")),
    }
}

/// The ResourceSlices of `node` offering `nics` at pool generation `generation`: at least one (a
/// node offering nothing says so), each of at most [`SLICE_MAX_DEVICES`] devices, in order.
pub fn slices(node: &NodeRef, nics: &[Nic], generation: i64, publishing: &Publishing) -> Vec<ResourceSlice> {
    let chunks: Vec<&[Nic]> = match nics.is_empty() {
        true => vec![&[]],
        false => nics.chunks(SLICE_MAX_DEVICES).collect(),
    };
    let count = chunks.len() as i64;
    chunks.iter().enumerate().map(|(i, chunk)| slice(node, i, count, chunk, generation, publishing)).collect()
}

/// Slice `index` of `count` of the node's pool, offering `nics`.
fn slice(
    node: &NodeRef,
    index: usize,
    count: i64,
    nics: &[Nic],
    generation: i64,
    publishing: &Publishing,
) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(&node.name, index)),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.name.clone(),
                uid: node.uid.clone(),
                controller: Some(true),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: DRIVER.into(),
            node_name: Some(node.name.clone()),
            pool: ResourcePool { name: node.name.clone(), generation, resource_slice_count: count },
            devices: Some(nics.iter().map(|n| device(n, publishing)).collect()),
            ..Default::default()
        },
    }
}

fn string(s: impl Into<String>) -> DeviceAttribute {
    DeviceAttribute { string: Some(s.into()), ..Default::default() }
}

fn int(i: i64) -> DeviceAttribute {
    DeviceAttribute { int: Some(i), ..Default::default() }
}

fn ours(name: &str) -> String {
    format!("{DRIVER}/{name}")
}

/// One port as a device. Strings are at most 64 characters (sysfs's names are far shorter).
fn device(nic: &Nic, publishing: &Publishing) -> Device {
    let mut a: BTreeMap<String, DeviceAttribute> = BTreeMap::new();
    if let Some(root) = &nic.pcie_root {
        a.insert(PCIE_ROOT.into(), string(root));
    }
    a.insert(ours("ifName"), string(&nic.ifname));
    a.insert(ours("pciAddress"), string(&nic.pci_address));
    a.insert(ours("rdmaDevice"), string(&nic.rdma_device));
    a.insert(ours("rdma"), DeviceAttribute { bool: Some(true), ..Default::default() });
    a.insert(ours("mode"), string(nic.mode.as_str()));
    a.insert(ours("function"), string(nic.function));
    a.insert(ours("mtu"), int(i64::from(nic.mtu)));
    if let Some(n) = nic.numa_node {
        a.insert(ours("numaNode"), int(n));
    }
    if let Some(s) = nic.speed_mbps {
        a.insert(ours("linkSpeedMbps"), int(s));
    }
    if let Some(mac) = &nic.mac {
        a.insert(ours("hardwareAddress"), string(mac));
    }
    if let Some(mode) = &publishing.rdma_netns_mode {
        a.insert(ours("rdmaNetnsMode"), string(mode));
    }
    a.insert(MULTUS_DEVICE_ID.into(), string(&nic.pci_address));
    if let Some(r) = &publishing.resource_name {
        a.insert(MULTUS_RESOURCE_NAME.into(), string(r));
    }
    let shared = nic.mode == Mode::Shared;
    let capacity = shared.then(|| {
        let one = Quantity("1".into());
        BTreeMap::from([(
            MACVLANS.to_string(),
            DeviceCapacity {
                value: Quantity(publishing.macvlans_per_port.max(1).to_string()),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(one.clone()),
                    valid_values: Some(vec![one]),
                    ..Default::default()
                }),
            },
        )])
    });
    Device {
        name: nic.device.clone(),
        attributes: Some(a),
        capacity,
        allow_multiple_allocations: shared.then_some(true),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nic(name: &str, mode: Mode) -> Nic {
        crate::nics::sample(name, mode)
    }

    #[test]
    fn a_nodes_slice_is_one_pool_of_its_ports_owned_by_the_node() {
        let node = NodeRef { name: "gpu-7".into(), uid: "u-1".into() };
        let publishing = Publishing {
            resource_name: Some("example.com/roce".into()),
            macvlans_per_port: 16,
            rdma_netns_mode: Some("exclusive".into()),
        };
        let s = slices(&node, &[nic("rail0", Mode::Exclusive), nic("rail1", Mode::Shared)], 3, &publishing);
        assert_eq!(s.len(), 1);
        let v = serde_json::to_value(&s[0]).unwrap();
        assert_eq!(v["metadata"]["name"], "gpu-7-plexus-dev");
        assert_eq!(v["metadata"]["ownerReferences"][0]["kind"], "Node");
        assert_eq!(v["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(v["spec"]["driver"], "plexus.dev");
        assert_eq!(v["spec"]["nodeName"], "gpu-7");
        assert_eq!(v["spec"]["pool"], serde_json::json!({"name": "gpu-7", "generation": 3, "resourceSliceCount": 1}));
        let rail0 = &v["spec"]["devices"][0];
        assert_eq!(rail0["name"], "rail0");
        assert_eq!(rail0["attributes"][PCIE_ROOT]["string"], "pci0000:3a");
        assert_eq!(rail0["attributes"]["plexus.dev/rdmaDevice"]["string"], "mlx5_0");
        assert_eq!(rail0["attributes"]["plexus.dev/numaNode"]["int"], 0);
        assert_eq!(rail0["attributes"]["plexus.dev/mode"]["string"], "exclusive");
        assert_eq!(rail0["attributes"]["plexus.dev/rdmaNetnsMode"]["string"], "exclusive");
        assert_eq!(rail0["attributes"][MULTUS_DEVICE_ID]["string"], "0000:3b:00.0");
        assert_eq!(rail0["attributes"][MULTUS_RESOURCE_NAME]["string"], "example.com/roce");
        assert!(rail0.get("allowMultipleAllocations").is_none() && rail0.get("capacity").is_none(), "{rail0}");
        let rail1 = &v["spec"]["devices"][1];
        assert_eq!(rail1["allowMultipleAllocations"], true);
        assert_eq!(rail1["capacity"][MACVLANS]["value"], "16");
        assert_eq!(rail1["capacity"][MACVLANS]["requestPolicy"]["default"], "1");
        for d in v["spec"]["devices"].as_array().unwrap() {
            let n = d["attributes"].as_object().unwrap().len()
                + d.get("capacity").map_or(0, |c| c.as_object().unwrap().len());
            assert!(n <= 32, "{n} attributes and capacities: the API allows 32");
        }
    }

    #[test]
    fn a_pool_of_more_ports_than_a_slice_holds_is_several_slices_of_one_generation() {
        let node = NodeRef { name: "gpu-7".into(), uid: "u-1".into() };
        let nics: Vec<Nic> = (0..300).map(|i| nic(&format!("vf{i:03}"), Mode::Exclusive)).collect();
        let s = slices(&node, &nics, 5, &Publishing::default());
        let names: Vec<_> = s.iter().map(|s| s.metadata.name.clone().unwrap()).collect();
        assert_eq!(names, ["gpu-7-plexus-dev", "gpu-7-plexus-dev-1", "gpu-7-plexus-dev-2"]);
        let sizes: Vec<_> = s.iter().map(|s| s.spec.devices.as_ref().unwrap().len()).collect();
        assert_eq!(sizes, [128, 128, 44]);
        for s in &s {
            assert_eq!(s.spec.pool, ResourcePool { name: "gpu-7".into(), generation: 5, resource_slice_count: 3 });
        }
        let last = s[2].spec.devices.as_ref().unwrap();
        assert_eq!(last.last().unwrap().name, "vf299", "in order");
        let none = slices(&node, &[], 0, &Publishing::default());
        assert_eq!(none.len(), 1, "a node offering nothing says so");
        assert_eq!(none[0].spec.devices.as_deref(), Some(&[][..]));
    }
}
