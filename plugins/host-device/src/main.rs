//! plexus-host-device: a whole NIC (PF, VF or sub-function) and its RDMA device belong to the pod
//! (exclusive RDMA mode), and come back to the host as they were.
//!
//! ADD: select the device (exactly one) → record its host state (state file + marker alias) →
//! start IPAM → ONE move into the pod, already named CNI_IFNAME, with its MTU, marker alias and
//! IPv4 settings → its RDMA device follows when the subsystem is exclusive → IPAM result →
//! addresses, up, routes (multi-rail) → device-info (with the RoCE GIDs of the pod's addresses) →
//! result. Any failure puts everything back.
//! DEL: IPAM DEL → the device (in the pod; or back in the node namespace already, e.g. returned by
//! the kernel when the pod namespace died) moved back with its RDMA device and its name, MTU,
//! MAC, alias, addresses and admin state restored. Succeeds when anything is already gone.

mod conf;
mod rdma;
mod state;

use std::process::ExitCode;

use conf::{HostDeviceConf, Selected};
use plexus_cni::delegate::{IpamStep, del_with_ipam, forward_to_ipam};
use plexus_cni::policy::Allowed;
use plexus_cni::{About, CniResult, Command, Error, Interface, Plugin, Request, code, files};
use plexus_net::check;
use plexus_net::configure;
use plexus_net::sysfs::{Sysfs, device_info_file, device_info_pci, remove_device_info, write_device_info};
use plexus_net::{Link, LinkChange, LinkSocket, Netns, roce};
use state::HostState;

struct HostDevice;

fn main() -> ExitCode {
    plexus_cni::plugin::run(About { name: "plexus-host-device", version: env!("CARGO_PKG_VERSION") }, &HostDevice)
}

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
        (Some(moved), _) => roce::gids_for_in(pod, moved, &addrs, wait).unwrap_or_else(|e| {
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
        let info_file = device_info_file(req)?;
        let wait = roce::configured_wait(conf.roce_gid_wait_ms)?;
        let sysfs = Sysfs::from_env();
        let pod = Netns::open(req.netns().expect("ADD has CNI_NETNS"))?;
        let node = Netns::current()?;
        let ifname = req.env.ifname.as_str();
        configure::runtime()?.block_on(async {
            let node_sock = LinkSocket::current()?;
            let pod_sock = LinkSocket::open(&pod)?;
            let link = match conf.select(req, &sysfs, &node_sock).await? {
                Selected::Dpdk { pci, driver } => {
                    allowed(req, &pci, Some(&pci), None)?;
                    // Used from user space: not moved; IPAM still runs, the result names the device.
                    tracing::info!(%pci, %driver, "DPDK device: not moved");
                    let mut result = IpamStep::start_early(&req.env, &req.config)?.result(&req.env, &req.config)?;
                    result.interfaces = vec![result_interface(ifname, None, &pod, Some(pci.clone()))];
                    if let Some(path) = &info_file {
                        let hw = plexus_net::sysfs::NetdevHardware { pci_address: Some(pci), ..Default::default() };
                        write_device_info(path, &device_info_pci(&hw).expect("pci address"))?;
                    }
                    return Ok(result);
                }
                Selected::Netdev(link) => link,
            };
            let hw = sysfs.netdev_hardware(&link.name);
            allowed(req, &link.name, hw.pci_address.as_deref(), Some(&link.name))?;
            let data_dir = conf.data_dir(req)?;
            let tag = state::attachment_tag(&req.env.container_id, ifname);
            let mut host = HostState::capture(&node_sock, &link, hw.pci_address.clone(), &tag).await?;
            host.netns = Some(pod.path().to_path_buf());
            let state_path = state::path(&data_dir, &req.env.container_id, ifname);
            state::save(&state_path, &host)?;
            let mut ipam = IpamStep::start_early(&req.env, &req.config)?;
            let l2_only = matches!(ipam, IpamStep::None);
            let marker = host.marker();
            // One move: the kernel renames it on the way in (a name taken in the pod fails the
            // move and leaves the device where it is), then MTU, marker and IPv4 settings.
            let move_in = LinkChange {
                netns: Some(&pod),
                name: Some(ifname),
                mtu: conf.iface.mtu(),
                alias: Some(&marker),
                ipv4_conf: Some(conf.iface.ipv4_conf()),
                up: l2_only.then_some(true),
                ..Default::default()
            };
            if let Err(e) = node_sock.set_link(link.index, &move_in).await {
                ipam.roll_back(&req.env, &req.config);
                let _ = files::remove_if_present(&state_path);
                // The move may have happened before a later attribute failed: put it back.
                if let Ok(Some(moved)) = pod_sock.link(ifname).await {
                    let _ = state::return_to_host(Some(&pod_sock), &node_sock, &node, &moved, Some(&host)).await;
                }
                return Err(if e.is_exists() {
                    configure::ifname_taken(ifname, &pod)
                } else {
                    Error::from(e).context(format!("move {} into the pod", link.name))
                });
            }
            let moved = pod_sock
                .link(ifname)
                .await?
                .ok_or_else(|| Error::kernel(format!("{} is not in the pod after the move", link.name)))?;
            // The state rewritten with what the attachment added, and the device-info file, are
            // part of the ADD: a failure of either (a full disk) rolls everything back too.
            // Its RDMA device follows, then IPAM's result is applied.
            let attached = async {
                if let Some(dev) = hw.rdma_device.as_deref() {
                    host.rdma_moved = rdma::move_in(conf.rdma, dev, &pod)?;
                }
                configure::apply_ipam(req, &mut ipam, &pod, &pod_sock, &conf.iface, moved.index, l2_only).await
            }
            .await
            .and_then(|result| state::save(&state_path, &host).map(|()| result))
            .and_then(|result| match (&info_file, device_info_pci(&hw)) {
                (Some(path), Some(doc)) => {
                    let gids = roce_gids(&sysfs, &pod, &host, hw.rdma_device.as_deref(), &result, wait);
                    write_device_info(path, &roce::with_gids(doc, &gids)).map(|()| result)
                }
                _ => Ok(result),
            });
            match attached {
                Ok(mut result) => {
                    result.interfaces = vec![result_interface(ifname, Some(&moved), &pod, hw.pci_address.clone())];
                    Ok(result)
                }
                Err(e) => {
                    ipam.roll_back(&req.env, &req.config);
                    if let Some(r) = &host.rdma_moved
                        && let Err(back) = rdma::move_back(&pod, &node, r)
                    {
                        tracing::error!("rollback: RDMA device {r}: {back}");
                    }
                    if let Err(back) =
                        state::return_to_host(Some(&pod_sock), &node_sock, &node, &moved, Some(&host)).await
                    {
                        tracing::error!("rollback: {back}");
                    }
                    let _ = files::remove_if_present(&state_path);
                    if let Some(path) = &info_file {
                        let _ = files::remove_if_present(path);
                    }
                    Err(e)
                }
            }
        })
    }

    fn del(&self, req: &Request) -> Result<(), Error> {
        let conf = HostDeviceConf::load(req)?;
        // A state directory the policy refuses never held anything (ADD refused it too): the
        // device is found by its marker alone, and DEL still succeeds.
        let data_dir = conf.data_dir(req).inspect_err(|e| tracing::warn!("state directory refused: {e}")).ok();
        del_with_ipam(req, || {
            remove_device_info(req)?;
            let state_path = data_dir.as_ref().map(|d| state::path(d, &req.env.container_id, &req.env.ifname));
            let host = state_path.as_deref().and_then(state::load);
            restore(req.netns(), &req.env.container_id, &req.env.ifname, host.as_ref())?;
            state_path.map_or(Ok(()), |p| files::remove_if_present(&p))
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
        let sysfs = Sysfs::from_env();
        configure::runtime()?.block_on(async {
            let node = LinkSocket::current()?;
            conf.select(req, &sysfs, &node).await.map(|_| ()).map_err(|e| Error::new(code::PLUGIN_NOT_AVAILABLE, e.msg))
        })?;
        forward_to_ipam(req, Command::Status)
    }

    fn gc(&self, req: &Request) -> Result<(), Error> {
        let conf = HostDeviceConf::load(req)?;
        let valid = req.valid_attachments()?;
        let mut errors = Vec::new();
        let data_dir = conf.data_dir(req)?;
        for entry in std::fs::read_dir(data_dir.path()).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some((cid, ifname)) = name.split_once('=') else { continue };
            if valid.iter().any(|v| v.container_id == cid && v.ifname == ifname) {
                continue;
            }
            let host = state::load(&entry.path());
            let netns = host.as_ref().and_then(|h| h.netns.clone());
            match restore(netns.as_deref(), cid, ifname, host.as_ref()) {
                Ok(()) => {
                    let _ = files::remove_if_present(&entry.path());
                }
                Err(e) => errors.push(format!("{cid}/{ifname}: {e}")),
            }
        }
        forward_to_ipam(req, Command::Gc)?;
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Error::new(code::KERNEL, "GC could not restore every device").with_details(errors.join("; ")))
        }
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
        if let Some(pod) = &pod
            && let Ok(pod_sock) = LinkSocket::open(pod)
            && let Some(link) = state::find(&pod_sock, ifname, &mark).await?
        {
            if let Some(r) = host.and_then(|h| h.rdma_moved.as_deref())
                && let Err(e) = rdma::move_back(pod, &node, r)
            {
                tracing::error!("RDMA device {r} not moved back: {e}");
            }
            return state::return_to_host(Some(&pod_sock), &node_sock, &node, &link, host).await;
        }
        if let Some(link) = state::find(&node_sock, ifname, &mark).await? {
            return state::return_to_host(None, &node_sock, &node, &link, host).await;
        }
        tracing::debug!(ifname, "device already gone or back: nothing to restore");
        Ok(())
    })
}
