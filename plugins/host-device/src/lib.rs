//! plexus-host-device: a whole NIC (PF, VF or sub-function) and its RDMA device belong to the pod
//! (exclusive RDMA mode), and come back to the host as they were.
//!
//! ADD: select the device (exactly one) → record its host state (state file) → start IPAM → mark
//! it (an alternative name) → ONE move into the pod, already named CNI_IFNAME, with its MTU, alias and
//! IPv4 settings → its RDMA device follows when the subsystem is exclusive → IPAM result →
//! addresses, up, routes (multi-rail) → device-info (with the RoCE GIDs of the pod's addresses) →
//! result. Each completed step goes on an undo stack ([`Undo`]): a failure undoes them last first.
//! DEL: IPAM DEL → the device (in the pod; or back in the node namespace already, e.g. returned by
//! the kernel when the pod namespace died) moved back with its RDMA device and its name, MTU,
//! MAC, alias, addresses and admin state restored. Succeeds when anything is already gone.

mod conf;
mod rdma;
mod state;
#[cfg(test)]
mod tests;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use conf::{HostDeviceConf, Selected};
use plexus_cni::{CniResult, Command, Error, ErrorList, Interface, code};
use plexus_net::check;
use plexus_net::configure;
use plexus_net::sysfs::{Sysfs, device_info_pci, write_device_info};
use plexus_net::{Kernel, Link, LinkChange, LinkSocket, Netns, roce};
use plexus_node::datadir::DataDir;
use plexus_node::files;
use plexus_node::policy::Allowed;
use plexus_plugin::ipam::{IpamStep, del_with_ipam, forward_to_ipam};
use plexus_plugin::undo::Undo;
use plexus_plugin::{About, Plugin, Request};
use state::HostState;

/// The plugin (its binary's `main`, and plexus-daemon's in-process delegate).
pub struct HostDevice;

/// The plugin's name, version and build.
pub const ABOUT: About =
    About { name: "plexus-host-device", version: env!("CARGO_PKG_VERSION"), build: Some(plexus_build_id::BUILD) };

fn result_interface(ifname: &str, link: Option<&Link>, pod: &Netns, pci: Option<String>) -> Interface {
    Interface {
        name: ifname.to_string(),
        mac: link.and_then(|l| l.mac_string()),
        mtu: link.map(|l| l.mtu),
        sandbox: Some(pod.path().display().to_string()),
        pci_id: pci,
        ..Default::default()
    }
}

/// The RoCE GIDs of the pod's addresses: on the RDMA device moved into the pod (exclusive mode:
/// read from the pod's namespace), else on the device left on the node (shared mode). Never an
/// error: a table that cannot be read gives none (logged).
fn roce_gids(
    sysfs: &Sysfs,
    pod: &Netns,
    host: &HostState,
    rdma_device: Option<&str>,
    result: &CniResult,
    wait: std::time::Duration,
) -> Vec<roce::GidEntry> {
    let addrs = result.addresses();
    match (&host.rdma_moved, rdma_device) {
        (Some(moved), _) => roce::gids_for_in(pod, sysfs, moved, &addrs, wait).unwrap_or_else(|e| {
            tracing::warn!(device = %moved, "GID table not read: {e}");
            Vec::new()
        }),
        (None, Some(dev)) => roce::gids_for(sysfs, dev, &addrs, wait),
        (None, None) => Vec::new(),
    }
}

impl Plugin for HostDevice {
    fn known_args(&self) -> &'static [&'static str] {
        &["IP", "GATEWAY"]
    }

    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let conf = HostDeviceConf::load(req)?;
        let info_file = req.device_info_file()?;
        let wait = roce::configured_wait(conf.roce_gid_wait_ms)?;
        let sysfs = Sysfs::new(req.sysfs_root());
        let pod = Netns::open(req.netns().expect("ADD has CNI_NETNS"))?;
        let node = Netns::current()?;
        configure::runtime()?.block_on(async {
            let node_sock = LinkSocket::current()?;
            let pod_sock = LinkSocket::open(&pod)?;
            let add = Add {
                req,
                conf: &conf,
                sysfs: &sysfs,
                pod: &pod,
                node: &node,
                node_sock: &node_sock,
                pod_sock: &pod_sock,
                info_file: info_file.as_deref(),
                gid_wait: wait,
            };
            match conf.select(req, &sysfs, &node_sock).await? {
                Selected::Dpdk { pci, driver } => add.dpdk(pci, driver),
                Selected::Netdev(link) => add.run(&link).await,
            }
        })
    }

    fn del(&self, req: &Request) -> Result<(), Error> {
        let conf = HostDeviceConf::load(req)?;
        // A state directory the policy refuses never held anything (ADD refused it too): the
        // device is found by its marker alone, and DEL still succeeds.
        let data_dir =
            conf.data_dir(req, false).inspect_err(|e| tracing::warn!("state directory refused: {e}")).ok().flatten();
        let state_path = data_dir.as_ref().map(|d| state::path(d.dir(), &req.env.container_id, &req.env.ifname));
        // A later plexus's state: refused before anything is undone, the device left as it is.
        let host = state_path.as_deref().map(state::load).transpose()?.flatten();
        del_with_ipam(req, || {
            req.remove_device_info()?;
            restore(req.netns(), &req.env.container_id, &req.env.ifname, host.as_ref())?;
            state_path.map_or(Ok(()), |p| files::remove_if_present(&p))?;
            // A tenant's state directory goes with its last state file.
            data_dir.as_ref().map(DataDir::retire_if_empty);
            Ok(())
        })
    }

    fn check(&self, req: &Request) -> Result<(), Error> {
        let _conf = HostDeviceConf::load(req)?;
        let prev = req.config.prev_result_for_check()?;
        forward_to_ipam(req, Command::Check)?;
        let ifname = req.env.ifname.as_str();
        let pod = Netns::open(req.netns().expect("CHECK has CNI_NETNS"))?;
        let idx = check::prev_interface(&prev, ifname, &pod)?;
        configure::runtime()?.block_on(async {
            let sock = LinkSocket::open(&pod)?;
            let link = check::pod_link(&sock, ifname, &pod).await?;
            check::mac_and_addresses(&sock, &link, ifname, &prev, idx).await
        })
    }

    fn status(&self, req: &Request) -> Result<(), Error> {
        let conf = HostDeviceConf::load(req)?;
        let sysfs = Sysfs::new(req.sysfs_root());
        configure::runtime()?.block_on(async {
            let node = LinkSocket::current()?;
            conf.select(req, &sysfs, &node).await.map(|_| ()).map_err(|e| Error::new(code::PLUGIN_NOT_AVAILABLE, e.msg))
        })?;
        forward_to_ipam(req, Command::Status)
    }

    fn gc(&self, req: &Request) -> Result<(), Error> {
        let conf = HostDeviceConf::load(req)?;
        let valid = req.valid_attachments()?;
        let mut errors = ErrorList::default();
        let data_dir = conf.data_dir(req, false)?;
        let entries = data_dir.as_ref().map(|d| std::fs::read_dir(d.dir().path()));
        for entry in entries.into_iter().flatten().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some((cid, ifname)) = name.split_once('=') else { continue };
            if valid.iter().any(|v| v.container_id == cid && v.ifname == ifname) {
                continue;
            }
            let host = match state::load(&entry.path()) {
                Ok(host) => host,
                Err(e) => {
                    errors.push(format!("{cid}/{ifname}"), e);
                    continue;
                }
            };
            let netns = host.as_ref().and_then(|h| h.netns.clone());
            match restore(netns.as_deref(), cid, ifname, host.as_ref()) {
                Ok(()) => {
                    let _ = files::remove_if_present(&entry.path());
                }
                Err(e) => errors.push(format!("{cid}/{ifname}"), e),
            }
        }
        data_dir.as_ref().map(DataDir::retire_if_empty);
        forward_to_ipam(req, Command::Gc)?;
        errors.into_result(code::KERNEL, "GC could not restore every device")
    }
}

/// One ADD once the device is chosen: the pod, the node, and what the config asks.
struct Add<'a, K> {
    req: &'a Request,
    conf: &'a HostDeviceConf,
    sysfs: &'a Sysfs,
    pod: &'a Netns,
    node: &'a Netns,
    node_sock: &'a K,
    pod_sock: &'a K,
    info_file: Option<&'a Path>,
    gid_wait: Duration,
}

/// A completed step of ADD, and what undoing it takes.
#[derive(Debug)]
enum Step {
    /// The state file was written: remove it.
    StateFile(PathBuf),
    /// IPAM ADD started: release the address (IPAM DEL).
    Ipam,
    /// The move into the pod was sent: the device goes back to the node, as it was — found by
    /// this attachment's marker, or (moved, then its rename or alias failed) by its host name and
    /// MAC ([`state::find_moved`]); a link of the pod's own is never taken.
    Moved { device: String },
    /// Its RDMA device followed: move it back.
    Rdma(String),
    /// The device-info file was written: remove it.
    DeviceInfo(PathBuf),
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::StateFile(p) => write!(f, "remove state file {}", p.display()),
            Step::Ipam => write!(f, "release the address (IPAM DEL)"),
            Step::Moved { device } => write!(f, "return {device} to the node"),
            Step::Rdma(dev) => write!(f, "move RDMA device {dev} back"),
            Step::DeviceInfo(p) => write!(f, "remove device-info file {}", p.display()),
        }
    }
}

impl<K: Kernel> Add<'_, K> {
    /// A PCI function bound to a DPDK driver is used from user space: not moved; IPAM still runs,
    /// the result names the device.
    fn dpdk(&self, pci: String, driver: String) -> Result<CniResult, Error> {
        allowed(self.req, &pci, Some(&pci), None)?;
        tracing::info!(%pci, %driver, "DPDK device: not moved");
        let ifname = self.req.env.ifname.as_str();
        let mut result = IpamStep::start_early(self.req)?.result(self.req)?;
        result.interfaces = vec![result_interface(ifname, None, self.pod, Some(pci.clone()))];
        if let Some(path) = self.info_file {
            let hw = plexus_net::sysfs::NetdevHardware { pci_address: Some(pci), ..Default::default() };
            write_device_info(path, &device_info_pci(&hw).expect("pci address"))?;
        }
        Ok(result)
    }

    /// The whole ADD of a netdev; on failure every completed step is undone, last first.
    async fn run(&self, link: &Link) -> Result<CniResult, Error> {
        let hw = self.sysfs.netdev_hardware(&link.name);
        allowed(self.req, &link.name, hw.pci_address.as_deref(), Some(&link.name))?;
        let data_dir = self.conf.data_dir(self.req, true)?.expect("created");
        let ifname = self.req.env.ifname.as_str();
        let tag = state::attachment_tag(&self.req.env.container_id, ifname);
        let mut host = HostState::capture(self.node_sock, link, hw.pci_address.clone(), &tag).await?;
        host.netns = Some(self.pod.path().to_path_buf());
        let state_path = state::path(data_dir.dir(), &self.req.env.container_id, ifname);
        // A later plexus's state of this attachment is neither written over nor removed.
        state::load(&state_path)?;
        let mut undo = Undo::new();
        let mut ipam = IpamStep::None;
        match self.steps(link, &hw, &state_path, &mut host, &mut ipam, &mut undo).await {
            Ok(result) => {
                undo.commit();
                Ok(result)
            }
            Err(e) => Err(undo
                .unwind_async(e, async |step| match step {
                    Step::StateFile(path) | Step::DeviceInfo(path) => files::remove_if_present(&path),
                    Step::Ipam => std::mem::replace(&mut ipam, IpamStep::None).roll_back(self.req),
                    Step::Moved { .. } => match state::find_moved(self.pod_sock, ifname, &host).await? {
                        Some(moved) => {
                            state::return_to_host(Some(self.pod_sock), self.node_sock, self.node, &moved, Some(&host))
                                .await
                        }
                        // Not moved: still on the node, its marker taken off.
                        None => state::unmark(self.node_sock, &host).await,
                    },
                    Step::Rdma(dev) => rdma::move_back(self.pod, self.node, &dev),
                })
                .await)
            .inspect_err(|_| {
                // A failed ADD leaves no state directory it made.
                data_dir.retire_if_empty();
            }),
        }
    }

    async fn steps(
        &self,
        link: &Link,
        hw: &plexus_net::sysfs::NetdevHardware,
        state_path: &Path,
        host: &mut HostState,
        ipam: &mut IpamStep,
        undo: &mut Undo<Step>,
    ) -> Result<CniResult, Error> {
        let ifname = self.req.env.ifname.as_str();
        // A name taken in the pod fails first, before anything moves or IPAM runs: the kernel would move the
        // device first and fail its rename in the pod, leaving it there under its host name.
        if self.pod_sock.link(ifname).await?.is_some() {
            return Err(configure::ifname_taken(ifname, self.pod));
        }
        state::save(state_path, host)?;
        undo.push(Step::StateFile(state_path.to_path_buf()));
        *ipam = IpamStep::start_early(self.req)?;
        if !matches!(ipam, IpamStep::None) {
            undo.push(Step::Ipam);
        }
        let l2_only = matches!(ipam, IpamStep::None);
        // The marker first, on the node (it moves with the device): from here on the device is
        // found by it, wherever a failure leaves it.
        undo.push(Step::Moved { device: link.name.clone() });
        let marker = host.marker();
        if !link.alt_names.contains(&marker) {
            self.node_sock
                .set_alt_name(link.index, &marker, true)
                .await
                .map_err(|e| Error::from(e).context(format!("mark {}", link.name)))?;
        }
        // One move: the kernel renames it on the way in, then MTU, alias (its host name, as the
        // reference host-device sets it) and IPv4 settings. The move may happen before a later
        // attribute fails: undone either way.
        let move_in = LinkChange {
            netns: Some(self.pod),
            name: Some(ifname),
            mtu: self.conf.iface.mtu(),
            alias: Some(&host.name),
            ipv4_conf: Some(self.conf.iface.ipv4_conf()),
            up: l2_only.then_some(true),
            ..Default::default()
        };
        self.node_sock
            .set_link(link.index, &move_in)
            .await
            .map_err(|e| configure::naming_error(e, ifname, self.pod, || format!("move {} into the pod", link.name)))?;
        let moved = self
            .pod_sock
            .link(ifname)
            .await?
            .ok_or_else(|| Error::kernel(format!("{} is not in the pod after the move", link.name)))?;
        // Its RDMA device follows, then IPAM's result is applied.
        if let Some(dev) = hw.rdma_device.as_deref() {
            host.rdma_moved = rdma::move_in(self.conf.rdma, dev, self.pod)?;
            if let Some(r) = &host.rdma_moved {
                undo.push(Step::Rdma(r.clone()));
            }
        }
        let mut result = configure::apply_ipam(
            self.pod_sock,
            &self.conf.iface,
            &self.req.env.ifname,
            moved.index,
            l2_only,
            ipam.result(self.req)?,
            self.req.config.dns.as_ref(),
        )
        .await?;
        // The state rewritten with what the attachment added, and the device-info file, are part
        // of the ADD: a failure of either (a full disk) undoes everything too.
        state::save(state_path, host)?;
        if let (Some(path), Some(doc)) = (self.info_file, device_info_pci(hw)) {
            let gids = roce_gids(self.sysfs, self.pod, host, hw.rdma_device.as_deref(), &result, self.gid_wait);
            write_device_info(path, &roce::with_gids(doc, &gids))?;
            undo.push(Step::DeviceInfo(path.to_path_buf()));
        }
        result.interfaces = vec![result_interface(ifname, Some(&moved), self.pod, hw.pci_address.clone())];
        Ok(result)
    }
}

/// The node policy's allow-lists for a device plexus-host-device hands to a pod: its netdev name
/// (when it has one) and its PCI address.
fn allowed(req: &Request, shown: &str, pci: Option<&str>, netdev: Option<&str>) -> Result<(), Error> {
    let ns = req.pod_namespace();
    if let Some(name) = netdev {
        req.policy.check_allowed(Allowed::Device, "device", name, ns)?;
    }
    let key = format!("PCI address of {shown}");
    req.policy.check_allowed(Allowed::PciAddress, &key, pci.unwrap_or("(none)"), ns)
}

/// Put a device back: from the pod namespace when it is reachable and the device is there, else
/// wherever it is in the node namespace (returned by the kernel, or moved back by hand). Only a
/// device carrying this attachment's marker is touched.
fn restore(
    netns: Option<&std::path::Path>,
    container_id: &str,
    ifname: &str,
    host: Option<&HostState>,
) -> Result<(), Error> {
    let node = Netns::current()?;
    let mark = state::Mark::of(container_id, ifname, host);
    let pod = netns.and_then(|p| Netns::open(p).ok());
    configure::runtime()?.block_on(async {
        let node_sock = LinkSocket::current()?;
        let pod_sock = pod.as_ref().and_then(|p| LinkSocket::open(p).ok());
        let in_pod = pod.as_ref().zip(pod_sock.as_ref());
        restore_on(&node_sock, &node, in_pod, ifname, &mark, host).await
    })
}

/// [`restore`] on open sockets: the node's, and the pod's when its namespace is still there.
async fn restore_on<K: Kernel>(
    node_sock: &K,
    node: &Netns,
    pod: Option<(&Netns, &K)>,
    ifname: &str,
    mark: &state::Mark,
    host: Option<&HostState>,
) -> Result<(), Error> {
    if let Some((pod, pod_sock)) = pod
        && let Some(link) = state::find(pod_sock, ifname, mark).await?
    {
        if let Some(r) = host.and_then(|h| h.rdma_moved.as_deref())
            && let Err(e) = rdma::move_back(pod, node, r)
        {
            tracing::error!("RDMA device {r} not moved back: {e}");
        }
        return state::return_to_host(Some(pod_sock), node_sock, node, &link, host).await;
    }
    if let Some(link) = state::find(node_sock, ifname, mark).await? {
        return state::return_to_host(None, node_sock, node, &link, host).await;
    }
    tracing::debug!(ifname, "device already gone or back: nothing to restore");
    Ok(())
}
