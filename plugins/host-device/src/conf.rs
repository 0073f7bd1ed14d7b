//! The plexus-host-device configuration (the reference host-device's keys, the `deviceID` and
//! `pciBusID` Multus injects, and plexus's `mtu`, `multiRail`, `routeTable`, `dad`, `dataDir`,
//! `rdma`) and device selection.

use std::path::PathBuf;

use plexus_cni::Error;
use plexus_net::link::{format_mac, parse_mac};
use plexus_net::sysfs::Sysfs;
use plexus_net::{Kernel, Link};
use plexus_node::datadir::DataDir;
use plexus_plugin::Request;
use serde::Deserialize;

/// Drivers that mean the device is used from user space (DPDK): it is not moved.
pub const DPDK_DRIVERS: [&str; 3] = ["vfio-pci", "uio_pci_generic", "igb_uio"];

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostDeviceConf {
    #[serde(default)]
    pub device: Option<String>,
    #[serde(default)]
    pub hwaddr: Option<String>,
    #[serde(default)]
    pub kernelpath: Option<String>,
    #[serde(default, rename = "pciBusID")]
    pub pci_bus_id: Option<String>,
    /// Injected by Multus for `resourceName` NADs.
    #[serde(default, rename = "deviceID")]
    pub device_id: Option<String>,
    /// `mtu`, `multiRail`, `routeTable`, `dad`: read on their own from the same config, so a
    /// type error still names its key (serde's `flatten` loses the path).
    #[serde(skip)]
    pub iface: plexus_net::configure::IfaceKeys,
    /// Where state files go: admin-chosen, beneath the node policy's `dataRoots`.
    #[serde(default = "default_data_dir")]
    pub data_dir: PathBuf,
    /// `auto` (default: move the RDMA device when the subsystem is exclusive), `exclusive`
    /// (require it), `off`.
    #[serde(default)]
    pub rdma: RdmaPolicy,
    /// How long ADD waits for the RoCE v2 GIDs of the pod's addresses (tenant-settable, bounded).
    #[serde(default)]
    pub roce_gid_wait_ms: Option<u64>,
}

fn default_data_dir() -> PathBuf {
    plexus_node::paths::HOST_DEVICE_DATA_DIR.into()
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RdmaPolicy {
    #[default]
    Auto,
    Exclusive,
    Off,
}

/// What the selectors chose.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selected {
    /// A netdev (in the node namespace).
    Netdev(Link),
    /// A PCI function bound to a DPDK driver: nothing to move.
    Dpdk { pci: String, driver: String },
}

impl HostDeviceConf {
    pub fn load(req: &Request) -> Result<HostDeviceConf, Error> {
        let mut conf: HostDeviceConf = req.config_as()?;
        conf.iface = req.config_as()?;
        if let Some(name) = &conf.device {
            plexus_cni::env::validate_ifname(name)
                .map_err(|e| Error::invalid_config(format!("invalid \"device\" {name:?}: {}", e.msg)))?;
        }
        Ok(conf)
    }

    /// The state directory by the node policy's rule for data directories (the default, or a
    /// tenant's marked directory in a data root), opened without following symlinks; created
    /// when `create`, else `None` when it is not there.
    pub fn data_dir(&self, req: &Request, create: bool) -> Result<Option<DataDir>, Error> {
        let kind = plexus_node::datadir::Kind::HostDeviceState;
        req.policy.data_dir("dataDir", &self.data_dir, kind, req.pod_namespace(), create, req.env.deadline)
    }

    /// The device ID from the runtime (capability `deviceID`) or Multus's top-level key.
    fn device_id<'a>(&'a self, req: &'a Request) -> Option<&'a str> {
        req.config.runtime("deviceID").and_then(|v| v.as_str()).or(self.device_id.as_deref()).filter(|s| !s.is_empty())
    }

    /// Resolve the selectors (reference order: device, hwaddr, kernelpath, pciBusID, deviceID);
    /// every one given must name the same single device.
    pub async fn select(&self, req: &Request, sysfs: &Sysfs, node: &impl Kernel) -> Result<Selected, Error> {
        let mut picks: Vec<(String, Vec<String>)> = Vec::new();
        if let Some(d) = &self.device {
            picks.push((format!("device={d}"), vec![d.clone()]));
        }
        if let Some(mac) = &self.hwaddr {
            let want = parse_mac(mac).ok_or_else(|| Error::invalid_config(format!("invalid \"hwaddr\" {mac:?}")))?;
            let names = node.links().await?.into_iter().filter(|l| l.mac == Some(want)).map(|l| l.name).collect();
            picks.push((format!("hwaddr={}", format_mac(&want)), names));
        }
        if let Some(p) = &self.kernelpath {
            picks.push((format!("kernelpath={p}"), sysfs.netdevs_of_kernelpath(p)?));
        }
        let mut pci = self.pci_bus_id.clone();
        let mut aux = None;
        if let Some(id) = self.device_id(req) {
            if plexus_node::hw::is_pci_address(id) {
                pci = Some(id.to_string());
            } else if sysfs.aux_device(id).is_some() {
                aux = Some(id.to_string());
            } else {
                return Err(Error::invalid_config(format!(
                    "deviceID {id:?} is neither a PCI address nor an auxiliary device in {}",
                    sysfs.root().join("bus/auxiliary/devices").display()
                )));
            }
        }
        if let Some(p) = &pci {
            if sysfs.pci_device(p).is_none() {
                return Err(Error::invalid_config(format!("pciBusID {p:?}: no such PCI device")));
            }
            let driver = sysfs.pci_device(p).map(|d| sysfs.device_hardware(&d).driver).unwrap_or_default();
            if let Some(driver) = driver.filter(|d| DPDK_DRIVERS.contains(&d.as_str())) {
                return Ok(Selected::Dpdk { pci: p.clone(), driver });
            }
            picks.push((format!("pciBusID={p}"), sysfs.netdevs_of_pci(p)));
        }
        if let Some(a) = &aux {
            picks.push((format!("deviceID={a}"), sysfs.netdevs_of_aux(a)));
        }
        let Some((first_sel, _)) = picks.first() else {
            return Err(Error::invalid_config(
                "no device selected: set one of \"device\", \"hwaddr\", \"kernelpath\", \"pciBusID\" or runtimeConfig.deviceID",
            ));
        };
        let mut chosen: Option<(String, String)> = None;
        for (sel, names) in &picks {
            let name = match names.as_slice() {
                [one] => one.clone(),
                [] => return Err(Error::invalid_config(format!("{sel} matches no network device"))),
                many => return Err(Error::invalid_config(format!("{sel} matches several network devices: {many:?}"))),
            };
            match &chosen {
                Some((s0, n0)) if *n0 != name => {
                    return Err(Error::invalid_config(format!("selectors disagree: {s0} is {n0}, {sel} is {name}")));
                }
                Some(_) => {}
                None => chosen = Some((sel.clone(), name)),
            }
        }
        let (_, name) = chosen.expect("at least one selector");
        let link = node.link(&name).await?.ok_or_else(|| {
            Error::invalid_config(format!(
                "device {name:?} ({first_sel}) is not in the node namespace: missing, or attached to another pod"
            ))
        })?;
        Ok(Selected::Netdev(link))
    }
}
